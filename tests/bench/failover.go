package main

// The failover benchmark: two pollers run as separate `changesctl run
// --no-writer` processes (tests/faults), at each lease TTL of
// -failover-ttls (1 s, 3 s and 10 s, the default), in two phases on one
// stack per TTL:
//
//   - failover: one invocation per poller every 20 s with a 60 s budget (so
//     both always have one standing by); 20 times, kill -9 the active poller
//     while it queues, restart it, and time the next checkpoint of its
//     successor;
//   - handoff: the pollers are restarted (gracefully) with one invocation
//     every 3 s and a 10 s budget, so the active one reaches the end of its
//     window and releases the lease every few seconds; time each release to
//     the next holder's first checkpoint.
//
// The phases run one after the other: on a small machine a second stack
// running alongside slows the single-threaded emulator enough to add
// seconds to the standby's reads.
//
// A background writer keeps changing the source, each poller reaches SQS
// through a proxy adding 25 ms per request (about AWS's SendMessageBatch
// latency, so a chunk of 100 rows is in flight for a few hundred
// milliseconds), and the writer applies every message to PostgreSQL while
// recording it with its SQS send time.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/tests/faults"
)

func init() {
	register("failover", failover)
}

const failoverSQSLatency = 25 * time.Millisecond

var (
	failoverTTLsFlag = flag.String("failover-ttls", "1s,3s,10s",
		"the lease TTLs the failover benchmark runs at, comma-separated")
	failoverTrialsFlag = flag.Int("failover-trials", 20,
		"kills (and handoffs) per TTL in the failover benchmark")
)

// failoverStack is one stack with its pollers, writer, watcher and proxies.
type failoverStack struct {
	s       *faults.Stack
	cl      *faults.Cluster
	col     *faults.Collector
	w       *faults.Watcher
	load    *faults.Load
	proxies []*faults.Proxy
}

func newFailoverStack(ctx context.Context, bin, name string, ttl time.Duration, backlog int, procs ...faults.ProcOptions) (*failoverStack, error) {
	s, err := faults.NewStack(ctx, faults.StackOptions{Name: name, Limit: 200, TTL: ttl})
	if err != nil {
		return nil, err
	}
	fs := &failoverStack{s: s}
	if err := s.LoadSample(ctx, backlog); err != nil {
		fs.close(ctx)
		return nil, err
	}
	target, err := faults.AWSEndpoint("SQS")
	if err != nil {
		fs.close(ctx)
		return nil, err
	}
	fs.col = s.StartCollector(ctx, 4)
	fs.w = s.Watch(ctx, 50*time.Millisecond)
	fs.cl = s.NewCluster(bin)
	for _, o := range procs {
		px, err := faults.NewProxy(target)
		if err != nil {
			fs.close(ctx)
			return nil, err
		}
		px.SetLatency(failoverSQSLatency)
		fs.proxies = append(fs.proxies, px)
		o.SQS = px.URL()
		if _, err := fs.cl.Add(o); err != nil {
			fs.close(ctx)
			return nil, err
		}
	}
	fs.load = s.StartLoad(ctx, faults.LoadOptions{Rate: 40, Max: 20000, For: 10 * time.Minute, Seed: 8})
	return fs, nil
}

// finish stops the load, lets the pollers catch up and stop, and drains the
// queue into PostgreSQL.
func (fs *failoverStack) finish(ctx context.Context) (faults.Final, error) {
	if _, err := fs.load.Stop(); err != nil {
		return faults.Final{}, fmt.Errorf("background writer: %w", err)
	}
	return faults.Finish(ctx, fs.s, fs.cl, fs.col, fs.w, 3*time.Minute)
}

func (fs *failoverStack) close(ctx context.Context) {
	if fs.load != nil {
		fs.load.Stop()
	}
	if fs.cl != nil {
		fs.cl.Kill()
	}
	if fs.col != nil {
		fs.col.Stop()
	}
	if fs.w != nil {
		fs.w.Stop()
	}
	for _, px := range fs.proxies {
		px.Close()
	}
	coreClose(ctx, fs.s)
}

