package main

// poller-memory: the poller's peak memory at limit=1000 with 10 KB
// documents.
//
// The poller runs in a process of its own, so the figure is its own:
// `changesctl run --no-writer --until-idle` (built for the occasion) over a
// source of memoryDocs documents of about 10 KB, with feed.limit 1000 and
// the real fan-out to the emulator's SQS. The peak resident set size is the
// process's high-water mark (VmHWM in /proc/<pid>/status), read every 10 ms
// while it runs; the Go heap figures come from the runtime's own GC trace
// (GODEBUG=gctrace=1, one line per collection with the heap size when it
// started, when it ended, the live heap, and the goal).
//
// Not ru_maxrss from wait4: Linux carries the parent's high-water mark into
// a child that execs from a vfork (as os/exec does), so a child's ru_maxrss
// is at least the bench process's own peak. After the earlier benchmarks of
// a full run that was 136 MiB, whatever the poller used.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
	"github.com/changes-worker/changes-worker/tests/faults"
)

const (
	memoryDocs    = 20000
	memoryPadding = 10 * 1024
	memoryLimit   = 1000
)

func pollerMemory(ctx context.Context, r *results) error {
	run, err := corePollerOnly(ctx, "pm", memoryLimit, coreLoad, memoryDocs, memoryPadding)
	if err != nil {
		return err
	}
	defer coreClose(ctx, run.st)
	loaded, m := run.loaded, run.mem
	r.add("docs", memoryDocs, fmt.Sprintf("~%d KB bodies, limit %d (a batch holds ~%.0f MiB of bodies), loaded in %s",
		memoryPadding/1024, memoryLimit, float64(memoryLimit*memoryPadding)/(1<<20), loaded.Round(time.Second)))
	r.add("peak RSS MiB", m.maxRSS, fmt.Sprintf("VmHWM of the changesctl process, read every 10 ms; %s", strings.TrimSpace(m.summary)))
	r.add("Go heap peak MiB", m.heapPeak, fmt.Sprintf("largest heap at a GC's start or end, %d GCs", m.gcs))
	r.add("Go live heap max MiB", m.liveMax, "largest live heap a GC left")
	r.add("Go heap goal max MiB", m.goalMax, "")
	return nil
}

// corePollerRun is a stack whose poller ran alone, as a process of its own.
type corePollerRun struct {
	st     *stack.Stack
	loaded time.Duration // writing the documents into the source
	took   time.Duration // the poller process, start to exit
	mem    coreProcessMemory
}

// corePollerOnly provisions a stack named after kind with feed limit limit
// and a 5-minute poller timeout, has load write n documents of about size
// bytes into its source, then runs its poller alone (`changesctl run
// --no-writer --until-idle`) as a process of its own. The caller closes
// run.st; on an error it is closed already.
func corePollerOnly(ctx context.Context, kind string, limit int, load func(ctx context.Context, db string, n, size int) error, n, size int) (corePollerRun, error) {
	var run corePollerRun
	bin, remove, err := faults.Build(ctx)
	if err != nil {
		return run, err
	}
	defer remove()
	run.st, run.loaded, err = coreLoaded(ctx, func() (*stack.Stack, error) {
		return newCoreStack(ctx, kind, coreStackSettings{limit: limit, pollerTimeout: 5 * time.Minute})
	}, load, n, size)
	if err != nil {
		return run, err
	}
	t0 := time.Now()
	run.mem, err = coreMeasureProcess(ctx, bin, "run", "--config", run.st.ConfigPath, "--no-writer", "--until-idle", "--timeout", "4m")
	run.took = time.Since(t0)
	if err != nil {
		coreClose(ctx, run.st)
		return run, err
	}
	return run, nil
}

// coreProcessMemory is what one process used.
type coreProcessMemory struct {
	maxRSS   float64 // MiB
	heapPeak float64 // MiB, from the GC trace
	liveMax  float64
	goalMax  float64
	gcs      int
	summary  string // the process's standard output
}

// coreGCLine matches the heap part of a gctrace line:
// "gc 7 @0.5s 2%: ... ms cpu, 12->13->6 MB, 14 MB goal, ...".
var coreGCLine = regexp.MustCompile(`^gc \d+ .* (\d+)->(\d+)->(\d+) MB, (\d+) MB goal`)

// coreMeasureProcess runs bin with args under GODEBUG=gctrace=1 and returns its
// peak memory. It fails when the process fails.
func coreMeasureProcess(ctx context.Context, bin string, args ...string) (coreProcessMemory, error) {
	var m coreProcessMemory
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(testenv.Environ(), "GODEBUG=gctrace=1")
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return m, err
	}
	if err := cmd.Start(); err != nil {
		return m, fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	peak := sampleHWM(cmd.Process.Pid)
	var tail []string // the last log lines, for an error
	sc := bufio.NewScanner(stderr)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if g := coreGCLine.FindStringSubmatch(line); g != nil {
			m.gcs++
			start, _ := strconv.ParseFloat(g[1], 64)
			end, _ := strconv.ParseFloat(g[2], 64)
			live, _ := strconv.ParseFloat(g[3], 64)
			goal, _ := strconv.ParseFloat(g[4], 64)
			m.heapPeak = max(m.heapPeak, start, end)
			m.liveMax = max(m.liveMax, live)
			m.goalMax = max(m.goalMax, goal)
			continue
		}
		tail = append(tail, line)
		if len(tail) > 20 {
			tail = tail[1:]
		}
	}
	_, _ = io.Copy(io.Discard, stderr)
	// Its standard error is closed, so it has exited (changesctl keeps it
	// open to the end), and until Wait reaps it, its pid is not given to
	// another process.
	m.maxRSS = peak()
	err = cmd.Wait()
	m.summary = stdout.String()
	if err != nil {
		return m, fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), args[0], err, strings.Join(tail, "\n"))
	}
	if m.maxRSS == 0 {
		return m, fmt.Errorf("no VmHWM read for %s (is /proc mounted?)", filepath.Base(bin))
	}
	return m, nil
}

// sampleHWM reads the high-water mark of pid's resident set (VmHWM) every
// 10 ms until the returned function is called, which returns the largest
// value read, in MiB. The mark only grows, so what is missed is at most
// the growth in the process's last 10 ms.
func sampleHWM(pid int) func() float64 {
	path := fmt.Sprintf("/proc/%d/status", pid)
	var kib int64
	read := func() {
		b, err := os.ReadFile(path)
		if err != nil {
			return // gone, or not yet readable
		}
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				if n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64); err == nil {
					kib = max(kib, n)
				}
			}
		}
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			read()
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() float64 {
		close(stop)
		<-done
		return float64(kib) / 1024
	}
}
