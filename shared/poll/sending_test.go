package poll_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/poll"
)

// overlapProbe makes the first request wait until another request starts,
// or until wait has passed: a second request starting meanwhile can only
// come from another chunk, since a chunk's requests go one after another in
// the fake sender. overlapped reports whether one did.
type overlapProbe struct {
	wait    time.Duration
	once    sync.Once
	started chan struct{}
	mu      sync.Mutex
	saw     bool
}

func newOverlapProbe(wait time.Duration) *overlapProbe {
	return &overlapProbe{wait: wait, started: make(chan struct{})}
}

func (p *overlapProbe) before(n int) error {
	switch n {
	case 1:
		select {
		case <-p.started:
			p.mu.Lock()
			p.saw = true
			p.mu.Unlock()
		case <-time.After(p.wait):
		}
	case 2:
		p.once.Do(func() { close(p.started) })
	}
	return nil
}

func (p *overlapProbe) overlapped() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.saw
}

func TestRunChunksInFlight(t *testing.T) {
	t.Parallel()
	// twoChunks is a batch of 200 rows (two chunks of 100) after which the
	// feed is idle; with shared set, row 101 is document d001 again.
	twoChunks := func(r *rig, shared bool) {
		b := batchOf(1, 200)
		if shared {
			b.Rows[100].ID = "d001"
		}
		r.feed.batch = thenIdle(r, b)
	}
	tests := []struct {
		name     string
		depth    int
		targets  []fanout.Target
		shared   bool
		wantSide bool // the second chunk starts while the first is in flight
	}{
		{name: "depth 2, standard queue: two chunks in flight", depth: 2,
			targets: []fanout.Target{{Output: "pg", QueueURL: "q"}}, wantSide: true},
		{name: "depth 2, FIFO queue, no document in common: two chunks in flight", depth: 2,
			targets: []fanout.Target{{Output: "rest", QueueURL: "q.fifo", FIFO: true}}, wantSide: true},
		{name: "depth 2, FIFO queue, a document in both: one after the other", depth: 2, shared: true,
			targets: []fanout.Target{{Output: "rest", QueueURL: "q.fifo", FIFO: true}}},
		{name: "depth 2, standard queue, a document in both: two chunks in flight", depth: 2, shared: true,
			targets: []fanout.Target{{Output: "pg", QueueURL: "q"}}, wantSide: true},
		{name: "depth 2, ordering total: one after the other", depth: 2,
			targets: []fanout.Target{{Output: "rest", QueueURL: "q.fifo", FIFO: true, Total: true}}},
		{name: "depth 1: one after the other", depth: 1,
			targets: []fanout.Target{{Output: "pg", QueueURL: "q"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(nil)
			r.poller.SendDepth = tt.depth
			r.poller.Targets = tt.targets
			twoChunks(r, tt.shared)
			probe := newOverlapProbe(300 * time.Millisecond)
			r.sender.before = probe.before
			res, err := r.run(t, 5*time.Second)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if got := probe.overlapped(); got != tt.wantSide {
				t.Errorf("second chunk started while the first was in flight: %t, want %t", got, tt.wantSide)
			}
			sent := r.sender.docs()
			want := docIDs(1, 200)
			if tt.shared {
				want[100] = "d001"
			}
			slices.Sort(sent)
			slices.Sort(want)
			if diff := cmp.Diff(want, sent); diff != "" {
				t.Errorf("sent (-want +got):\n%s", diff)
			}
			if got := r.leases.stored(); got != "200" || res.Enqueued != 200 {
				t.Errorf("stored checkpoint %q, enqueued %d; want 200, 200", got, res.Enqueued)
			}
			checkCheckpointsFollowSends(t, r.w.log())
		})
	}
}

func TestRunChunkFailsBesideAnother(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		failFirst bool   // the first chunk's request fails, else the second's
		wantStore string // the checkpoint left
	}{
		{name: "the first chunk fails: the checkpoint stays before both", failFirst: true, wantStore: "0"},
		{name: "the second chunk fails: the checkpoint covers the first", wantStore: "100"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(nil)
			r.poller.SendDepth = 2
			r.leases.checkpoint = []byte("0")
			r.feed.batch = thenIdle(r, batchOf(1, 300))
			// Each chunk's first request waits for the other's, so
			// both are in flight when one fails.
			var wg sync.WaitGroup
			wg.Add(2)
			fail := "d101"
			if tt.failFirst {
				fail = "d001"
			}
			r.sender.beforeDoc = func(first string) error {
				if first != "d001" && first != "d101" {
					return nil
				}
				wg.Done()
				wg.Wait()
				if first == fail {
					return errSQS
				}
				return nil
			}
			_, err := r.run(t, 5*time.Second)
			if !errors.Is(err, errSQS) {
				t.Fatalf("Run error = %v, want %v", err, errSQS)
			}
			if got := r.leases.stored(); got != tt.wantStore {
				t.Errorf("stored checkpoint %q, want %q", got, tt.wantStore)
			}
			checkCheckpointsFollowSends(t, r.w.log())
		})
	}
}

