package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/testenv/iamcheck"
)

// TestMain records every AWS request changesctl makes in this package's
// tests and, once they pass, checks each request of an operator command
// against the operator policy of docs/deploy.md: a request it would deny
// fails the run. The tests' stacks are named by testenv.UniqueName, so the
// policy's stack prefix P stands for any such name.
//
// With CHANGESCTL_TEST_MAIN=1 the test binary is changesctl itself: it runs
// main on its arguments (runMain starts it so).
func TestMain(m *testing.M) {
	if os.Getenv(envTestMain) == "1" {
		main()
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "changesctl-calls-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	calls := filepath.Join(dir, "calls.jsonl")
	os.Setenv(awsconf.EnvCalls, calls)
	code := m.Run()
	if code == 0 {
		code = checkOperatorCalls(calls)
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func checkOperatorCalls(path string) int {
	rep, err := iamcheck.CheckTestStacks(context.Background(), path, filepath.Join("..", ".."))
	if err != nil {
		fmt.Fprintln(os.Stderr, "IAM check of changesctl's requests:", err)
		return 1
	}
	fmt.Print(rep.Summary())
	if len(rep.Denied) > 0 {
		fmt.Println("FAIL: changesctl made requests the operator policy of docs/deploy.md does not allow")
		return 1
	}
	return 0
}
