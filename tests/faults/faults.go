// Package faults runs changes-worker pollers as separate OS processes against
// an isolated pipeline on the local services, and injects the faults of the
// high-availability design into them: kill -9, SIGSTOP/SIGCONT, DynamoDB cut
// off behind a TCP proxy, skewed clocks. It records what happened (the job
// item sampled over time, the processes' lease events, every message the
// pollers queued with its SQS send time) so that the fault tests
// (tests/ha_test.go) and the failover benchmark (tests/bench) can check and
// measure it.
//
// It is a plain package, not a test file, so both can import it; it needs the
// services of `make up` (the AWS emulator, the CouchDB-compatible source and
// PostgreSQL) and a Go toolchain to build cmd/changesctl.
package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// Job is the id of the one job of every stack built here.
const Job = "orders"

// Output is the id of the stack's PostgreSQL output.
const Output = "pg"

// ChunkRows is how many feed rows a poller queues at a time (poll's
// chunkRows). The checkpoint moves after a chunk at most once a second
// within a batch and always at its end, so a failover replays at most one
// batch (the feed limit), usually less than a chunk.
const ChunkRows = 100

// SendBatchLimit is the most entries one SQS SendMessageBatch carries; a
// fenced poller can have at most one such request in flight.
const SendBatchLimit = 10

// dsnEnv is the variable the stacks' configurations name for the PostgreSQL
// DSN; it is set for the poller processes and answered in process.
const dsnEnv = "CHANGES_FAULTS_PG_DSN"

// packagePath is cmd/changesctl's import path, so Build works from any
// directory of the module.
const packagePath = "github.com/changes-worker/changes-worker/cmd/changesctl"

// Build compiles cmd/changesctl into dir and returns the binary's path.
func Build(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "changesctl")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, packagePath)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build changesctl: %w: %s", err, out)
	}
	return bin, nil
}

// couchURL is the CouchDB-compatible source's base URL.
func couchURL() string {
	for _, k := range []string{"CHANGES_TEST_COUCH_URL", "COUCH_URL"} {
		if v := os.Getenv(k); v != "" {
			return strings.TrimRight(v, "/")
		}
	}
	return testenv.DefaultCouchURL
}

// postgresDSN is the PostgreSQL connection string of the local services.
func postgresDSN() string {
	for _, k := range []string{"CHANGES_TEST_PG_DSN", "PG_DSN"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return testenv.DefaultPostgresDSN
}

// lookup is the environment the in-process pipeline resolves secrets from.
func lookup(k string) (string, bool) {
	if k == dsnEnv {
		return postgresDSN(), true
	}
	return os.LookupEnv(k)
}

// OwnerPID returns the process id in a local runtime's lease owner id
// ("local-<host>-<pid>-<n>"), or 0 when owner has another form.
func OwnerPID(owner string) int {
	parts := strings.Split(owner, "-")
	if len(parts) < 4 || parts[0] != "local" {
		return 0
	}
	pid, err := strconv.Atoi(parts[len(parts)-2])
	if err != nil {
		return 0
	}
	return pid
}

// sleep waits d or until ctx ends (clock.Sleep).
var sleep = clock.Sleep
