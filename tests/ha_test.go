package tests

// Fault tests of the high-availability design: pollers run
// as separate `changesctl run --no-writer` processes on the local runtime,
// and the tests kill, freeze, cut off and skew them while a background
// writer keeps changing the source. The lease TTL is 3 s (10 s in the clock
// skew test, whose ±2 s skew needs the fence's TTL/2 margin) so that a
// failover takes seconds; every bound below is derived from the TTL with
// room for a loaded machine. Each poller reaches SQS through a proxy of its
// own that adds AWS-like latency, so faults land while a batch is in flight.
// The last three tests are regression tests of bugs: a lost answer to the
// acquiring write, a chunk started over at every renewal when SQS is slow,
// and a _bulk_get slower than the TTL, during which the lease was not
// renewed and the standby took over. Tools: tests/faults.

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/tests/faults"
)

var (
	ctlOnce   sync.Once
	ctlBin    string
	ctlRemove func()
	ctlErr    error
)

func TestMain(m *testing.M) {
	// -parallel bounds the tests through slots; go test's own bound is
	// lifted so that the deployed tests take theirs first (see the package
	// comment).
	flag.Parse()
	n := flag.Lookup("test.parallel").Value.(flag.Getter).Get().(int)
	slots = make(chan struct{}, max(n, 1))
	if err := flag.Set("test.parallel", "1000"); err != nil {
		fmt.Fprintln(os.Stderr, "tests:", err)
		os.Exit(2)
	}
	code := m.Run()
	if ctlRemove != nil {
		ctlRemove()
	}
	os.Exit(code)
}

// changesctl builds cmd/changesctl once per test binary.
func changesctl(t *testing.T) string {
	t.Helper()
	ctlOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 5*time.Minute)
		defer cancel()
		ctlBin, ctlRemove, ctlErr = faults.Build(ctx)
	})
	if ctlErr != nil {
		t.Fatal(ctlErr)
	}
	return ctlBin
}

// sqsLatency is added to every SQS request of the pollers (about what a
// SendMessageBatch costs on AWS), so queueing a chunk of 100 rows takes a
// few hundred milliseconds, as it would there, and a fault lands mid-batch.
const sqsLatency = 25 * time.Millisecond

// stall is room, in every wait for the pollers to do what they do within a
// TTL or two, for the local services to pause on a loaded machine: a CI run
// saw the job item unchanged, and neither of two pollers log, for 30 s. The
// failover times themselves are measured by make bench. The background load
// of the tests that wait for several rounds lasts until they stop it, so a
// slow round does not find the feed drained.
const stall = time.Minute

// haScenario is one stack with its pollers, writer, job item watcher and
// background load.
type haScenario struct {
	t     *testing.T
	ctx   context.Context
	stack *faults.Stack
	cl    *faults.Cluster
	col   *faults.Collector
	w     *faults.Watcher
	sqs   map[string]*faults.Proxy // each poller's SQS proxy, by URL
	bin   string
}

func newHAScenario(t *testing.T, o faults.StackOptions, backlog int) *haScenario {
	t.Helper()
	testenv.AWS(t)
	testenv.CouchURL(t)
	testenv.PostgresDSN(t)
	ctx := context.Background()
	sc := &haScenario{t: t, ctx: ctx, bin: changesctl(t)}
	var err error
	if sc.stack, err = faults.NewStack(ctx, o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sc.stack.Close(ctx); err != nil {
			t.Errorf("close stack: %v", err)
		}
	})
	if err := sc.stack.LoadSample(ctx, backlog); err != nil {
		t.Fatal(err)
	}
	sc.sqs = map[string]*faults.Proxy{}
	sc.col = sc.stack.StartCollector(ctx, 4)
	t.Cleanup(sc.col.Stop)
	sc.w = sc.stack.Watch(ctx, 100*time.Millisecond)
	t.Cleanup(sc.w.Stop)
	sc.cl = sc.stack.NewCluster(sc.bin)
	t.Cleanup(func() {
		sc.cl.Kill()
		if t.Failed() {
			t.Logf("poller logs:\n%s", sc.cl.Tails(40))
		}
	})
	return sc
}

