package main

// idle-latency: end-to-end latency, from a write in the source to the row in
// PostgreSQL, with each idle setting (watch, sleep) and feed mode (longpoll,
// continuous), every AWS request 15 ms late through the proxy
// (-aws-latency).
//
// Each (idle, mode) gets an isolated stack, reading a database of its own on
// the source -idle-source names (a Sync Gateway by default), with the defaults that matter
// here (schedule 1m, latency objective 60s, poller timeout 2m15s, lease TTL
// 10s, feed timeout 10s) and the real local runtime (the poller on its
// schedule, writers long-polling SQS). After a warm-up document:
//
//   - trickle: documents one a second, from the start of an invocation
//     (with sleep, a tick that found the feed idle would leave a change for
//     the next one: that is the next figure), at least idleTrickle of them
//     and on until the trickle has crossed idleHandoffs handoffs of the
//     lease (one a minute), so that its tail is the handoffs';
//   - after idle: idleSamples documents, each written once the job has been
//     idle: with watch, idleQuiet after the last delivery; with sleep, just
//     as an invocation that found the feed idle ends, the worst moment, the
//     change waiting for the next tick.
//
// The AWS requests of the trickle are counted, per change, for the cost
// model in docs/scale.md.

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

func init() { register("idle-latency", idleLatency) }

var (
	idleSettingsFlag = flag.String("idle-settings", config.IdleWatch+","+config.IdleSleep,
		"the idle settings idle-latency and cloud-idle measure, comma-separated")
	idleSourceFlag = flag.String("idle-source", config.SourceSyncGateway,
		"the source idle-latency and cloud-idle read: sync_gateway (a Sync Gateway started for them) or couchdb (pouchdb-server, which ignores the long-poll timeout, so that an idle long poll lasts until the poller gives up on it, 2 s later)")
)

// idleSources hands out databases on the source -idle-source names, each
// behind a counting proxy. A long poll on Sync Gateway ends at its timeout,
// as on CouchDB; on pouchdb-server it does not, which would lengthen every
// idle invocation by the poller's slack.
type idleSources struct {
	sg *testenv.SyncGateway
	n  int
}

func newIdleSources(ctx context.Context) (*idleSources, error) {
	switch *idleSourceFlag {
	case config.SourceCouchDB:
		return &idleSources{}, nil
	case config.SourceSyncGateway:
		sg, err := testenv.NewSyncGateway(ctx, testenv.SyncGatewayOptions{})
		if err != nil {
			return nil, fmt.Errorf("start sync gateway: %w", err)
		}
		os.Setenv(modePasswordEnv, "benchpw")
		return &idleSources{sg: sg}, nil
	}
	return nil, fmt.Errorf("-idle-source %q: want %s or %s", *idleSourceFlag, config.SourceSyncGateway, config.SourceCouchDB)
}

// next creates a database; done removes what it can of it.
func (s *idleSources) next(ctx context.Context) (*modeSource, func(), error) {
	if s.sg == nil {
		return couchModeSource(ctx)
	}
	s.n++
	return sgModeSource(ctx, s.sg, fmt.Sprintf("bench_idle_%d_%d", time.Now().Unix(), s.n))
}

func (s *idleSources) close() {
	if s.sg != nil {
		s.sg.Close()
	}
}

const (
	idleTrickle    = 300
	idleHandoffs   = 3
	idleMaxTrickle = 600
	idleSamples    = 3
	idleQuiet      = 30 * time.Second
	idleEndedMsg   = `msg="feed idle; the next tick reads on"`
	idleTickMsg    = `msg="lease acquired"`
)

