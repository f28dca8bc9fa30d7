package poll_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/poll"
)

// idleSource is a source with nothing new past seq 5 whose reads wait, in
// real time, for their whole timeout (a long poll, or a wait on a stream),
// as an idle feed's do. It records when each read starts and ends.
type idleSource struct {
	mu    sync.Mutex
	reads [][2]time.Time
}

func (s *idleSource) wait(ctx context.Context, d time.Duration) (*feed.Batch, error) {
	start := time.Now()
	err := clock.Sleep(ctx, d)
	s.mu.Lock()
	s.reads = append(s.reads, [2]time.Time{start, time.Now()})
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return &feed.Batch{Rows: []feed.Row{}, LastSeq: json.RawMessage("5"), Pending: 0}, nil
}

func (s *idleSource) Changes(ctx context.Context, _ json.RawMessage, timeout time.Duration) (*feed.Batch, error) {
	return s.wait(ctx, timeout)
}

func (s *idleSource) FetchBatch(context.Context, *feed.Batch) error { return nil }

func (s *idleSource) open(context.Context, json.RawMessage) (poll.Stream, error) {
	return idleStream{s}, nil
}

type idleStream struct{ s *idleSource }

func (i idleStream) Next(ctx context.Context, wait time.Duration) (*feed.Batch, error) {
	return i.s.wait(ctx, wait)
}

func (idleStream) Close() error { return nil }

// blind is the longest time, from the first read to the last, in which no
// read was waiting on the source: a change made then waits for the next
// read.
func (s *idleSource) blind() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	reads := slices.Clone(s.reads)
	slices.SortFunc(reads, func(a, b [2]time.Time) int { return a[0].Compare(b[0]) })
	var longest time.Duration
	for i := 1; i < len(reads); i++ {
		longest = max(longest, reads[i][0].Sub(reads[i-1][1]))
	}
	return longest
}

// follow keeps the world's clock at real time until ctx ends.
func (w *world) follow(ctx context.Context) {
	start, base := time.Now(), w.Now()
	go func() {
		for ctx.Err() == nil {
			w.Advance(base.Add(time.Since(start)).Sub(w.Now()))
			time.Sleep(time.Millisecond)
		}
	}()
}

// TestHandoffLeavesTheFeedWatched: a standby that waits beside the holder
// takes the lease over as the holder's window ends, in real time and at the
// production standby interval (one look a second), and reads at once: the
// feed goes unwatched for no more than a few tens of milliseconds across
// the handoff, so a change made then is not held up for the standby's next
// look.
func TestHandoffLeavesTheFeedWatched(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{config.ModeLongpoll, config.ModeContinuous} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			r := newRig(nil)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			r.w.follow(ctx)
			src := &idleSource{}
			r.poller.Feed = src
			if mode == config.ModeContinuous {
				r.poller.Job.Feed.Mode = mode
				r.poller.OpenStream = src.open
			}
			r.poller.StandbyInterval = time.Second
			r.leases.checkpoint = json.RawMessage("5")

			// The holder's budget ends 2.5s from now (a 3.5s deadline
			// less its 1s margin), half-way between two of the standby's
			// looks; the standby's two seconds later.
			start := r.w.Now()
			var wg sync.WaitGroup
			results := make([]poll.Result, 2)
			for i, owner := range []string{"holder", "standby"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					deadline := start.Add(3500*time.Millisecond + time.Duration(2*i)*time.Second)
					res, err := r.poller.Run(ctx, poll.Invocation{Owner: owner, Host: "h", Deadline: deadline})
					if err != nil {
						t.Errorf("%s: %v", owner, err)
					}
					results[i] = res
				}()
				if i == 0 {
					for len(matching(r.w.log(), "acquire")) == 0 {
						time.Sleep(time.Millisecond)
					}
				}
			}
			wg.Wait()

			if results[0].Generation != 1 || results[1].Generation != 2 || results[1].Takeover != "handoff" {
				t.Fatalf("results = %+v, want the holder at generation 1 and the standby taking over by handoff at 2; events %v", results, r.w.log())
			}
			if got, limit := src.blind(), 100*time.Millisecond; got > limit {
				t.Errorf("the feed went unwatched for %s across the handoff, want at most %s", got.Round(time.Millisecond), limit)
			}
		})
	}
}

// trickleFeed brings one change per read, each 300ms after the read began,
// until the clock reaches until; after that a read waits its whole timeout
// and brings nothing.
type trickleFeed struct {
	r     *rig
	until time.Time
	n     int
}

func (f *trickleFeed) Changes(_ context.Context, since json.RawMessage, timeout time.Duration) (*feed.Batch, error) {
	if f.r.w.Now().Before(f.until) {
		f.r.w.Advance(300 * time.Millisecond)
		f.n++
		return batchOf(f.n, f.n), nil
	}
	f.r.w.Advance(timeout)
	return empty(string(since)), nil
}

func (f *trickleFeed) FetchBatch(context.Context, *feed.Batch) error { return nil }

// TestHolderWatchesToItsAnnouncedRelease: a holder whose feed brought
// changes until the last moments of its budget waits on the feed until
// the budget ends, the moment it announced, whatever its idle setting: a
// read cut short for a checkpoint due is no sign of an idle feed there, and
// ending before the announced moment would leave the feed unwatched until
// the standby looks.
func TestHolderWatchesToItsAnnouncedRelease(t *testing.T) {
	t.Parallel()
	for _, idle := range []string{config.IdleWatch, config.IdleSleep} {
		t.Run(idle, func(t *testing.T) {
			t.Parallel()
			r := idleRig(idle)
			start := r.w.Now()
			const budget = 85 * time.Second // a 90s deadline less its margin
			r.poller.Feed = &trickleFeed{r: r, until: start.Add(budget - 400*time.Millisecond)}
			if _, err := r.run(t, 90*time.Second); err != nil {
				t.Fatal(err)
			}
			if ended := r.w.Now().Sub(start); ended < budget {
				t.Errorf("ended %s after its start, want at the end of its budget, %s", ended, budget)
			}
			if strings.Contains(r.logs.String(), "feed idle") {
				t.Errorf("ended as idle:\n%s", r.logs.String())
			}
		})
	}
}