func TestRunLeaseLostWithChunksInFlight(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.poller.SendDepth = 2
	r.feed.batch = thenIdle(r, batchOf(1, 400))
	var mu sync.Mutex
	takenOver := false
	var late []int
	r.sender.before = func(n int) error {
		mu.Lock()
		defer mu.Unlock()
		if takenOver {
			late = append(late, n) // passed a fence after the takeover
		}
		if n == 13 {
			r.leases.takeOver()
			r.w.Advance(ttl)
			takenOver = true
		}
		return nil
	}
	res, err := r.run(t, 8*time.Second)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Role != "fenced" {
		t.Errorf("role %q, want fenced", res.Role)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(late) > 0 {
		t.Errorf("requests %v passed the fence after the lease was taken over", late)
	}
	// Chunk 1 may have been recorded before the takeover; chunk 2, whose
	// requests were cut short, never.
	if got, _ := strconv.Atoi(r.leases.stored()); got > 100 {
		t.Errorf("stored checkpoint %d: past the chunks sent before the takeover", got)
	}
	checkCheckpointsFollowSends(t, r.w.log())
}

func TestRunReadAhead(t *testing.T) {
	t.Parallel()
	// Six full pages of 100, then nothing. The first request is held
	// until the reads stop: the reader holds two pages at most, besides
	// the batches taken and waiting to be sent.
	tests := []struct {
		name               string
		depth              int
		maxHeld            int // pages read while the first request was held
		mergedPastTheLimit bool
	}{
		// Page 1 in flight, the next batch taken (a page), two held.
		{name: "one chunk in flight: batches never pass the feed limit", depth: 1, maxHeld: 4},
		// Page 1 in flight, one or two pages in flight beside it, one or
		// two more taken, two held.
		{name: "two chunks in flight: pages that have arrived are merged", depth: 2, maxHeld: 7, mergedPastTheLimit: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(nil)
			r.poller.SendDepth = tt.depth
			r.poller.ChunkRows = 1000
			r.feed.batch = func(_ int, since string) (*feed.Batch, error) {
				n, _ := strconv.Atoi(since) // "" is 0
				if n < 600 {
					b := batchOf(n+1, n+100)
					b.Pending = int64(500 - n)
					return b, nil
				}
				r.w.Advance(time.Second)
				return empty(since), nil
			}
			reads := func() int {
				r.feed.mu.Lock()
				defer r.feed.mu.Unlock()
				return len(r.feed.sinces)
			}
			held := 0
			r.sender.before = func(n int) error {
				if n != 1 {
					return nil
				}
				for last := -1; last != reads(); {
					last = reads()
					time.Sleep(100 * time.Millisecond)
				}
				held = reads()
				return nil
			}
			res, err := r.run(t, 8*time.Second)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if held < 3 || held > tt.maxHeld {
				t.Errorf("%d pages read while the first was held in its send, want 3 to %d", held, tt.maxHeld)
			}
			r.sender.mu.Lock()
			sends := slices.Clone(r.sender.sends)
			r.sender.mu.Unlock()
			total, largest := 0, 0
			for _, n := range sends {
				total += n
				largest = max(largest, n)
			}
			if got := largest > 100; got != tt.mergedPastTheLimit {
				t.Errorf("changes per Send %v: merged past the feed limit %t, want %t", sends, got, tt.mergedPastTheLimit)
			}
			if total != 600 || res.Enqueued != 600 || r.leases.stored() != "600" {
				t.Errorf("sent %d, enqueued %d, checkpoint %q; want 600, 600, \"600\"", total, res.Enqueued, r.leases.stored())
			}
			checkCheckpointsFollowSends(t, r.w.log())
		})
	}
}

// The job's replay epoch reaches every target of every Send, so a FIFO
// queue takes the changes queued again after a reset for new ones.
func TestRunSendsWithReplayEpoch(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.leases.replayEpoch = 7
	r.poller.Targets = append(r.poller.Targets, fanout.Target{Output: "rest", QueueURL: "q.fifo", FIFO: true})
	r.feed.batch = thenIdle(r, batchOf(1, 250))
	if _, err := r.run(t, 5*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	r.sender.mu.Lock()
	defer r.sender.mu.Unlock()
	if len(r.sender.epochs) == 0 {
		t.Fatal("nothing sent")
	}
	for _, e := range r.sender.epochs {
		if e != 7 {
			t.Fatalf("targets' epochs %v, want 7 for every one", r.sender.epochs)
		}
	}
	if r.poller.Targets[0].Epoch != 0 {
		t.Error("the poller's own targets were changed")
	}
}

// The invocation's context ends while two chunks are in flight: the
// invocation ends quietly, as when a single send hit the deadline, with
// the checkpoint before the chunk that failed and no chunk started after
// it. The fake sender ignores contexts, so only the invocation's own
// bookkeeping stops the later chunks.
func TestRunContextEndsWithChunksInFlight(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.poller.SendDepth = 2
	r.leases.checkpoint = []byte("0")
	r.feed.batch = thenIdle(r, batchOf(1, 500))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var both sync.WaitGroup
	both.Add(2)
	r.sender.beforeDoc = func(first string) error {
		switch first {
		case "d001":
			both.Done()
			both.Wait()
			cancel()
			return ctx.Err()
		case "d101":
			both.Done()
			both.Wait()
		}
		return nil
	}
	res, err := r.poller.Run(ctx, poll.Invocation{Owner: "me", Host: "host", Deadline: r.w.Now().Add(5 * time.Second)})
	if err != nil {
		t.Fatalf("Run: %v, want nil (the context ended)", err)
	}
	for _, id := range r.sender.docs() {
		if id > "d200" {
			t.Fatalf("sent %s: a chunk started after the one that failed", id)
		}
	}
	if got := r.leases.stored(); got != "0" || res.Enqueued != 0 {
		t.Errorf("checkpoint %q, enqueued %d; want \"0\", 0 (the first chunk failed)", got, res.Enqueued)
	}
}
