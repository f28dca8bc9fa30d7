package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// bootstrapStubCDK stands in for cdklocal: its bootstrap creates the
// CDKToolkit stack's status file, and fails as CloudFormation does when
// another bootstrap created the stack's parameter meanwhile.
const bootstrapStubCDK = `#!/usr/bin/env bash
printf 'cdklocal %s\n' "$*" >>"$STUB_DIR/calls"
mkdir "$STUB_DIR/parameter" 2>/dev/null || { echo "ParameterAlreadyExists" >&2; exit 1; }
sleep 0.5
echo CREATE_COMPLETE >"$STUB_DIR/status"
`

// bootstrapStubAWS answers describe-stacks with the status file, or fails
// as the AWS CLI does for a stack that does not exist.
const bootstrapStubAWS = `#!/usr/bin/env bash
[[ -f "$STUB_DIR/status" ]] || { echo "Stack with id CDKToolkit does not exist" >&2; exit 254; }
cat "$STUB_DIR/status"
`

// runBootstrap runs n copies of localstack/cdk-bootstrap.sh at once, with
// stubs for the CDK and AWS CLIs in dir, and returns how each exited.
func runBootstrap(t *testing.T, dir string, n int) []error {
	t.Helper()
	for name, body := range map[string]string{"cdklocal": bootstrapStubCDK, "aws": bootstrapStubAWS} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(filepath.Join("..", "localstack", "cdk-bootstrap.sh"), "-c", "config=jobs.json")
			cmd.Env = append(os.Environ(), "STUB_DIR="+dir, "CDKLOCAL="+filepath.Join(dir, "cdklocal"),
				"CHANGES_AWSCLI="+filepath.Join(dir, "aws"), "CHANGES_BOOTSTRAP_LOCK="+filepath.Join(dir, "lock"))
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Logf("bootstrap %d: %v\n%s", i, err, out)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	return errs
}

func stubCalls(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "calls"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// The tests deploy several stacks at once on a fresh LocalStack: each
// deploy bootstraps the CDK first, and only one may create CDKToolkit.
func TestCDKBootstrapOneAtATime(t *testing.T) {
	parallel(t)
	t.Run("four at once on a fresh account bootstrap once", func(t *testing.T) {
		dir := t.TempDir()
		for i, err := range runBootstrap(t, dir, 4) {
			if err != nil {
				t.Errorf("bootstrap %d failed: %v", i, err)
			}
		}
		if calls := stubCalls(t, dir); len(calls) != 1 || calls[0] != "cdklocal bootstrap -c config=jobs.json" {
			t.Errorf("cdklocal ran %q, want one bootstrap with the deploy's arguments", calls)
		}
	})
	t.Run("a bootstrapped account is left alone", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "status"), []byte("UPDATE_COMPLETE\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		runBootstrap(t, dir, 1)
		if calls := stubCalls(t, dir); len(calls) != 0 {
			t.Errorf("cdklocal ran %q on an account bootstrapped already", calls)
		}
	})
	t.Run("a bootstrap that failed is made again", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "status"), []byte("ROLLBACK_COMPLETE\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := runBootstrap(t, dir, 1)[0]; err != nil {
			t.Errorf("bootstrap failed: %v", err)
		}
		if calls := stubCalls(t, dir); len(calls) != 1 {
			t.Errorf("cdklocal ran %q, want one bootstrap over the failed CDKToolkit", calls)
		}
	})
}