func failover(ctx context.Context, r *results) error {
	var ttls []time.Duration
	for _, f := range strings.Split(*failoverTTLsFlag, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("-failover-ttls: %w", err)
		}
		ttls = append(ttls, d)
	}
	bin, remove, err := faults.Build(ctx)
	if err != nil {
		return err
	}
	defer remove()
	for _, ttl := range ttls {
		if err := failoverRun(ctx, r, bin, ttl); err != nil {
			return fmt.Errorf("ttl %s: %w", ttl, err)
		}
	}
	return nil
}

// failoverRun measures failovers and handoffs at one lease TTL.
func failoverRun(ctx context.Context, r *results, bin string, ttl time.Duration) error {
	failoverTrials := *failoverTrialsFlag
	fs, err := newFailoverStack(ctx, bin, "bench-failover", ttl, 8000,
		faults.ProcOptions{Name: "a", Tick: 20 * time.Second, PollerTimeout: time.Minute},
		faults.ProcOptions{Name: "b", Tick: 20 * time.Second, PollerTimeout: time.Minute})
	if err != nil {
		return err
	}
	defer fs.close(ctx)

	var trials []faults.Failover
	for attempt := 0; len(trials) < failoverTrials; attempt++ {
		if attempt >= failoverTrials+10 {
			return fmt.Errorf("only %d of %d kills hit a poller holding the lease", len(trials), failoverTrials)
		}
		f, err := fs.cl.KillActive(ctx, fs.w, faults.KillOptions{
			Delay:   time.Duration(rand.IntN(150)) * time.Millisecond,
			Timeout: 3*ttl + 30*time.Second,
		})
		if err != nil {
			return fmt.Errorf("kill %d: %w\n%s", attempt+1, err, fs.cl.Tails(20))
		}
		if f.Released {
			continue // it had just handed off: not a failover
		}
		if f.Takeover != "failover" || f.FirstCheckpoint.IsZero() {
			return fmt.Errorf("kill %d: generation %d taken as %q, first checkpoint %v", attempt+1, f.Generation, f.Takeover, f.FirstCheckpoint)
		}
		trials = append(trials, f)
	}

	// Handoffs: short windows, so that the holder releases every few seconds.
	// Only releases at the end of a window count, not those of the restarts
	// (a stopped poller abandons the chunk it was queueing). A window is
	// about handoffWindow, and one whose new holder had nothing to
	// checkpoint does not count: the wait allows twice the windows needed.
	const handoffWindow = 10 * time.Second
	handoffWait := time.Duration(2*failoverTrials) * handoffWindow
	for _, p := range fs.cl.Current() {
		if err := p.Terminate(30 * time.Second); err != nil {
			return err
		}
		o := p.Options
		o.Tick, o.PollerTimeout = 3*time.Second, handoffWindow
		if _, err := fs.cl.Restart(p, o); err != nil {
			return err
		}
	}
	handoffStart := time.Now()
	err = testenv.Poll(ctx, handoffWait, time.Second, func(context.Context) (bool, error) {
		gaps, _, _ := handoffs(fs, faults.Final{}, handoffStart)
		return len(gaps) >= failoverTrials, nil
	})
	if errors.Is(err, testenv.ErrTimeout) {
		gaps, _, _ := handoffs(fs, faults.Final{}, handoffStart)
		return fmt.Errorf("%d handoffs in %s, want %d", len(gaps), handoffWait, failoverTrials)
	}
	if err != nil {
		return err
	}
	fin, err := fs.finish(ctx)
	if err != nil {
		return err
	}

	var toTakeover, toCheckpoint, replayed []float64
	midBatch := 0
	for _, f := range trials {
		toTakeover = append(toTakeover, f.AcquiredAt.Sub(f.KilledAt).Seconds())
		toCheckpoint = append(toCheckpoint, f.FirstCheckpoint.Sub(f.KilledAt).Seconds())
		n := faults.Replayed(fin.Messages, f.VictimGen, f.Generation)
		if n > 0 {
			midBatch++
		}
		replayed = append(replayed, float64(n))
	}
	gaps, toQueued, handReplayed := handoffs(fs, fin, handoffStart)

	add := func(name string, v any, note string) { r.add(fmt.Sprintf("ttl %s %s", ttl, name), v, note) }
	add("failover_trials", len(trials), fmt.Sprintf("kill -9 of the active poller, TTL %s; %d hit a chunk in flight", ttl, midBatch))
	add("failover_kill_to_takeover_p50_s", median(toTakeover), "kill to the lease taken by another process")
	add("failover_kill_to_takeover_p99_s", percentile(toTakeover, 99), "")
	add("failover_kill_to_first_checkpoint_p50_s", median(toCheckpoint), "kill to the new active's first checkpoint")
	add("failover_kill_to_first_checkpoint_p99_s", percentile(toCheckpoint, 99), fmt.Sprintf("goal <= TTL + 0.5 s = %.1f s", (ttl+time.Second/2).Seconds()))
	add("handoffs", len(gaps), "graceful releases at a window end followed by a handoff")
	add("handoff_gap_p50_s", median(gaps), "release by the old holder to the next one's first checkpoint")
	add("handoff_gap_p99_s", percentile(gaps, 99), "goal <= 2 s")
	add("handoff_to_first_queued_p50_s", median(toQueued), "release by the old holder to the first change the next one queued")
	add("handoff_to_first_queued_p99_s", percentile(toQueued, 99), "")
	add("replayed_per_failover_median", median(replayed), "changes (doc, seq) the killed and the new generation both queued")
	add("replayed_per_failover_max", percentile(replayed, 100), fmt.Sprintf("goal <= one batch (feed limit %d rows; a chunk is %d)", fs.s.Limit, faults.ChunkRows))
	add("replayed_per_handoff_max", handReplayed, "")
	add("pg_docs_differing_from_source", len(fin.Drift), "documents whose row (rev, or presence) differs from the source's winner after the run; goal 0")
	add("pg_docs_not_at_newest_version", len(fin.NotNewest), "documents whose stored (generation, counter) is not the newest version queued for them; goal 0")
	add("pg_duplicate_effects", fin.Stale, fmt.Sprintf("writes (data row inserted/updated/deleted, or versions row updated) that did not raise the document's (generation, counter) in the same transaction, over %d changes applied; goal 0", fin.Applications))
	if len(fin.Regressions) > 0 {
		return fmt.Errorf("the checkpoint moved back %d times: %v", len(fin.Regressions), fin.Regressions)
	}
	return nil
}

