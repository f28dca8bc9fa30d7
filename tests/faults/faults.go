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

	"github.com/changes-worker/changes-worker/shared/poll"
)

// Job is the id of the one job of every stack built here.
const Job = "orders"

// Output is the id of the stack's PostgreSQL output.
const Output = "pg"

// ChunkRows is how many feed rows a poller queues at a time
// (poll.DefaultChunkRows). The checkpoint moves after a chunk at most once a
// second within a batch and always at its end, so a failover replays at
// most one batch (the feed limit), usually less.
const ChunkRows = poll.DefaultChunkRows

// SendBatchLimit is the most entries one SQS SendMessageBatch carries.
const SendBatchLimit = 10

// SendConcurrency is the requests a fault stack's poller keeps in flight
// (the job's send_concurrency) unless StackOptions.SendConcurrency says
// otherwise. It is small so that the requests still run concurrently while
// a fenced poller's late messages stay few.
const SendConcurrency = 4

// InFlightLimit is the most messages a fenced poller can still send with
// sendConcurrency requests in flight: the requests that had passed the
// fence before it was stopped, each of at most SendBatchLimit entries.
func InFlightLimit(sendConcurrency int) int { return sendConcurrency * SendBatchLimit }

// packagePath is cmd/changesctl's import path, so Build works from any
// directory of the module.
const packagePath = "github.com/changes-worker/changes-worker/cmd/changesctl"

// Build compiles cmd/changesctl into a new temporary directory. It returns
// the binary's path and a function that removes the directory.
func Build(ctx context.Context) (bin string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "changesctl-")
	if err != nil {
		return "", nil, fmt.Errorf("build changesctl: %w", err)
	}
	remove = func() { _ = os.RemoveAll(dir) }
	bin = filepath.Join(dir, "changesctl")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, packagePath)
	if out, err := cmd.CombinedOutput(); err != nil {
		remove()
		return "", nil, fmt.Errorf("build changesctl: %w: %s", err, out)
	}
	return bin, remove, nil
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
