package tests

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/poll"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

// TestIdleSleepPipeline: with idle sleep, on the local services, an
// invocation that has queued what the source held ends once the feed has
// been idle for its stay, long before its budget; the invocation standing
// by beside it takes the released lease as a handoff; a change made after
// both ended is queued by the next tick's invocation; and the outputs end
// up with the source's winners.
func TestIdleSleepPipeline(t *testing.T) {
	ctx, s := parallelStack(t, stackOptions{outputs: []string{"pg"}, limit: 50, idle: config.IdleSleep})
	s.load(ctx, sample.Options{Docs: 20, Seed: 5})
	p, err := s.Deps.Poller(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	budget := s.Config.Stack.PollerTimeout.D()
	stay := s.Config.Jobs[0].IdleStay()
	var wg sync.WaitGroup
	results := make([]poll.Result, 2)
	errs := make([]error, 2)
	took := make([]time.Duration, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 300 * time.Millisecond)
			start := time.Now()
			results[i], errs[i] = p.Run(ctx, poll.Invocation{Owner: fmt.Sprintf("p%d", i), Host: "h", Deadline: start.Add(budget)})
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("runs: %v / %v", errs[0], errs[1])
	}
	if results[0].Role != "active" || results[0].Enqueued != 20 {
		t.Errorf("first invocation %+v, want active with 20 changes queued", results[0])
	}
	if results[1].Role != "active" || results[1].Takeover != lease.Handoff || results[1].Enqueued != 0 {
		t.Errorf("second invocation %+v, want a standby that took the lease as a handoff, with nothing to queue", results[1])
	}
	// The first ends after its stay and a read or two more, well within
	// its budget; the second as soon as a read after the handoff finds
	// nothing, its stay being over by then.
	if d := took[0]; d < stay || d > stay+5*time.Second {
		t.Errorf("first invocation ran %s, want its idle stay (%s) and a read or two, not its budget (%s)", d.Round(time.Millisecond), stay, budget)
	}
	if d := took[1]; d > took[0]+5*time.Second {
		t.Errorf("second invocation ran %s, the first %s: want it to end at its first idle read after the handoff, not at its budget (%s)", d.Round(time.Millisecond), took[0].Round(time.Millisecond), budget)
	}

	// A change between the ticks: the next tick queues it.
	if _, err := s.PutDoc(ctx, "late-order", map[string]any{"type": "order", "late": true}); err != nil {
		t.Fatal(err)
	}
	res, err := p.Run(ctx, poll.Invocation{Owner: "p2", Host: "h", Deadline: time.Now().Add(budget)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Role != "active" || res.Takeover != lease.Handoff || res.Enqueued != 1 {
		t.Errorf("next tick %+v, want the released lease taken as a handoff and the late change queued", res)
	}

	s.runUntilIdle(ctx, localrun.Options{Tick: time.Second})
	if diff := cmp.Diff(s.sourceState(ctx), s.pgState(ctx)); diff != "" {
		t.Errorf("postgres differs from the source winners (-source +pg):\n%s", diff)
	}
}
