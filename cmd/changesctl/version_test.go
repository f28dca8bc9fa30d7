package main

import (
	"runtime"
	"strings"
	"testing"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// TestVersion: changesctl version prints, on one line, the release the
// binary was built from and the Go toolchain. A test binary is built
// without a stamped version, so it says devel (the stamped form is
// tests.TestMakeStampsVersion's).
func TestVersion(t *testing.T) {
	t.Parallel()
	var out, errb strings.Builder
	err := realMain(t.Context(), &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, lookup: testenv.Lookup}, []string{"version"})
	if err != nil {
		t.Fatalf("changesctl version: %v (stderr %q)", err, errb.String())
	}
	want := "changesctl devel (" + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
	if got := out.String(); got != want {
		t.Errorf("changesctl version printed %q, want %q", got, want)
	}
	out.Reset()
	if err := realMain(t.Context(), &cliEnv{stdout: &out, stderr: &errb, lookup: testenv.Lookup}, []string{"--version"}); err != nil || out.String() != want {
		t.Errorf("changesctl --version printed %q (%v), want %q", out.String(), err, want)
	}
	if err := realMain(t.Context(), &cliEnv{stdout: &out, stderr: &errb, lookup: testenv.Lookup}, []string{"version", "extra"}); err == nil ||
		!strings.Contains(err.Error(), `version takes no arguments, got "extra"`) {
		t.Errorf("changesctl version extra: %v, want an error naming the argument", err)
	}
}