// proxy starts a proxy to the endpoint of an AWS service ("DynamoDB",
// "SQS"), closed when the test ends.
func (sc *haScenario) proxy(service string) *faults.Proxy {
	sc.t.Helper()
	target, err := faults.AWSEndpoint(service)
	if err != nil {
		sc.t.Fatal(err)
	}
	px, err := faults.NewProxy(target)
	if err != nil {
		sc.t.Fatal(err)
	}
	sc.t.Cleanup(px.Close)
	return px
}

// start starts a poller process that reaches SQS through a proxy of its own
// adding sqsLatency (restarts of its slot keep it).
func (sc *haScenario) start(o faults.ProcOptions) *faults.Proc {
	sc.t.Helper()
	px := sc.proxy("SQS")
	px.SetLatency(sqsLatency)
	o.SQS = px.URL()
	sc.sqs[o.SQS] = px
	p, err := sc.cl.Add(o)
	if err != nil {
		sc.t.Fatal(err)
	}
	return p
}

// finish stops the load, lets the pollers catch up and stop, drains the
// queue into PostgreSQL and checks the outcome every fault test shares: no
// document lost (PostgreSQL equals the source's winners), every document
// holds the newest version sent for it, no write to PostgreSQL without a
// raise of the document's version (no duplicate effect), and the checkpoint
// never moved back.
func (sc *haScenario) finish(load *faults.Load) faults.Final {
	t := sc.t
	t.Helper()
	written, err := load.Stop()
	if err != nil {
		t.Errorf("background writer: %v", err)
	}
	f, err := faults.Finish(sc.ctx, sc.stack, sc.cl, sc.col, sc.w, 2*time.Minute)
	if err != nil {
		t.Fatalf("finish: %v", err)
	}
	t.Logf("background writer wrote %d documents; %d messages queued by %d generations; %d changes applied",
		written, len(f.Messages), len(faults.Generations(f.Messages)), f.Applications)
	if len(f.Drift) > 0 {
		t.Errorf("PostgreSQL differs from the source's winners in %d of %d documents, e.g.:\n%s", len(f.Drift), len(f.Source), head(f.Drift, 10))
	}
	if len(f.NotNewest) > 0 {
		t.Errorf("%d documents do not hold the newest version sent for them, e.g.:\n%s", len(f.NotNewest), head(f.NotNewest, 10))
	}
	if f.Stale != 0 {
		t.Errorf("%d writes to PostgreSQL did not raise the document's version: duplicate effects", f.Stale)
	}
	if len(f.Regressions) > 0 {
		t.Errorf("the checkpoint moved back:\n%s", head(f.Regressions, 10))
	}
	if st := sc.col.Stats(); st.DeadLettered != 0 {
		t.Errorf("%d messages dead-lettered", st.DeadLettered)
	}
	if len(f.WriterErrors) > 0 {
		t.Errorf("writer errors:\n%s", head(f.WriterErrors, 10))
	}
	return f
}

func head(lines []string, n int) string {
	if len(lines) > n {
		lines = append(lines[:n:n], "...")
	}
	return strings.Join(lines, "\n")
}

