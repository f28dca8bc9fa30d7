package main

// e2e-latency: local end-to-end latency, from a write in the source to the
// row in PostgreSQL, at a steady trickle.
//
// An isolated stack (its own prefix, source database and table) runs in the
// real local runtime (localrun.Runtime over the pipeline: the poller on its
// schedule with its deadline, two writer loops long-polling SQS), with
// schedule 1m, poller_timeout 90s, feed timeout 10s and lease TTL 10s. After one warm-up document has arrived, latencyDocs
// documents are written one at a time, latencyInterval apart, from
// latencyStart after the runtime started, so the trickle spans the end of
// the first poller invocation; a watcher queries the table every latencyPoll
// for the documents not yet seen. A document's latency runs from just before
// its PUT to the query that first returned its row, so it includes up to one
// poll interval. The pipeline's warnings and errors are printed after the
// figures.
//
// The same runs again with poller_timeout 60s, equal to the schedule: then
// invocations do not overlap, nothing stands by in the last seconds of each
// minute, and changes written then wait for the next tick. That is why the
// default poller timeout outlasts the schedule.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

const (
	latencyDocs     = 300 // 5 docs/s for 60 s
	latencyInterval = 200 * time.Millisecond
	latencyStart    = 10 * time.Second // trickle start, after the runtime started
	latencyPoll     = 10 * time.Millisecond
	latencyDrain    = 30 * time.Second
)

func e2eLatency(ctx context.Context, r *results) error {
	// The default: invocations overlap, the next one stands by before the
	// current one releases the lease.
	if err := latencyRun(ctx, r, "", 90*time.Second); err != nil {
		return err
	}
	// No overlap: each invocation ends its budget 5 s before its deadline
	// and the next one starts only at the next tick.
	return latencyRun(ctx, r, " (poller_timeout 60s, no overlap)", time.Minute)
}

// latencyRun measures one configuration and records its figures with suffix.
func latencyRun(ctx context.Context, r *results, suffix string, pollerTimeout time.Duration) error {
	// Keep the pipeline's debug log and its metrics, to explain slow documents.
	st, err := newCoreStack(ctx, "el", coreStackSettings{limit: 500, pollerTimeout: pollerTimeout, createTables: true, logLevel: slog.LevelDebug})
	if err != nil {
		return err
	}
	defer coreClose(ctx, st)
	table, _, err := st.PostgresTables("bench", "pg")
	if err != nil {
		return err
	}
	pool, err := coreOpenPool(ctx, 2)
	if err != nil {
		return err
	}
	defer pool.Close()

	started := time.Now()
	w, run, stop := coreWatchedRun(ctx, st, pool, table, st.SourceURL)
	defer stop()

	// Warm up: the writer creates the table with its first message.
	if err := w.write(ctx, "warmup", 0); err != nil {
		return err
	}
	if err := w.wait(ctx, run, 90*time.Second); err != nil {
		return fmt.Errorf("warm-up document: %w", err)
	}
	warm := time.Since(started)
	w.reset()
	if err := run.await(ctx, time.After(time.Until(started.Add(latencyStart)))); err != nil {
		return err
	}

	tick := time.NewTicker(latencyInterval)
	defer tick.Stop()
	for i := range latencyDocs {
		if err := w.write(ctx, fmt.Sprintf("lat-%04d", i), i+1); err != nil {
			return err
		}
		if err := run.await(ctx, tick.C); err != nil {
			return err
		}
	}
	if err := w.wait(ctx, run, latencyDrain); err != nil {
		return err
	}

	lat, late := w.latencies(started, time.Second)
	var xs []float64
	for _, d := range lat {
		xs = append(xs, coreMillis(d))
	}
	r.add("count"+suffix, len(xs), fmt.Sprintf("%d docs/s for %s from %s after the runtime started; first document in %s",
		time.Second/latencyInterval, time.Duration(latencyDocs)*latencyInterval, latencyStart, warm.Round(10*time.Millisecond)))
	r.add("p50 ms"+suffix, percentile(xs, 50), "")
	r.add("p99 ms"+suffix, percentile(xs, 99), "goal <= 1000")
	r.add("max ms"+suffix, percentile(xs, 100), "")
	note := ""
	if len(late) > 0 {
		note = fmt.Sprintf("written %.1fs to %.1fs after the runtime started", late[0].Seconds(), late[len(late)-1].Seconds())
	}
	r.add("over 1s"+suffix, len(late), note)
	// The writer's EndToEndLatency metric runs from the poller's enqueue to
	// the delivery: what SQS and the writer add.
	queued := emfValues(st.Metrics().String(), "EndToEndLatency")
	r.add("enqueue to delivery p99 ms"+suffix, percentile(queued, 99), fmt.Sprintf("the writer's EndToEndLatency metric; p50 %.0f ms, max %.0f ms", percentile(queued, 50), percentile(queued, 100)))
	from, to := time.Duration(0), time.Duration(0)
	if len(late) > 0 {
		from, to = late[0]-500*time.Millisecond, late[len(late)-1]+4*time.Second
	}
	if lines := logLines(st.Logs().String(), started, from, to); len(lines) > 0 {
		fmt.Printf("  pipeline log%s: warnings, errors, and lines around the slow documents (seconds after the runtime started):\n", suffix)
		for _, l := range lines {
			fmt.Printf("    %s\n", l)
		}
	}
	return nil
}

// emfValues returns every value of metric in EMF records, one JSON object
// a line.
func emfValues(records, metric string) []float64 {
	var out []float64
	for _, line := range strings.Split(records, "\n") {
		var rec map[string]json.RawMessage
		if json.Unmarshal([]byte(line), &rec) != nil || rec[metric] == nil {
			continue
		}
		var one float64
		var many []float64
		if json.Unmarshal(rec[metric], &one) == nil {
			out = append(out, one)
		} else if json.Unmarshal(rec[metric], &many) == nil {
			out = append(out, many...)
		}
	}
	return out
}

