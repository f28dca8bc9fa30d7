package poll_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/feed"
)

// streaming makes the rig's job stream once caught up, its streams
// answering next(stream, call).
func (r *rig) streaming(next func(stream, call int) (*feed.Batch, error)) {
	r.streams = &fakeStreams{w: r.w, next: next}
	r.poller.Job.Feed.Mode = config.ModeContinuous
	r.poller.OpenStream = r.streams.open
}

// pages answers a page read from since with the batch the map names; a
// since it does not name fails the read for good (the test did not expect
// it).
func pages(m map[string]func() *feed.Batch) func(int, string) (*feed.Batch, error) {
	return func(_ int, since string) (*feed.Batch, error) {
		if f, ok := m[since]; ok {
			return f(), nil
		}
		return nil, fmt.Errorf("unexpected page read from %q", since)
	}
}

// idleAt is an idle long poll at seq taking a second of the clock.
func idleAt(r *rig, seq string) func() *feed.Batch {
	return func() *feed.Batch {
		r.w.Advance(time.Second)
		return empty(seq)
	}
}

var errDropped = &feed.StatusError{Op: "stream", Status: 503, Reason: "Service Unavailable"}

// orderOf fails the test unless the events with the prefixes appear in
// this order (each the first event with its prefix).
func orderOf(t *testing.T, events []string, prefixes ...string) {
	t.Helper()
	at := -1
	for _, p := range prefixes {
		i := slices.IndexFunc(events, func(e string) bool { return strings.HasPrefix(e, p) })
		if i <= at {
			t.Errorf("%q not after %q: %v", p, prefixes, events)
			return
		}
		at = i
	}
}

// waitFor waits (in real time, a few seconds at most) for an event: a
// checkpoint written in the background.
func waitFor(r *rig, event string) error {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if slices.Contains(r.w.log(), event) {
			return nil
		}
	}
	return fmt.Errorf("no %q within 5s: %v", event, r.w.log())
}