func idleLatency(ctx context.Context, r *results) error {
	cw, err := newCloudAWS(*cloudLatencyFlag)
	if err != nil {
		return err
	}
	defer cw.close()
	sources, err := newIdleSources(ctx)
	if err != nil {
		return err
	}
	defer sources.close()
	type row struct {
		label                      string
		handoffs                   int
		p50, p99, mx, idle, idleMx float64
	}
	var rows []row
	for _, idle := range strings.Split(*idleSettingsFlag, ",") {
		for _, mode := range []string{config.ModeLongpoll, config.ModeContinuous} {
			label := idle + " " + mode
			trickle, handoffs, after, err := idleLatencyRun(ctx, r, cw, sources, label, idle, mode)
			if err != nil {
				return fmt.Errorf("%s: %w", label, err)
			}
			rows = append(rows, row{label, handoffs, percentile(trickle, 50), percentile(trickle, 99), percentile(trickle, 100), median(after), percentile(after, 100)})
		}
	}
	fmt.Printf("  %-22s %8s %12s %12s %12s %16s %14s\n", "idle, feed mode", "handoffs", "trickle p50", "trickle p99", "trickle max", "after idle p50", "after idle max")
	for _, x := range rows {
		fmt.Printf("  %-22s %8d %9.0f ms %9.0f ms %9.0f ms %14.1f s %12.1f s\n", x.label, x.handoffs, x.p50, x.p99, x.mx, x.idle/1000, x.idleMx/1000)
	}
	fmt.Printf("  (source %s; AWS requests %s late; load average %s)\n", *idleSourceFlag, *cloudLatencyFlag, loadAverage())
	return nil
}

// idleLatencyRun measures one (idle, mode): the trickle's latencies, the
// handoffs it crossed, and the latencies of the changes made after idle, in
// milliseconds.
func idleLatencyRun(ctx context.Context, r *results, cw *cloudAWS, sources *idleSources, label, idle, mode string) (trickle []float64, handoffs int, after []float64, err error) {
	src, done, err := sources.next(ctx)
	if err != nil {
		return nil, 0, nil, err
	}
	defer done()
	st, err := newCoreStack(ctx, "il", coreStackSettings{limit: 500, pollerTimeout: config.DefaultPollerTimeout(config.DefaultSchedule), createTables: true, logLevel: slog.LevelInfo, source: src})
	if err != nil {
		return nil, 0, nil, err
	}
	defer coreClose(ctx, st)
	j := st.Deps.Config.Jobs[0]
	j.Idle, j.Feed.Mode = idle, mode
	table, _, err := st.PostgresTables("bench", "pg")
	if err != nil {
		return nil, 0, nil, err
	}
	pool, err := coreOpenPool(ctx, 2)
	if err != nil {
		return nil, 0, nil, err
	}
	defer pool.Close()

	w, run, stop := coreWatchedRun(ctx, st, pool, table, src.write)
	defer stop()
	if err := w.write(ctx, "warmup", 0); err != nil {
		return nil, 0, nil, err
	}
	if err := w.wait(ctx, run, 2*time.Minute); err != nil {
		return nil, 0, nil, fmt.Errorf("warm-up document: %w", err)
	}
	w.reset()

	// The trickle, from the start of an invocation.
	if idle == config.IdleSleep {
		if err := idleAwaitLog(ctx, st, run, idleTickMsg, 1, 2*time.Minute); err != nil {
			return nil, 0, nil, err
		}
	}
	cw.resetRequests()
	start := time.Now()
	tick := time.NewTicker(time.Second)
	n := 0
	for n < idleTrickle || (len(idleHandoffTimes(st.Logs().String(), start)) < idleHandoffs && n < idleMaxTrickle) {
		n++
		if err := w.write(ctx, fmt.Sprintf("t-%03d", n), n); err != nil {
			tick.Stop()
			return nil, 0, nil, err
		}
		if err := run.await(ctx, tick.C); err != nil {
			tick.Stop()
			return nil, 0, nil, err
		}
	}
	tick.Stop()
	if err := w.wait(ctx, run, 2*time.Minute); err != nil {
		return nil, 0, nil, err
	}
	counts, took := cw.requests(), time.Since(start)
	lat, _ := w.latencies(start, time.Second)
	for _, d := range lat {
		trickle = append(trickle, coreMillis(d))
	}
	handoffAt := idleHandoffTimes(st.Logs().String(), start)
	slowest := idleSlowest(w, start, handoffAt, 3)
	w.reset()
	r.add(label+" trickle p50 ms", percentile(trickle, 50), fmt.Sprintf("%d changes one a second", len(trickle)))
	r.add(label+" trickle p99 ms", percentile(trickle, 99), fmt.Sprintf("max %.0f ms", percentile(trickle, 100)))
	r.add(label+" trickle max ms", percentile(trickle, 100), "the slowest: "+slowest)
	r.add(label+" trickle handoffs", float64(len(handoffAt)), fmt.Sprintf("handoffs of the lease while the trickle ran, at %s", idleSeconds(handoffAt)))
	r.add(label+" trickle AWS requests per change", cloudPerDoc(counts, n), fmt.Sprintf("over %s, the writers' local receives included", took.Round(time.Second)))

	// After idle.
	for i := range idleSamples {
		if idle == config.IdleSleep {
			// The first wait skips the end of the invocation the trickle
			// kept busy, which started well before the end.
			n := 1
			if i == 0 {
				n = 2
			}
			if err := idleAwaitLog(ctx, st, run, idleEndedMsg, n, 3*time.Minute); err != nil {
				return nil, 0, nil, err
			}
		} else if err := run.await(ctx, time.After(idleQuiet)); err != nil {
			return nil, 0, nil, err
		}
		if err := w.write(ctx, fmt.Sprintf("i-%d", i), i); err != nil {
			return nil, 0, nil, err
		}
		if err := w.wait(ctx, run, 2*time.Minute); err != nil {
			return nil, 0, nil, err
		}
	}
	lat, _ = w.latencies(time.Now(), time.Second)
	for _, d := range lat {
		after = append(after, coreMillis(d))
	}
	how := fmt.Sprintf("%d changes, each %s after the last delivery", len(after), idleQuiet)
	if idle == config.IdleSleep {
		how = fmt.Sprintf("%d changes, each written as an idle invocation ended: the next tick reads it", len(after))
	}
	r.add(label+" after idle median s", median(after)/1000, how)
	r.add(label+" after idle max s", percentile(after, 100)/1000, fmt.Sprintf("latency objective %s", j.LatencyObjective.D()))
	return trickle, len(handoffAt), after, nil
}