// kill -9 of the active poller mid-batch, 20 times: each time another
// process takes over by failover with the next generation, the takeover
// replays at most the batch in flight, no document is lost and the
// checkpoint never moves back.
func TestFaultKillActiveMidBatch(t *testing.T) {
	parallel(t)
	const ttl = 3 * time.Second
	const trials = 20
	sc := newHAScenario(t, faults.StackOptions{Name: "kill", TTL: ttl, Limit: 200, FeedTimeout: 2 * time.Second}, 4000)
	for _, name := range []string{"a", "b"} {
		sc.start(faults.ProcOptions{Name: name, Tick: 20 * time.Second, PollerTimeout: time.Minute})
	}
	load := sc.stack.StartLoad(sc.ctx, faults.LoadOptions{Rate: 40, Max: 15000, For: 6 * time.Minute, Seed: 1})

	var done []faults.Failover
	for attempt := 0; len(done) < trials; attempt++ {
		if attempt >= trials+10 {
			t.Fatalf("only %d of %d kills hit a poller holding the lease", len(done), trials)
		}
		f, err := sc.cl.KillActive(sc.ctx, sc.w, faults.KillOptions{
			Delay:   time.Duration(rand.IntN(150)) * time.Millisecond,
			Timeout: 3*ttl + stall,
		})
		if err != nil {
			t.Fatalf("kill %d: %v", attempt+1, err)
		}
		if f.Released {
			t.Logf("kill %d: %s had released generation %d just before: not a failover, again", attempt+1, f.Victim, f.VictimGen)
			continue
		}
		done = append(done, f)
		t.Logf("kill %d: %s (pid %d, generation %d, checkpoint %d) → %s generation %d, takeover %s %.1fs after the kill, first checkpoint after %.1fs",
			len(done), f.Victim, f.VictimPID, f.VictimGen, f.VictimSeq, f.Successor, f.Generation, f.Takeover,
			f.AcquiredAt.Sub(f.KilledAt).Seconds(), f.FirstCheckpoint.Sub(f.KilledAt).Seconds())
		if f.Generation <= f.VictimGen {
			t.Errorf("kill %d: successor generation %d, want more than %d", len(done), f.Generation, f.VictimGen)
		}
		if f.Takeover != "failover" {
			t.Errorf("kill %d: generation %d was taken as %q, want failover", len(done), f.Generation, f.Takeover)
		}
	}
	fin := sc.finish(load)

	midBatch := 0
	for i, f := range done {
		n := faults.Replayed(fin.Messages, f.VictimGen, f.Generation)
		if n > 0 {
			midBatch++
		}
		if n > sc.stack.Limit {
			t.Errorf("kill %d: generation %d replayed %d changes of generation %d, want at most one batch (%d)", i+1, f.Generation, n, f.VictimGen, sc.stack.Limit)
		}
	}
	t.Logf("%d of %d kills hit a chunk in flight (its successor sent part of it again)", midBatch, len(done))
	if midBatch < len(done)/2 {
		t.Errorf("only %d of %d kills were mid-batch; the test no longer exercises what it claims", midBatch, len(done))
	}
}

// youngerThan accepts an active poller whose invocation began less than d
// ago, so that its time budget outlasts the fault about to be injected.
func (sc *haScenario) youngerThan(d time.Duration) func(*faults.Proc, faults.Sample) bool {
	return func(_ *faults.Proc, s faults.Sample) bool {
		start := sc.cl.InvocationStart(s.State.Owner)
		return !start.IsZero() && time.Since(start) < d
	}
}