func TestRunStreaming(t *testing.T) {
	t.Parallel()
	runCases(t, []runCase{
		{
			name: "catches up with pages, then streams from the checkpoint",
			setup: func(r *rig) {
				r.feed.batch = pages(map[string]func() *feed.Batch{
					"":    func() *feed.Batch { return &feed.Batch{Rows: rows(1, 100), LastSeq: []byte("100"), Pending: 10} },
					"100": func() *feed.Batch { return batchOf(101, 110) },
				})
				r.streaming(batches(streamed(111, 120), streamed(121, 125)))
			},
			deadline: 6 * time.Second,
			wantSent: docIDs(1, 125),
			// The page that ends the feed and the two stream batches come
			// within a second of checkpoint 100: their checkpoints are held
			// back, and the last one written once due, during the idle wait.
			wantCheckpoints: []string{"checkpoint 100", "checkpoint 125"},
			check: func(t *testing.T, r *rig) {
				if diff := cmp.Diff([]string{"110"}, r.streams.froms()); diff != "" {
					t.Errorf("streams opened from (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]string{"", "100"}, r.feed.sinces); diff != "" {
					t.Errorf("pages read from (-want +got):\n%s", diff)
				}
				orderOf(t, r.w.log(), "send d101-d110", "stream 1 from 110", "send d111-d120", "stream 1 closed", "release")
			},
		},
		{
			name: "a dropped stream, a batch whose bodies failed: back to pages from the checkpoint, nothing skipped",
			setup: func(r *rig) {
				calls30 := 0
				r.feed.batch = pages(map[string]func() *feed.Batch{
					"":   func() *feed.Batch { return batchOf(1, 10) },
					"20": func() *feed.Batch { return batchOf(21, 30) },
					"30": func() *feed.Batch {
						if calls30++; calls30 == 1 {
							return idleAt(r, "30")() // waiting to open the stream again
						}
						return batchOf(31, 40)
					},
					"40": idleAt(r, "40"),
				})
				failed := false
				r.feed.fetch = func(_ context.Context, b *feed.Batch) error {
					if b.Rows[0].ID == "d031" && !failed {
						failed = true
						return &feed.StatusError{Op: "bulk_get", Status: 503, Reason: "Service Unavailable"}
					}
					return nil
				}
				r.streaming(func(stream, call int) (*feed.Batch, error) {
					switch {
					case stream == 1 && call == 1:
						return streamed(11, 20), nil
					case stream == 1:
						return nil, errDropped
					case stream == 2 && call == 1:
						return streamed(31, 40), nil // its bodies fail
					case stream == 3 && call == 1:
						return streamed(41, 45), nil
					}
					return nil, nil
				})
			},
			deadline:        15 * time.Second,
			wantSent:        docIDs(1, 45),
			wantCheckpoints: []string{"checkpoint 10", "checkpoint 20", "checkpoint 30", "checkpoint 40", "checkpoint 45"},
			check: func(t *testing.T, r *rig) {
				if diff := cmp.Diff([]string{"10", "30", "40"}, r.streams.froms()); diff != "" {
					t.Errorf("streams opened from (-want +got):\n%s", diff)
				}
				events := r.w.log()
				orderOf(t, events, "stream 1 failed", "stream 1 closed", "read 20")
				orderOf(t, events, "failed fetch d031-d040", "stream 2 closed", "send d031-d040", "stream 3 from 40")
				if !strings.Contains(r.logs.String(), `msg="stream ended; catching up with pages"`) {
					t.Errorf("logs:\n%s", r.logs)
				}
			},
		},
		{
			name: "lease lost while streaming: nothing sent after",
			setup: func(r *rig) {
				r.feed.batch = pages(map[string]func() *feed.Batch{"": func() *feed.Batch { return batchOf(1, 10) }})
				// The second batch comes after an idle wait, in which
				// checkpoint 20 falls due.
				r.streaming(batches(streamed(11, 20), nil, streamed(21, 50)))
				// Before the second stream batch's second request, once the
				// first one's checkpoint is written; the clock jumps a TTL,
				// so the fence must renew before the next request.
				takeOver := takeOverAt(r, 4, ttl)
				r.sender.before = func(n int) error {
					if n == 4 {
						if err := waitFor(r, "checkpoint 20"); err != nil {
							return err
						}
					}
					return takeOver(n)
				}
			},
			deadline:        8 * time.Second,
			wantRole:        "fenced",
			wantSent:        docIDs(1, 40),
			wantCheckpoints: []string{"checkpoint 10", "checkpoint 20"},
			check: func(t *testing.T, r *rig) {
				want := []string{"send d031-d040", "refused renew", "stream 1 closed"}
				if diff := cmp.Diff(want, after(r.w.log(), "taken over")); diff != "" {
					t.Errorf("events after the takeover (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "a mode the source does not offer ends the invocation after the catch-up is recorded",
			setup: func(r *rig) {
				r.feed.batch = pages(map[string]func() *feed.Batch{"": func() *feed.Batch { return batchOf(1, 10) }})
				r.streaming(batches())
				r.streams.openErr = fmt.Errorf("stream: feed=eventsource answered as \"application/json\": %w", feed.ErrModeUnsupported)
			},
			deadline:        8 * time.Second,
			wantErr:         feed.ErrModeUnsupported,
			wantSent:        docIDs(1, 10),
			wantCheckpoints: []string{"checkpoint 10"},
			check: func(t *testing.T, r *rig) {
				if n := len(r.streams.froms()); n != 1 {
					t.Errorf("%d stream opens, want 1 (the refusal is permanent)", n)
				}
			},
		},
		{
			name: "a malformed row cuts a stream batch: the stream is closed and the rest read again with pages",
			setup: func(r *rig) {
				r.poller.Job.Feed.QuarantineAfter = 5
				r.feed.batch = pages(map[string]func() *feed.Batch{
					"":   func() *feed.Batch { return batchOf(1, 10) },
					"15": func() *feed.Batch { return batchOf(16, 20) },
					"20": idleAt(r, "20"),
				})
				r.streaming(func(stream, call int) (*feed.Batch, error) {
					if stream == 1 && call == 1 {
						b := streamed(11, 20)
						b.Malformed = []feed.Malformed{{Before: 5, After: []byte("15"), Reason: "no id", Raw: []byte(`{"seq":16}`)}}
						return b, nil
					}
					return nil, nil
				})
			},
			deadline: 8 * time.Second,
			wantSent: docIDs(1, 20),
			// A cut batch is not the end of the feed: its checkpoint (15)
			// is written at once, as a full batch's is.
			wantCheckpoints: []string{"checkpoint 10", "checkpoint 15", "checkpoint 20"},
			check: func(t *testing.T, r *rig) {
				orderOf(t, r.w.log(), "stream 1 closed", "send d011-d015", "read 15", "send d016-d020", "stream 2 from 20")
			},
		},
		{
			name: "a stream batch cut by its byte budget: the stream is closed and the rest read again with pages",
			setup: func(r *rig) {
				r.feed.batch = pages(map[string]func() *feed.Batch{
					"":   func() *feed.Batch { return batchOf(1, 10) },
					"15": func() *feed.Batch { return batchOf(16, 20) },
					"30": idleAt(r, "30"),
				})
				cut := false
				r.feed.fetch = func(_ context.Context, b *feed.Batch) error {
					if b.Rows[0].ID == "d011" && !cut {
						cut = true
						b.CutBefore(5, nil, "page_bytes: the bodies fetched reached 1024 bytes")
					}
					return nil
				}
				r.streaming(func(stream, call int) (*feed.Batch, error) {
					switch {
					case stream == 1 && call == 1:
						return streamed(11, 20), nil // cut after d015
					case stream == 1 && call == 2:
						return streamed(21, 30), nil // read only by a stream left open
					case stream == 2 && call == 1:
						return streamed(21, 30), nil
					}
					return nil, nil
				})
			},
			deadline:        8 * time.Second,
			wantSent:        docIDs(1, 30),
			wantCheckpoints: []string{"checkpoint 10", "checkpoint 15", "checkpoint 30"},
			check: func(t *testing.T, r *rig) {
				orderOf(t, r.w.log(), "stream 1 closed", "send d011-d015", "read 15", "send d016-d020", "stream 2 from 20", "send d021-d030")
				if diff := cmp.Diff([]string{"10", "20"}, r.streams.froms()); diff != "" {
					t.Errorf("streams opened from (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "a page cut by its byte budget is not the end of the feed: pages go on from the cut, the stream opens after",
			setup: func(r *rig) {
				r.feed.batch = pages(map[string]func() *feed.Batch{
					"":    func() *feed.Batch { return &feed.Batch{Rows: rows(1, 100), LastSeq: []byte("100"), Pending: 50} },
					"100": func() *feed.Batch { return batchOf(101, 150) },
					"120": func() *feed.Batch { return batchOf(121, 150) },
					"150": idleAt(r, "150"),
				})
				r.feed.fetch = func(_ context.Context, b *feed.Batch) error {
					if b.Rows[0].ID == "d101" {
						b.CutBefore(20, nil, "page_bytes: the bodies fetched reached 1024 bytes")
					}
					return nil
				}
				r.streaming(batches())
			},
			deadline:        8 * time.Second,
			wantSent:        docIDs(1, 150),
			wantCheckpoints: []string{"checkpoint 100", "checkpoint 120", "checkpoint 150"},
			check: func(t *testing.T, r *rig) {
				if diff := cmp.Diff([]string{"", "100", "120"}, r.feed.sinces); diff != "" {
					t.Errorf("pages read from (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]string{"150"}, r.streams.froms()); diff != "" {
					t.Errorf("streams opened from (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "the deadline closes an idle stream after the last checkpoint",
			setup: func(r *rig) {
				r.feed.batch = pages(map[string]func() *feed.Batch{"": func() *feed.Batch { return batchOf(1, 10) }})
				r.streaming(batches(streamed(11, 20), streamed(21, 30)))
			},
			deadline: 5 * time.Second,
			wantSent: docIDs(1, 30),
			// Both stream batches come at once: one checkpoint for them.
			wantCheckpoints: []string{"checkpoint 10", "checkpoint 30"},
			check: func(t *testing.T, r *rig) {
				orderOf(t, r.w.log(), "checkpoint 30", "stream 1 closed", "release")
			},
		},
	})
}

// TestStreamBusyUntilDeadline: a stream that never pauses is still ended
// by the budget, closed, and the checkpoint is the last change sent.
func TestStreamBusyUntilDeadline(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.feed.batch = pages(map[string]func() *feed.Batch{"": func() *feed.Batch { return batchOf(1, 10) }})
	r.streaming(func(_, call int) (*feed.Batch, error) {
		r.w.Advance(300 * time.Millisecond)
		return streamed(10*call+1, 10*call+10), nil
	})
	res, err := r.run(t, 5*time.Second)
	if err != nil || res.Role != "active" {
		t.Fatalf("Run = %+v, %v; want an active invocation ending without error", res, err)
	}
	sent := r.sender.docs()
	if len(sent) < 20 || !cmp.Equal(sent, docIDs(1, len(sent))) {
		t.Fatalf("sent %v, want d001 onwards in order, more than the first page", sent)
	}
	if got, want := r.leases.stored(), fmt.Sprint(len(sent)); got != want {
		t.Errorf("stored checkpoint %s, want %s (the last change sent)", got, want)
	}
	events := r.w.log()
	orderOf(t, events, "stream 1 closed", "release")
	if events[len(events)-1] != "release" {
		t.Errorf("events after the release: %v", events)
	}
	checkCheckpointsFollowSends(t, events)
	if errors.Is(err, feed.ErrStreamEnded) {
		t.Errorf("Run error %v", err)
	}
}
