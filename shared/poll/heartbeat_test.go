package poll_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/poll"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

// slowFetch is a FetchBatch that takes total of the world's clock for the
// batch whose first document is first (every other batch at once): it
// moves the clock a second at a time, and after each second gives the
// poller up to 200ms of real time to renew a lease that is overdue (less
// than half its TTL left), as a source answering slowly would. It fails
// with the context's error when the context ends first, recording
// "fetch abandoned". each, when set, runs after every second with the
// seconds passed.
func slowFetch(r *rig, first string, total time.Duration, each func(elapsed time.Duration)) func(context.Context, *feed.Batch) error {
	return func(ctx context.Context, b *feed.Batch) error {
		if b.Rows[0].ID != first {
			return nil
		}
		for elapsed := time.Second; elapsed <= total; elapsed += time.Second {
			r.w.Advance(time.Second)
			if each != nil {
				each(elapsed)
			}
			for wait := time.Now().Add(200 * time.Millisecond); r.leases.expiresIn() < ttl/2 && time.Now().Before(wait); {
				time.Sleep(time.Millisecond)
			}
			if ctx.Err() != nil {
				r.w.record("fetch abandoned")
				return fmt.Errorf("fetch: %w", ctx.Err())
			}
		}
		return nil
	}
}

// TestLeaseKeptWhileFetching: bodies whose fetch takes longer than the
// lease TTL (a _bulk_get answering in 30s against a 9s TTL), with a standby
// waiting, cause no failover: the lease is renewed while they are fetched,
// and every change is sent once, by the first holder.
func TestLeaseKeptWhileFetching(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(r *rig)
	}{
		{
			name: "a page",
			setup: func(r *rig) {
				r.feed.batch = pages(map[string]func() *feed.Batch{
					"":   func() *feed.Batch { return batchOf(1, 10) },
					"10": idleAt(r, "10"),
				})
				r.feed.fetch = slowFetch(r, "d001", 30*time.Second, nil)
			},
		},
		{
			name: "a stream batch",
			setup: func(r *rig) {
				r.feed.batch = pages(map[string]func() *feed.Batch{
					"":   func() *feed.Batch { return batchOf(1, 5) },
					"10": idleAt(r, "10"),
				})
				r.streaming(batches(streamed(6, 10)))
				r.feed.fetch = slowFetch(r, "d006", 30*time.Second, nil)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(nil)
			r.poller.HeartbeatInterval = time.Millisecond
			tt.setup(r)
			// The holder's first read waits for the standby to stand by
			// (its first look at the job item).
			read := r.feed.batch
			r.feed.batch = func(call int, since string) (*feed.Batch, error) {
				for call == 1 && r.leases.looks() == 0 {
					time.Sleep(time.Millisecond)
				}
				return read(call, since)
			}
			// The standby stands by until 40.5s, past the fetch, and gives
			// up before the holder releases the lease (at 54s).
			standbyUntil := r.w.Now().Add(45 * time.Second)
			standby := make(chan poll.Result, 1)
			go func() {
				for !slices.Contains(r.w.log(), "acquire 1") {
					time.Sleep(time.Millisecond)
				}
				res, _ := r.poller.Run(t.Context(), poll.Invocation{Owner: "standby", Host: "other", Deadline: standbyUntil})
				standby <- res
			}()
			res, err := r.run(t, 60*time.Second)
			if err != nil || res.Role != "active" || res.Generation != 1 {
				t.Errorf("holder: %+v, %v; want an active invocation of generation 1, ending without error", res, err)
			}
			// The standby may take the lease the holder released (its
			// budget ends in a few milliseconds of real time), never before.
			if got := <-standby; got.Role != "standby" && got.Takeover != lease.Handoff {
				t.Errorf("standby: %+v; want it to stand by, or take over from a released lease", got)
			}
			events := r.w.log()
			if got := matching(before(events, "release"), "acquire"); !cmp.Equal(got, []string{"acquire 1"}) {
				t.Errorf("acquisitions before the holder's release %v, want only the holder's (no failover): %v", got, events)
			}
			if diff := cmp.Diff(docIDs(1, 10), r.sender.docs()); diff != "" {
				t.Errorf("sent (-want +got):\n%s", diff)
			}
			if got := r.leases.stored(); got != "10" {
				t.Errorf("stored checkpoint %q, want 10", got)
			}
		})
	}
}

// TestLeaseLostWhileFetching: a renewal refused while bodies are fetched
// stops the invocation at once: the fetch is abandoned, nothing is sent,
// the checkpoint stays.
func TestLeaseLostWhileFetching(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.poller.HeartbeatInterval = time.Millisecond
	r.feed.batch = pages(map[string]func() *feed.Batch{"": func() *feed.Batch { return batchOf(1, 10) }})
	r.feed.fetch = slowFetch(r, "d001", 30*time.Second, func(elapsed time.Duration) {
		if elapsed == 2*time.Second {
			r.leases.takeOver()
		}
	})
	res, err := r.run(t, 60*time.Second)
	if err != nil || res.Role != "fenced" {
		t.Fatalf("Run = %+v, %v; want a fenced invocation", res, err)
	}
	if sent := r.sender.docs(); len(sent) > 0 {
		t.Errorf("sent %v after the lease was lost", sent)
	}
	events := r.w.log()
	if got := after(events, "taken over"); len(got) < 2 || got[0] != "refused renew" || got[1] != "fetch abandoned" {
		t.Errorf("events after the takeover %v, want the refused renewal, then the fetch abandoned", got)
	}
	if len(matching(events, "checkpoint")) > 0 || r.leases.stored() != "" {
		t.Errorf("checkpoint written: %v", events)
	}
	if errors.Is(err, context.Canceled) {
		t.Errorf("Run error %v", err)
	}
}

// TestLeaseLostWhileSending: a renewal the heartbeat makes while a chunk is
// in flight, refused, fences the rest of the chunk: the request already
// under way finishes (it cannot be called back), and no request starts
// after it, although the lease would still look valid by the clock.
func TestLeaseLostWhileSending(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.poller.HeartbeatInterval = time.Millisecond
	r.feed.batch = thenIdle(r, batchOf(1, 30))
	r.sender.before = func(n int) error {
		if n != 2 {
			return nil
		}
		r.leases.takeOver()
		r.w.Advance(ttl / 2) // the heartbeat is due; half the TTL is left
		for wait := time.Now().Add(2 * time.Second); !slices.Contains(r.w.log(), "refused renew"); time.Sleep(time.Millisecond) {
			if time.Now().After(wait) {
				return errors.New("no renewal within 2s while the request was under way")
			}
		}
		return nil
	}
	res, err := r.run(t, 60*time.Second)
	if err != nil || res.Role != "fenced" {
		t.Fatalf("Run = %+v, %v; want a fenced invocation", res, err)
	}
	if diff := cmp.Diff(docIDs(1, 20), r.sender.docs()); diff != "" {
		t.Errorf("sent (-want +got):\n%s", diff)
	}
	if got, want := after(r.w.log(), "taken over"), []string{"refused renew", "send d011-d020"}; !cmp.Equal(got, want) {
		t.Errorf("events after the takeover %v, want %v", got, want)
	}
}