// SIGSTOP of the active poller past its TTL, then SIGCONT, three times, each
// time with a SendMessageBatch in flight: a standby of the other process
// takes over; the resumed zombie's next write of the job item is refused (it
// logs "lease lost; stopping" and the item keeps the new holder's owner and
// generation); it sends the batch it had in flight and nothing more; and
// those late messages change nothing:
// no document ends at the zombie's generation when the new holder sent it
// too, and PostgreSQL equals the source.
func TestFaultStoppedActiveIsFenced(t *testing.T) {
	parallel(t)
	const ttl = 3 * time.Second
	const pause = ttl + 2*time.Second
	// One request in flight at a time, so the zombie's late messages are
	// bounded by one batch, as they were before sends ran concurrently; with
	// send_concurrency N the bound is N batches (fanout's tests show the
	// fence is asked before every request).
	const sendConcurrency = 1
	sc := newHAScenario(t, faults.StackOptions{Name: "stop", TTL: ttl, Limit: 200, FeedTimeout: 2 * time.Second, SendConcurrency: sendConcurrency}, 3000)
	for _, name := range []string{"a", "b"} {
		// Windows of 30 s (27 s of budget) starting every 10 s: three
		// invocations per process, two of them standing by.
		sc.start(faults.ProcOptions{Name: name, Tick: 10 * time.Second, PollerTimeout: 30 * time.Second})
	}
	load := sc.stack.StartLoad(sc.ctx, faults.LoadOptions{Rate: 40, Max: 15000, For: 6 * time.Minute, Seed: 2})

	type round struct {
		zombie           *faults.Proc
		owner            string
		gen, newGen      int64
		stopped, resumed time.Time
	}
	var rounds []round
	for i := 1; i <= 3; i++ {
		s, victim, err := sc.cl.WaitSending(sc.ctx, sc.w, sc.w.Len(), 3*ttl+stall, sc.youngerThan(18*time.Second))
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		r := round{zombie: victim, owner: s.State.Owner, gen: s.State.Generation}
		// Freeze it with a SendMessageBatch in flight: its proxy holds the
		// request until the zombie resumes, as if the process had stopped
		// just after its fence let the request go.
		px := sc.sqs[victim.Options.SQS]
		if err := px.HoldInFlight(sc.ctx, 10*time.Second); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		mark := sc.w.Len()
		r.stopped = time.Now()
		if err := victim.Stop(); err != nil {
			t.Fatal(err)
		}
		next, err := sc.w.WaitFor(sc.ctx, mark, 3*ttl+stall, func(s faults.Sample) bool {
			return s.State.Generation > r.gen && faults.OwnerPID(s.State.Owner) != victim.PID() && s.CheckpointedByHolder()
		})
		if err != nil {
			t.Fatalf("round %d: no standby took over from the stopped %s: %v", i, victim.Name, err)
		}
		r.newGen = next.State.Generation
		if d := pause - time.Since(r.stopped); d > 0 {
			time.Sleep(d)
		}
		mark = sc.w.Len()
		r.resumed = time.Now()
		if err := victim.Continue(); err != nil {
			t.Fatal(err)
		}
		px.Release()
		lost, err := victim.WaitEvent(sc.ctx, 20*time.Second+stall, func(ev faults.Event) bool {
			return ev.Msg == "lease lost; stopping" && ev.Owner == r.owner
		})
		if err != nil {
			t.Errorf("round %d: the resumed %s did not log that its write was refused: %v", i, victim.Name, err)
		} else if lost.Generation != r.gen {
			t.Errorf("round %d: lease lost at generation %d, want %d", i, lost.Generation, r.gen)
		}
		// The refused write left the item to the new holder: no sample since
		// the resume shows the zombie or its generation.
		if _, err := sc.w.WaitFor(sc.ctx, sc.w.Len(), 5*time.Second, func(faults.Sample) bool { return true }); err != nil {
			t.Fatal(err)
		}
		for _, s := range sc.w.Samples()[mark:] {
			if s.State.Owner == r.owner || s.State.Generation < r.newGen {
				t.Errorf("round %d: after the resume the job item has owner %s generation %d (the zombie is %s at %d, the new holder at %d)",
					i, s.State.Owner, s.State.Generation, r.owner, r.gen, r.newGen)
				break
			}
		}
		t.Logf("round %d: stopped %s (generation %d) for %s; generation %d took over; the zombie logged its lease lost",
			i, victim.Name, r.gen, r.resumed.Sub(r.stopped).Round(time.Millisecond), r.newGen)
		rounds = append(rounds, r)
	}
	fin := sc.finish(load)

	for i, r := range rounds {
		late := 0
		for _, m := range faults.OfGeneration(fin.Messages, r.gen) {
			if !m.Sent.Before(r.resumed.Truncate(time.Millisecond)) {
				late++
			}
		}
		t.Logf("round %d: the zombie (generation %d) sent %d messages after it resumed", i+1, r.gen, late)
		if limit := faults.InFlightLimit(sendConcurrency); late < 1 || late > limit {
			t.Errorf("round %d: the zombie sent %d messages after it resumed, want the one batch it had in flight (1 to %d)", i+1, late, limit)
		}
		if held := faults.HeldByOlder(fin.Messages, fin.Stored, r.gen); len(held) > 0 {
			t.Errorf("round %d: %d documents hold the zombie's generation %d although a newer generation sent them:\n%s", i+1, len(held), r.gen, head(held, 10))
		}
	}
}