// logLines returns the text-handler lines of log at level warning or above,
// and those written between from and to after started (when to > 0), at
// most 40, with their time made relative to started.
func logLines(log string, started time.Time, from, to time.Duration) []string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		rest, ok := strings.CutPrefix(line, "time=")
		if !ok {
			continue
		}
		ts, rest, _ := strings.Cut(rest, " ")
		lv, _, _ := strings.Cut(strings.TrimPrefix(rest, "level="), " ")
		var level slog.Level
		_ = level.UnmarshalText([]byte(lv))
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			continue
		}
		at := t.Sub(started)
		if level < slog.LevelWarn && (to == 0 || at < from || at > to) {
			continue
		}
		out = append(out, fmt.Sprintf("%6.2fs %s", at.Seconds(), rest))
		if len(out) == 40 {
			break
		}
	}
	return out
}

// coreWatchedRun runs st's pipeline in the local runtime, and a watcher of
// table for the documents written to source; stop ends both and waits for
// the runtime.
func coreWatchedRun(ctx context.Context, st *stack.Stack, pool *pgxpool.Pool, table pgx.Identifier, source string) (*coreRowWatcher, *coreRunState, func()) {
	rctx, cancel := context.WithCancel(ctx)
	rt := &localrun.Runtime{Deps: st.Deps, Log: st.Deps.Log}
	run := &coreRunState{done: make(chan struct{})}
	go func() { run.err = rt.Run(rctx); close(run.done) }()
	w := &coreRowWatcher{pool: pool, table: table, source: source, sent: map[string]time.Time{}, seen: map[string]time.Time{}}
	go w.run(rctx)
	return w, run, func() { cancel(); <-run.done }
}

// coreRunState is a runtime running in a goroutine: err is set before done
// is closed.
type coreRunState struct {
	done chan struct{}
	err  error
}

// await returns nil once c delivers, or an error when ctx ends or the
// runtime stops first.
func (r *coreRunState) await(ctx context.Context, c <-chan time.Time) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-r.done:
		return r.stopped()
	case <-c:
		return nil
	}
}

func (r *coreRunState) stopped() error {
	if r.err == nil {
		return errors.New("runtime stopped early")
	}
	return fmt.Errorf("runtime stopped: %w", r.err)
}

// coreRowWatcher records when each written document first appears in the
// table.
type coreRowWatcher struct {
	pool   *pgxpool.Pool
	table  pgx.Identifier
	source string // the source database

	mu   sync.Mutex
	sent map[string]time.Time // doc id -> just before its PUT
	seen map[string]time.Time // doc id -> first query that returned it
}

// write PUTs one document, recording the time first.
func (w *coreRowWatcher) write(ctx context.Context, id string, n int) error {
	body, _ := json.Marshal(map[string]any{"type": "latency", "n": n, "written_at": time.Now().UTC()})
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, w.source+"/"+url.PathEscape(id), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	w.mu.Lock()
	w.sent[id] = time.Now()
	w.mu.Unlock()
	resp, err := coreSourceClient.Do(req)
	if err != nil {
		return fmt.Errorf("write %s: %w", id, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("write %s: status %d", id, resp.StatusCode)
	}
	return nil
}

// run queries the table for the documents not yet seen, every latencyPoll.
// Errors (the table does not exist before the first delivery) are retried.
func (w *coreRowWatcher) run(ctx context.Context) {
	q := "SELECT doc_id FROM " + w.table.Sanitize() + " WHERE doc_id = ANY($1)"
	clock.Every(ctx, latencyPoll, func() bool {
		w.mu.Lock()
		var ids []string
		for id := range w.sent {
			if _, ok := w.seen[id]; !ok {
				ids = append(ids, id)
			}
		}
		w.mu.Unlock()
		if len(ids) == 0 {
			return true
		}
		rows, err := w.pool.Query(ctx, q, ids)
		if err != nil {
			return true
		}
		found, err := pgx.CollectRows(rows, pgx.RowTo[string])
		now := time.Now()
		if err != nil {
			return true
		}
		w.mu.Lock()
		for _, id := range found {
			if _, ok := w.seen[id]; !ok {
				w.seen[id] = now
			}
		}
		w.mu.Unlock()
		return true
	})
}

// wait returns once every written document was seen, or fails after limit.
func (w *coreRowWatcher) wait(ctx context.Context, run *coreRunState, limit time.Duration) error {
	end := time.Now().Add(limit)
	t := time.NewTicker(latencyPoll)
	defer t.Stop()
	for {
		w.mu.Lock()
		missing := len(w.sent) - len(w.seen)
		w.mu.Unlock()
		switch {
		case missing == 0:
			return nil
		case time.Now().After(end):
			return fmt.Errorf("%d documents not in PostgreSQL after %s", missing, limit)
		}
		if err := run.await(ctx, t.C); err != nil {
			return err
		}
	}
}

func (w *coreRowWatcher) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sent, w.seen = map[string]time.Time{}, map[string]time.Time{}
}

// latencies returns every document's latency, and the write times (relative
// to started) of those slower than slow, in order.
func (w *coreRowWatcher) latencies(started time.Time, slow time.Duration) ([]time.Duration, []time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var all, late []time.Duration
	for id, t0 := range w.sent {
		d := w.seen[id].Sub(t0)
		all = append(all, d)
		if d > slow {
			late = append(late, t0.Sub(started))
		}
	}
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	return all, late
}