// handoffs returns, for every release since start followed by a handoff
// to the next generation, the seconds from the release (the old holder's
// log line) to the new holder's first checkpoint (its write time, from the
// job item) and to the first change it queued (its sender's clock, from
// fin's messages), and the most changes any handoff replayed.
func handoffs(fs *failoverStack, fin faults.Final, start time.Time) (gaps, toQueued []float64, most int) {
	firstQueued := map[int64]time.Time{} // generation -> its first message
	for _, m := range fin.Messages {
		if t, ok := firstQueued[m.Version.Generation]; !ok || m.EnqueuedAt.Before(t) {
			firstQueued[m.Version.Generation] = m.EnqueuedAt
		}
	}
	acq := fs.cl.Acquisitions()
	for _, ev := range fs.cl.Events() {
		if ev.Msg != "lease released" || ev.Time.Before(start) {
			continue
		}
		next, ok := acq[ev.Generation+1]
		if !ok || next.Takeover != "handoff" {
			continue
		}
		first, ok := fs.w.FirstCheckpoint(next.Generation)
		if !ok {
			continue // its window ended before it had anything to checkpoint
		}
		gaps = append(gaps, first.State.CheckpointAt.Sub(ev.Time).Seconds())
		if t, ok := firstQueued[next.Generation]; ok {
			toQueued = append(toQueued, t.Sub(ev.Time).Seconds())
		}
		most = max(most, faults.Replayed(fin.Messages, ev.Generation, next.Generation))
	}
	return gaps, toQueued, most
}