// The active poller loses DynamoDB (its proxy closes every connection, then,
// for the next active, black-holes them): it stops queueing within the TTL
// (no message of its generations has an SQS send time later than the cut
// plus the TTL), and a standby that still reaches DynamoDB takes over.
func TestFaultActiveLosesDynamoDB(t *testing.T) {
	parallel(t)
	const ttl = 3 * time.Second
	sc := newHAScenario(t, faults.StackOptions{Name: "ddb", TTL: ttl, Limit: 200, FeedTimeout: 2 * time.Second}, 3000)
	proxyOf := map[*faults.Proc]*faults.Proxy{}
	startBehindProxy := func(name string) {
		px := sc.proxy("DynamoDB")
		p := sc.start(faults.ProcOptions{Name: name, Tick: 10 * time.Second, PollerTimeout: 30 * time.Second, DynamoDB: px.URL()})
		proxyOf[p] = px
	}
	startBehindProxy("a")
	startBehindProxy("b")
	load := sc.stack.StartLoad(sc.ctx, faults.LoadOptions{Rate: 40, Max: 15000, For: 6 * time.Minute, Seed: 3})

	type round struct {
		mode   string
		victim *faults.Proc
		gen    int64
		cut    time.Time
	}
	var rounds []round
	cutOff := map[*faults.Proc]bool{}
	for i, mode := range []string{"closed", "black-holed"} {
		s, victim, err := sc.cl.WaitSending(sc.ctx, sc.w, sc.w.Len(), 3*ttl+stall, func(p *faults.Proc, _ faults.Sample) bool { return !cutOff[p] })
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		r := round{mode: mode, victim: victim, gen: s.State.Generation}
		mark := sc.w.Len()
		r.cut = time.Now()
		if mode == "closed" {
			proxyOf[victim].Cut()
		} else {
			proxyOf[victim].Blackhole()
		}
		cutOff[victim] = true
		// A fresh standby with DynamoDB for the next round; the victim keeps
		// running, cut off, to the end of the test.
		startBehindProxy(string(rune('c' + i)))
		next, err := sc.w.WaitFor(sc.ctx, mark, 3*ttl+stall, func(s faults.Sample) bool {
			return s.State.Generation > r.gen && faults.OwnerPID(s.State.Owner) != victim.PID() && s.CheckpointedByHolder()
		})
		if err != nil {
			t.Fatalf("%s: no standby took over from %s: %v", mode, victim.Name, err)
		}
		t.Logf("%s: cut %s (generation %d) off DynamoDB; generation %d took over %.1fs later",
			mode, victim.Name, r.gen, next.State.Generation, next.At.Sub(r.cut).Seconds())
		rounds = append(rounds, r)
		time.Sleep(2 * ttl) // let the victim misbehave, if it would
	}
	fin := sc.finish(load)

	acq := sc.cl.Acquisitions()
	for _, r := range rounds {
		var last time.Time
		late := 0
		for _, m := range fin.Messages {
			if ev, ok := acq[m.Version.Generation]; !ok || ev.PID != r.victim.PID() {
				continue
			}
			if m.Sent.After(last) {
				last = m.Sent
			}
			if m.Sent.After(r.cut.Add(ttl)) {
				late++
			}
		}
		t.Logf("%s: %s's last message was sent %s after the cut", r.mode, r.victim.Name, last.Sub(r.cut).Round(time.Millisecond))
		if late > 0 {
			t.Errorf("%s: %s sent %d messages more than the TTL (%s) after losing DynamoDB (the last %s after)", r.mode, r.victim.Name, late, ttl, last.Sub(r.cut))
		}
	}
}

