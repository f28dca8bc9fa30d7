package lambdamain_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// stampFlags are the linker flags make build gives the functions (see the
// Makefile's LDFLAGS), with a made-up release and commit.
const stampFlags = "-X github.com/changes-worker/changes-worker/shared/version.version=9.8.7 " +
	"-X github.com/changes-worker/changes-worker/shared/version.commit=0123456789ab"

// TestFirstLogLineNamesVersion builds each function with a stamped version
// and starts it with Lambda's JSON log format and no configuration: the
// first line it writes is the start record naming the function, the
// version and the commit, written before the configuration is loaded, so
// even a function that cannot start says what it runs.
func TestFirstLogLineNamesVersion(t *testing.T) {
	t.Parallel()
	for _, fn := range []string{"poller", "writer"} {
		t.Run(fn, func(t *testing.T) {
			t.Parallel()
			bin := filepath.Join(t.TempDir(), "bootstrap")
			build := exec.Command("go", "build", "-tags", "lambda.norpc", "-ldflags", stampFlags, "-o", bin, "../../"+fn)
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("build %s: %v\n%s", fn, err, out)
			}
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(bin)
			cmd.Dir = t.TempDir() // no jobs.json to find
			cmd.Env = []string{"AWS_LAMBDA_LOG_FORMAT=JSON", "AWS_REGION=us-east-1"}
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if code := cmd.ProcessState.ExitCode(); code != 1 {
				t.Errorf("%s without configuration exited with %d (%v), want 1", fn, code, err)
			}
			line, _, _ := bufio.NewReader(&stdout).ReadLine()
			var rec map[string]any
			if err := json.Unmarshal(line, &rec); err != nil {
				t.Fatalf("%s's first line %q is not a JSON log record: %v; stderr: %s", fn, line, err, strings.TrimSpace(stderr.String()))
			}
			for k, want := range map[string]string{"level": "INFO", "message": "starting", "function": fn, "version": "9.8.7", "commit": "0123456789ab"} {
				if rec[k] != want {
					t.Errorf("%s's first log record has %s %v, want %q: %s", fn, k, rec[k], want, line)
				}
			}
		})
	}
}