// idleHandoffTimes returns when, after started, a poller took the lease
// over by handoff, by st's log.
func idleHandoffTimes(log string, started time.Time) []time.Duration {
	var out []time.Duration
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, idleTickMsg) || !strings.Contains(line, "takeover=handoff") {
			continue
		}
		ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err == nil && t.After(started) {
			out = append(out, t.Sub(started))
		}
	}
	return out
}

// idleSlowest describes the n slowest changes w saw: latency, and when
// each was written from the nearest handoff (handoffs are after started;
// negative: before it).
func idleSlowest(w *coreRowWatcher, started time.Time, handoffs []time.Duration, n int) string {
	type doc struct{ at, lat time.Duration }
	w.mu.Lock()
	var docs []doc
	for id, t0 := range w.sent {
		docs = append(docs, doc{at: t0.Sub(started), lat: w.seen[id].Sub(t0)})
	}
	w.mu.Unlock()
	slices.SortFunc(docs, func(a, b doc) int { return cmp.Compare(b.lat, a.lat) })
	var parts []string
	for _, d := range docs[:min(n, len(docs))] {
		part := fmt.Sprintf("%.0f ms", coreMillis(d.lat))
		if len(handoffs) > 0 {
			near := handoffs[0]
			for _, h := range handoffs {
				if (d.at - h).Abs() < (d.at - near).Abs() {
					near = h
				}
			}
			part += fmt.Sprintf(" written %+.0f ms from a handoff", coreMillis(d.at-near))
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, ", ")
}

// idleSeconds formats durations as seconds.
func idleSeconds(ds []time.Duration) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, fmt.Sprintf("%.1f s", d.Seconds()))
	}
	return strings.Join(parts, ", ")
}

// idleAwaitLog waits until msg has appeared n more times in st's log.
func idleAwaitLog(ctx context.Context, st *stack.Stack, run *coreRunState, msg string, n int, limit time.Duration) error {
	want := strings.Count(st.Logs().String(), msg) + n
	end := time.Now().Add(limit)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for strings.Count(st.Logs().String(), msg) < want {
		if time.Now().After(end) {
			return fmt.Errorf("%s did not appear %d more times within %s", msg, n, limit)
		}
		if err := run.await(ctx, t.C); err != nil {
			return err
		}
	}
	return nil
}