// Clocks skewed by ±2 s between two pollers (TTL 10 s: the fence keeps
// TTL/2 = 5 s, more than the 4 s between the two clocks). The slow-clock
// poller, while active, is frozen with a SendMessageBatch in flight for
// 5.5 s, 7 s and 9 s, so that the fast-clock standby, which sees its lease
// expire 4 s early, may take over while the zombie still has that batch to
// deliver. Still at most one
// poller sends at a time: no generation's messages are accepted by SQS after
// a newer generation's first message, beyond the one SendMessageBatch a
// fenced poller can have in flight; and the checkpoint never moves back.
func TestFaultClockSkew(t *testing.T) {
	parallel(t)
	const ttl = 10 * time.Second
	const skew = 2 * time.Second
	const sendConcurrency = 1 // as in TestFaultStoppedActiveIsFenced
	sc := newHAScenario(t, faults.StackOptions{Name: "skew", TTL: ttl, Limit: 200, FeedTimeout: 2 * time.Second, SendConcurrency: sendConcurrency}, 3000)
	opts := map[string]faults.ProcOptions{
		"slow": {Name: "slow", ClockSkew: -skew, Tick: 10 * time.Second, PollerTimeout: 40 * time.Second},
		"fast": {Name: "fast", ClockSkew: skew, Tick: 10 * time.Second, PollerTimeout: 40 * time.Second},
	}
	slow := sc.start(opts["slow"])
	if _, _, err := sc.cl.WaitSending(sc.ctx, sc.w, 0, time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	fast := sc.start(opts["fast"])
	load := sc.stack.StartLoad(sc.ctx, faults.LoadOptions{Rate: 40, Max: 15000, For: 6 * time.Minute, Seed: 4})

	for i, pause := range []time.Duration{5500 * time.Millisecond, 7 * time.Second, 9 * time.Second} {
		// The slow-clock poller must be the active one, early in its
		// invocation. If the fast one holds the lease, stop it gracefully
		// (it releases; a standby of the slow one takes over) and start it
		// again once the slow one holds it.
		var st faults.Sample
		for attempt := 0; ; attempt++ {
			if attempt > 10 {
				t.Fatalf("round %d: the slow-clock poller never became active early in an invocation", i+1)
			}
			s, holder, err := sc.cl.WaitSending(sc.ctx, sc.w, sc.w.Len(), 3*ttl+stall, nil)
			if err != nil {
				t.Fatalf("round %d: %v", i+1, err)
			}
			if holder == slow && sc.youngerThan(20*time.Second)(holder, s) {
				st = s
				break
			}
			if holder == slow {
				// Late in its window: wait for the next holder.
				if _, err := sc.w.WaitFor(sc.ctx, sc.w.Len(), 45*time.Second+stall, func(n faults.Sample) bool { return n.State.Generation > s.State.Generation }); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := fast.Terminate(20 * time.Second); err != nil {
				t.Fatal(err)
			}
			if _, err := sc.w.WaitFor(sc.ctx, sc.w.Len(), 30*time.Second+stall, func(n faults.Sample) bool {
				return faults.OwnerPID(n.State.Owner) == slow.PID() && !n.State.Released
			}); err != nil {
				t.Fatalf("round %d: the slow-clock poller did not take over from the stopped fast one: %v", i+1, err)
			}
			if fast, err = sc.cl.Restart(fast); err != nil {
				t.Fatal(err)
			}
		}
		// Freeze it with a SendMessageBatch in flight (held by its proxy
		// until it resumes).
		px := sc.sqs[slow.Options.SQS]
		if err := px.HoldInFlight(sc.ctx, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := slow.Stop(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(pause)
		if err := slow.Continue(); err != nil {
			t.Fatal(err)
		}
		px.Release()
		time.Sleep(3 * time.Second)
		now, _ := sc.w.Last()
		t.Logf("round %d: froze the slow-clock poller (generation %d) for %s; now generation %d is held by %s", i+1, st.State.Generation, pause, now.State.Generation, now.State.Owner)
	}
	fin := sc.finish(load)

	for _, o := range faults.Overlaps(fin.Messages) {
		t.Logf("overlap: %s", o)
		if limit := faults.InFlightLimit(sendConcurrency); o.Late > limit {
			t.Errorf("two pollers sent at once: %s; a fenced poller may only finish the one batch it had in flight (%d messages)", o, limit)
		}
	}
	// The skew was in effect: SQS's clock minus the envelope's enqueued_at
	// is about +2 s for the slow clock, -2 s for the fast one.
	acq := sc.cl.Acquisitions()
	failovers := 0
	seen := map[string]bool{}
	for _, g := range faults.Generations(fin.Messages) {
		ev := acq[g]
		name := ""
		for _, p := range sc.cl.All() {
			if p.PID() == ev.PID {
				name = p.Options.Name
			}
		}
		off, _ := faults.SendOffset(fin.Messages, g)
		want := -opts[name].ClockSkew
		if name == "" || off < want-500*time.Millisecond || off > want+2*time.Second {
			t.Errorf("generation %d (%s): send time minus enqueued_at is %s, want about %s", g, name, off, want)
		}
		seen[name] = true
		if ev.Takeover == "failover" {
			failovers++
		}
	}
	if !seen["slow"] || !seen["fast"] {
		t.Errorf("generations sent by the slow clock: %v, by the fast clock: %v; want both", seen["slow"], seen["fast"])
	}
	if failovers == 0 {
		t.Error("no failover happened: the freezes did not exercise the skew")
	}
}

// The answer to the write that takes the lease is lost: the write took
// effect, but the connection is reset before the poller reads the answer,
// and the SDK sends the write again. The retry finds the lease held, by the
// invocation itself, which must then go on as the holder: standing by
// behind its own lease would leave the job without an active poller for a
// whole TTL, then count a failover from itself.
func TestFaultLostAcquireResponse(t *testing.T) {
	parallel(t)
	const ttl = 3 * time.Second
	sc := newHAScenario(t, faults.StackOptions{Name: "lostacq", TTL: ttl, Limit: 200, FeedTimeout: 2 * time.Second}, 500)
	px := sc.proxy("DynamoDB")
	px.DropResponses(1) // the process's first DynamoDB call is its first invocation's acquire
	p := sc.start(faults.ProcOptions{Name: "a", Tick: 20 * time.Second, PollerTimeout: 30 * time.Second, DynamoDB: px.URL()})
	load := sc.stack.StartLoad(sc.ctx, faults.LoadOptions{Rate: 20, Max: 200, For: 30 * time.Second, Seed: 5})

	ev, err := p.WaitEvent(sc.ctx, 3*ttl+stall, func(ev faults.Event) bool { return ev.Msg == "lease acquired" })
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range p.Events() {
		if e.Msg == "standing by" && faults.OwnerPID(e.Holder) == p.PID() {
			t.Errorf("invocation %s stood by behind its own lease (holder %s, generation %d)", e.Owner, e.Holder, e.Generation)
		}
	}
	if ev.Takeover != "first" || ev.Generation != 1 {
		t.Errorf("first acquisition: generation %d taken as %q from %q, want generation 1 taken as first", ev.Generation, ev.Takeover, ev.Previous)
	}
	t.Logf("generation %d taken as %s %s after the process started (the SDK's retry backoff included)", ev.Generation, ev.Takeover, ev.Time.Sub(p.Started).Round(time.Millisecond))
	sc.finish(load)
}

// SQS slows down (200 ms per request, so queueing a chunk of 100 rows takes
// about 2 s, more than the TTL/2 = 1.5 s the fence allows after a renewal):
// the active poller must still get through, renewing its lease as the fence
// requires, rather than start the chunk over at every renewal and never
// checkpoint.
func TestFaultSlowSQSStillProgresses(t *testing.T) {
	parallel(t)
	const ttl = 3 * time.Second
	sc := newHAScenario(t, faults.StackOptions{Name: "slowsqs", TTL: ttl, Limit: 100, FeedTimeout: 2 * time.Second}, 400)
	p := sc.start(faults.ProcOptions{Name: "a", Tick: 20 * time.Second, PollerTimeout: time.Minute})
	sc.sqs[p.Options.SQS].SetLatency(200 * time.Millisecond)
	load := sc.stack.StartLoad(sc.ctx, faults.LoadOptions{Rate: 10, Max: 50, For: 10 * time.Second, Seed: 6})

	// 400 documents (about 470 changes) are 5 chunks: about 10 s of sending.
	start := time.Now()
	if err := sc.stack.WaitCaughtUp(sc.ctx, 45*time.Second+stall); err != nil {
		t.Fatalf("slow SQS: %v", err)
	}
	t.Logf("caught up in %s", time.Since(start).Round(time.Millisecond))
	fin := sc.finish(load)
	// A change queued again by a later generation is the replay a takeover
	// makes from the checkpoint (a checkpoint write that outlasts its
	// bound under load ends the invocation); one queued twice by the same
	// holder is a chunk started over.
	sent, changes := map[string]int{}, map[string]bool{}
	dup, replayed := 0, 0
	for _, m := range fin.Messages {
		key := m.DocID + "\x00" + m.Seq
		if changes[key] {
			replayed++
		}
		changes[key] = true
		held := strconv.FormatInt(m.Version.Generation, 10) + "\x00" + key
		if sent[held]++; sent[held] == 2 {
			dup++
		}
	}
	t.Logf("%d messages for %d changes (%d queued again, by a later generation or the same)", len(fin.Messages), len(changes), replayed)
	if dup > 0 {
		t.Errorf("%d changes were queued more than once by a single lease holder: chunks were started over", dup)
	}
}

// A _bulk_get slower than the lease TTL (the source answers each one 5 s
// late; the TTL is 3 s), with a standby waiting: the holder renews its
// lease while it waits for the bodies, so the standby never takes over
// (generation stays 1 for the whole first invocation) and nothing is lost.
func TestFaultSlowBulkGetKeepsLease(t *testing.T) {
	parallel(t)
	const ttl = 3 * time.Second
	const delay = 5 * time.Second
	src := newSlowBulkGet(t, testenv.CouchBaseURL(), delay)
	sc := newHAScenario(t, faults.StackOptions{Name: "slowbulk", TTL: ttl, Limit: 100, FeedTimeout: 2 * time.Second,
		Fetch: config.FetchBulkGet, SourceBase: src.url}, 250)
	for _, name := range []string{"a", "b"} {
		sc.start(faults.ProcOptions{Name: name, Tick: 20 * time.Second, PollerTimeout: time.Minute})
	}
	load := sc.stack.StartLoad(sc.ctx, faults.LoadOptions{Rate: 10, Max: 50, For: 10 * time.Second, Seed: 7})
	start := time.Now()
	if err := sc.stack.WaitCaughtUp(sc.ctx, 45*time.Second+stall); err != nil {
		t.Fatalf("slow _bulk_get: %v", err)
	}
	t.Logf("caught up in %s through %d _bulk_get requests answered %s late", time.Since(start).Round(time.Millisecond), src.slowed.Load(), delay)
	if n := src.slowed.Load(); n < 2 {
		t.Errorf("%d _bulk_get requests slowed: the test no longer exercises a slow fetch", n)
	}
	for _, e := range sc.cl.Events() {
		if e.Msg == "lease acquired" && e.Generation > 1 {
			t.Errorf("%s acquired generation %d (%s from %s) while the first holder was fetching: want no takeover", e.Proc, e.Generation, e.Takeover, e.Previous)
		}
	}
	sc.finish(load)
}

// slowBulkGet is a proxy to a CouchDB-compatible source that answers every
// POST .../_bulk_get delay late.
type slowBulkGet struct {
	url    string
	slowed atomic.Int64
}

func newSlowBulkGet(t *testing.T, base string, delay time.Duration) *slowBulkGet {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	s := &slowBulkGet{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/_bulk_get") {
			s.slowed.Add(1)
			select {
			case <-time.After(delay):
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}
