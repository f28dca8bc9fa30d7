package poll_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/metrics"
	"github.com/changes-worker/changes-worker/shared/poll"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

// thenIdle answers the first read with b and every later one with nothing
// new after b, each idle read taking a second of the clock.
func thenIdle(r *rig, b *feed.Batch) func(int, string) (*feed.Batch, error) {
	return func(call int, _ string) (*feed.Batch, error) {
		if call == 1 {
			return b, nil
		}
		r.w.Advance(time.Second)
		return empty(string(b.LastSeq)), nil
	}
}

var errSQS = errors.New("sqs: service unavailable")

// takeOverAt makes another poller take the lease before request n, and
// moves the clock by jump.
func takeOverAt(r *rig, n int, jump time.Duration) func(int) error {
	return func(request int) error {
		if request == n {
			r.leases.takeOver()
			r.w.Advance(jump)
		}
		return nil
	}
}

func TestRun(t *testing.T) {
	t.Parallel()
	unavailable := &feed.StatusError{Op: "changes", Status: 503, Reason: "Service Unavailable"}
	unauthorized := &feed.StatusError{Op: "changes", Status: 401, Reason: "unauthorized"}
	tests := []runCase{
		{
			name: "queues a batch in chunks of 100, checkpointing at most once a second",
			setup: func(r *rig) {
				r.feed.batch = thenIdle(r, batchOf(1, 1000))
				r.sender.perRequest = 30 * time.Millisecond // 300ms a chunk
			},
			deadline: 8 * time.Second,
			wantSent: docIDs(1, 1000),
			// The first chunk at once (no checkpoint yet), then the first
			// chunk ending a second or more after the last write, then the
			// end of the batch.
			wantCheckpoints: []string{"checkpoint 100", "checkpoint 500", "checkpoint 900", "checkpoint 1000"},
			check: func(t *testing.T, r *rig) {
				if r.feed.sinces[0] != "" || r.feed.sinces[1] != "1000" {
					t.Errorf("reads from %q then %q, want the beginning then 1000", r.feed.sinces[0], r.feed.sinces[1])
				}
			},
		},
		{
			name: "the next page is read while the current one is queued",
			setup: func(r *rig) {
				asked := make(chan struct{})
				var once sync.Once
				r.feed.batch = func(_ int, since string) (*feed.Batch, error) {
					switch since {
					case "":
						return &feed.Batch{Rows: rows(1, 100), LastSeq: json.RawMessage("100"), Pending: 100}, nil
					case "100":
						once.Do(func() { close(asked) })
						return batchOf(101, 200), nil
					}
					r.w.Advance(time.Second)
					return empty(since), nil
				}
				// Page 1's last request waits for the read of page 2.
				r.sender.before = func(n int) error {
					if n != 10 {
						return nil
					}
					select {
					case <-asked:
						return nil
					case <-time.After(5 * time.Second):
						return errors.New("page 2 was not read while page 1 was queued")
					}
				}
			},
			deadline:        8 * time.Second,
			wantSent:        docIDs(1, 200),
			wantCheckpoints: []string{"checkpoint 100", "checkpoint 200"},
		},
		{
			name: "large bodies make smaller chunks",
			setup: func(r *rig) {
				r.feed.batch = thenIdle(r, batchOf(1, 30))
				r.poller.ChunkBytes = 40 // six or five of these bodies
			},
			deadline: 8 * time.Second,
			wantSent: docIDs(1, 30),
			// The first chunk at once, then the end of the batch.
			wantCheckpoints: []string{"checkpoint 6", "checkpoint 30"},
			check: func(t *testing.T, r *rig) {
				sends := matching(r.w.log(), "send")
				if len(sends) < 5 {
					t.Errorf("%d requests for 30 changes in chunks of 40 bytes of bodies, want one per chunk (5 or more): %v", len(sends), sends)
				}
				for _, e := range sends {
					var from, to int
					if _, err := fmt.Sscanf(e, "send d%d-d%d", &from, &to); err != nil || to-from+1 > 6 {
						t.Errorf("request %q: want at most six changes in a chunk", e)
					}
				}
			},
		},
		{
			name: "a send slower than the TTL renews the lease in place",
			setup: func(r *rig) {
				r.feed.batch = thenIdle(r, batchOf(1, 100))
				r.sender.perRequest = time.Second // 10s for the chunk, the TTL is 9s
			},
			deadline:        30 * time.Second,
			wantSent:        docIDs(1, 100),
			wantCheckpoints: []string{"checkpoint 100"},
			check: func(t *testing.T, r *rig) {
				sends := between(r.w.log(), "send d001-d010", "send d091-d100")
				// Without a renewal the lease expires at the ninth request.
				if n := len(matching(sends, "renew")); n < 1 {
					t.Errorf("no renewal during the chunk: %v", sends)
				}
			},
		},
		{
			name: "lease lost mid-batch: nothing sent after",
			setup: func(r *rig) {
				r.feed.batch = thenIdle(r, batchOf(1, 250))
				r.sender.perRequest = 10 * time.Millisecond
				// At chunk 2's third request; the clock jumps a TTL, so the
				// fence must renew before the next request.
				r.sender.before = takeOverAt(r, 13, ttl)
			},
			deadline:        8 * time.Second,
			wantRole:        "fenced",
			wantSent:        docIDs(1, 130),
			wantCheckpoints: []string{"checkpoint 100"},
			check: func(t *testing.T, r *rig) {
				want := []string{"send d121-d130", "refused renew"}
				if diff := cmp.Diff(want, after(r.w.log(), "taken over")); diff != "" {
					t.Errorf("events after the takeover (-want +got):\n%s", diff)
				}
				if !strings.Contains(r.logs.String(), `msg="lease lost; stopping"`) {
					t.Errorf("logs:\n%s", r.logs)
				}
			},
		},
		{
			name: "a send that fails halfway: the checkpoint stays before the unsent rows",
			setup: func(r *rig) {
				// A recent checkpoint: the first chunk is not recorded at once.
				r.leases.checkpoint, r.leases.checkpointAt = json.RawMessage("0"), r.w.Now()
				r.feed.batch = thenIdle(r, &feed.Batch{Rows: rows(1, 250), LastSeq: json.RawMessage("250"), Pending: 5})
				r.sender.perRequest = 10 * time.Millisecond
				r.sender.before = func(n int) error {
					if n == 15 { // chunk 2's fifth request
						return errSQS
					}
					return nil
				}
			},
			deadline:        8 * time.Second,
			wantErr:         errSQS,
			wantSent:        docIDs(1, 140),
			wantCheckpoints: []string{"checkpoint 100"},
		},
		{
			name: "a transient source error: checkpoint unchanged, retried after a backoff",
			setup: func(r *rig) {
				r.leases.checkpoint = json.RawMessage("0")
				r.feed.batch = func(call int, _ string) (*feed.Batch, error) {
					switch {
					case call <= 2:
						return nil, unavailable
					case call == 3:
						return batchOf(1, 20), nil
					}
					r.w.Advance(time.Second)
					return empty("20"), nil
				}
			},
			deadline:        6 * time.Second,
			wantSent:        docIDs(1, 20),
			wantCheckpoints: []string{"checkpoint 20"},
			check: func(t *testing.T, r *rig) {
				if diff := cmp.Diff([]string{"0", "0", "0", "20"}, r.feed.sinces[:4]); diff != "" {
					t.Errorf("reads from (-want +got):\n%s", diff)
				}
				// Backoffs: 125-250ms, then half to all of twice that.
				for i := 1; i <= 2; i++ {
					if gap := r.feed.at[i].Sub(r.feed.at[i-1]); gap < 125*time.Millisecond {
						t.Errorf("retry %d after %s, want at least 125ms", i, gap)
					}
				}
				if ev := matching(before(r.w.log(), "send"), "checkpoint"); len(ev) != 0 {
					t.Errorf("checkpoints before the source recovered: %v", ev)
				}
			},
		},
		{
			name: "a permanent source error: checkpoint unchanged, lease released",
			setup: func(r *rig) {
				r.leases.checkpoint = json.RawMessage("7")
				r.feed.batch = func(int, string) (*feed.Batch, error) { return nil, unauthorized }
			},
			deadline:   8 * time.Second,
			wantErr:    unauthorized,
			wantStored: "7",
			check: func(t *testing.T, r *rig) {
				if diff := cmp.Diff([]string{"7"}, r.feed.sinces); diff != "" {
					t.Errorf("reads from (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "the budget ends on a failing source: its error is reported",
			setup: func(r *rig) {
				r.feed.batch = func(int, string) (*feed.Batch, error) {
					r.w.Advance(600 * time.Millisecond)
					return nil, unavailable
				}
			},
			deadline: 3 * time.Second,
			wantErr:  unavailable,
		},
		{
			name: "a refused checkpoint: stop, send nothing more",
			setup: func(r *rig) {
				r.feed.batch = thenIdle(r, batchOf(1, 250))
				r.sender.before = takeOverAt(r, 10, 0) // the last request of chunk 1
			},
			deadline: 8 * time.Second,
			wantRole: "fenced",
			wantSent: docIDs(1, 100),
			check: func(t *testing.T, r *rig) {
				want := []string{"send d091-d100", "refused checkpoint 100"}
				if diff := cmp.Diff(want, after(r.w.log(), "taken over")); diff != "" {
					t.Errorf("events after the takeover (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "a trickle: pages that end the feed are checkpointed at most once a second, the last once due",
			setup: func(r *rig) {
				// One change a long poll, 300 ms apart, then nothing.
				r.feed.batch = func(call int, _ string) (*feed.Batch, error) {
					r.w.Advance(300 * time.Millisecond)
					if call <= 10 {
						return batchOf(call, call), nil
					}
					r.w.Advance(700 * time.Millisecond)
					return empty("10"), nil
				}
			},
			deadline: 6 * time.Second,
			wantSent: docIDs(1, 10),
			// Reads take 310 ms of the clock: 1 at once, then the first
			// page a second or more after the last write, then 10 once
			// due, during the idle long poll.
			wantCheckpoints: []string{"checkpoint 1", "checkpoint 5", "checkpoint 9", "checkpoint 10"},
		},
		{
			// The next page is queued while a page's checkpoint is written:
			// its requests may go out until the refusal is known (the lease
			// is still valid by the clock, the fence allows them), none
			// after, and the checkpoint never moves.
			name: "a refused checkpoint left in flight: the sends stop once it is known",
			setup: func(r *rig) {
				r.feed.batch = func(call int, _ string) (*feed.Batch, error) {
					if call == 1 {
						return batchOf(1, 50), nil
					}
					return batchOf(51, 80), nil
				}
				r.sender.before = takeOverAt(r, 5, 0) // the batch's last request
			},
			deadline:    8 * time.Second,
			wantRole:    "fenced",
			wantSent:    docIDs(1, 50),
			mayAlsoSend: docIDs(51, 80),
			check: func(t *testing.T, r *rig) {
				events := after(r.w.log(), "taken over")
				if got := matching(events, "send"); len(got) > 4 {
					t.Errorf("sends after the takeover: %v, want the one under way and at most the next page's three", got)
				}
				if diff := cmp.Diff([]string{"", "50"}, r.feed.sinces); diff != "" {
					t.Errorf("reads from (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "deadline reached mid-batch: what was queued is checkpointed, the lease released",
			setup: func(r *rig) {
				r.leases.checkpoint, r.leases.checkpointAt = json.RawMessage("0"), r.w.Now()
				r.feed.batch = thenIdle(r, batchOf(1, 300))
				r.sender.perRequest = 90 * time.Millisecond // 0.9s a chunk; the budget is 2s
			},
			deadline:        3 * time.Second,
			wantSent:        docIDs(1, 100),
			wantCheckpoints: []string{"checkpoint 100"},
		},
		{
			name: "deadline reached while idle: the lease is released",
			setup: func(r *rig) {
				r.leases.checkpoint = json.RawMessage("3")
				r.feed.batch = func(int, string) (*feed.Batch, error) {
					r.w.Advance(time.Second)
					return empty("3"), nil
				}
			},
			deadline:   5 * time.Second,
			wantStored: "3",
			check: func(t *testing.T, r *rig) {
				// Budget 4s (a 1s margin), a second a read, 500ms kept free.
				if n := len(r.feed.sinces); n != 4 {
					t.Errorf("%d reads, want 4", n)
				}
			},
		},
		{
			name: "a read that ends past the budget: no heartbeat, the lease is released",
			setup: func(r *rig) {
				r.leases.checkpoint = json.RawMessage("3")
				r.feed.batch = func(int, string) (*feed.Batch, error) {
					r.w.Advance(4500 * time.Millisecond) // past the budget (4s), more than a third of the TTL
					return empty("3"), nil
				}
			},
			deadline:   5 * time.Second,
			wantStored: "3",
			check: func(t *testing.T, r *rig) {
				if diff := cmp.Diff([]string{"acquire 1", "read 3", "release"}, r.w.log()); diff != "" {
					t.Errorf("events (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "a standby takes over when the holder releases the lease",
			setup: func(r *rig) {
				r.leases.checkpoint = json.RawMessage("40")
				r.leases.holdBy("poller-0")
				r.leases.freeAfterReads = 3
				r.feed.batch = thenIdle(r, batchOf(41, 45))
			},
			deadline:        5 * time.Second,
			wantSent:        docIDs(41, 45),
			wantCheckpoints: []string{"checkpoint 45"},
			check: func(t *testing.T, r *rig) {
				// It took over within its first looks, before a standby
				// marks the item (see TestStandbyMarks).
				if r.leases.marks != 0 {
					t.Errorf("the standby marked the job item %d times in its first looks", r.leases.marks)
				}
				if !strings.Contains(r.logs.String(), `msg="standing by" job=orders owner=me holder=poller-0 generation=1`) {
					t.Errorf("logs:\n%s", r.logs)
				}
				if r.feed.sinces[0] != "40" {
					t.Errorf("first read from %q, want the checkpoint 40", r.feed.sinces[0])
				}
			},
		},
		{
			name: "a standby whose budget ends without the lease",
			setup: func(r *rig) {
				r.leases.holdBy("poller-0")
				r.leases.perRead = 500 * time.Millisecond
				r.feed.batch = func(int, string) (*feed.Batch, error) { return nil, errors.New("read by a standby") }
			},
			deadline: 3 * time.Second,
			wantRole: "standby",
			check: func(t *testing.T, r *rig) {
				if len(r.feed.sinces) != 0 {
					t.Errorf("a standby read the feed %d times", len(r.feed.sinces))
				}
				if r.leases.owner != "poller-0" {
					t.Errorf("the lease moved to %s", r.leases.owner)
				}
			},
		},
	}
	runCases(t, tests)
}

// runCase is one invocation on the rig and what it must have done.
type runCase struct {
	name     string
	setup    func(r *rig)
	deadline time.Duration

	wantErr         error
	wantRole        string // default "active": an active invocation ends by releasing the lease
	wantSent        []string
	mayAlsoSend     []string // sent or not, after wantSent, in this order
	wantCheckpoints []string // successful checkpoint writes, in order
	wantStored      string   // default: the last checkpoint written
	check           func(t *testing.T, r *rig)
}

// runCases runs each case on a new rig, in parallel.
func runCases(t *testing.T, tests []runCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(nil)
			tt.setup(r)
			res, err := r.run(t, tt.deadline)
			wantRole := tt.wantRole
			if wantRole == "" {
				wantRole = "active"
			}
			wantReleased := wantRole == "active"
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("Run error = %v, want %v", err, tt.wantErr)
			}
			if res.Role != wantRole {
				t.Errorf("role %q, want %q", res.Role, wantRole)
			}
			sent := r.sender.docs()
			if n := len(tt.wantSent); len(sent) > n && len(sent) <= n+len(tt.mayAlsoSend) &&
				cmp.Equal(sent[n:], tt.mayAlsoSend[:len(sent)-n]) {
				sent = sent[:n]
			}
			if diff := cmp.Diff(tt.wantSent, sent); diff != "" {
				t.Errorf("sent (-want +got):\n%s", diff)
			}
			events := r.w.log()
			if diff := cmp.Diff(tt.wantCheckpoints, matching(events, "checkpoint")); diff != "" {
				t.Errorf("checkpoints (-want +got):\n%s", diff)
			}
			wantStored := tt.wantStored
			if n := len(tt.wantCheckpoints); n > 0 {
				wantStored = strings.TrimPrefix(tt.wantCheckpoints[n-1], "checkpoint ")
			}
			if got := r.leases.stored(); got != wantStored {
				t.Errorf("stored checkpoint %q, want %q", got, wantStored)
			}
			if got := len(matching(events, "release")) == 1; got != wantReleased {
				t.Errorf("released %t, want %t (events %v)", got, wantReleased, events)
			}
			if wantReleased && events[len(events)-1] != "release" {
				t.Errorf("events after the release: %v", events)
			}
			if res.Role == "active" && tt.wantErr == nil && (res.Read < len(tt.wantSent) || res.Enqueued != len(tt.wantSent)) {
				t.Errorf("result read %d enqueued %d, want %d", res.Read, res.Enqueued, len(tt.wantSent))
			}
			if len(r.sender.unsafe) > 0 {
				t.Errorf("sent while the lease could have expired: %v", r.sender.unsafe)
			}
			checkCheckpointsFollowSends(t, events)
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}

// checkCheckpointsFollowSends fails the test when a checkpoint write
// started before every change from the first sent up to its seq was sent.
func checkCheckpointsFollowSends(t *testing.T, events []string) {
	t.Helper()
	sent := map[int]bool{}
	first := 0
	for _, e := range events {
		var from, to, seq int
		switch {
		case strings.HasPrefix(e, "send "):
			if _, err := fmt.Sscanf(e, "send d%d-d%d", &from, &to); err != nil {
				t.Fatalf("event %q: %v", e, err)
			}
			for i := from; i <= to; i++ {
				sent[i] = true
			}
			if first == 0 {
				first = from
			}
		case strings.HasPrefix(e, "checkpoint "):
			if _, err := fmt.Sscanf(e, "checkpoint %d", &seq); err != nil {
				t.Fatalf("event %q: %v", e, err)
			}
			for i := max(first, 1); i <= seq; i++ {
				if !sent[i] {
					t.Errorf("%s before d%03d was sent", e, i)
					break
				}
			}
		}
	}
}

// TestRunTakesOverAnExpiredLease: a holder's lease that expired by the
// clock is taken over at once, as a failover.
func TestRunTakesOverAnExpiredLease(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.leases.holdBy("crashed")
	r.w.Advance(ttl + time.Second)
	r.feed.batch = thenIdle(r, batchOf(1, 3))
	res, err := r.run(t, 4*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.Role != "active" || res.Takeover != lease.Failover || res.Generation != 2 {
		t.Errorf("result %+v, want active failover at generation 2", res)
	}
}

// OnFailover is called once, before the first read, by an invocation that
// takes the lease over from a holder that did not release it, and not by
// one that takes a free or released lease.
func TestOnFailover(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		setup func(*rig)
		want  []string
	}{
		{name: "failover", setup: func(r *rig) {
			r.leases.holdBy("crashed")
			r.w.Advance(ttl + time.Second)
		}, want: []string{"acquire 2", "on failover", "read "}},
		{name: "handoff", setup: func(r *rig) {
			r.leases.holdBy("previous")
			r.leases.released = true
		}, want: []string{"acquire 2", "read "}},
		{name: "first", setup: func(*rig) {}, want: []string{"acquire 1", "read "}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(nil)
			tt.setup(r)
			r.feed.batch = thenIdle(r, batchOf(1, 3))
			r.poller.OnFailover = func(context.Context) { r.w.record("on failover") }
			if _, err := r.run(t, 4*time.Second); err != nil {
				t.Fatal(err)
			}
			got := before(r.w.log(), "send")
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("events before the first send (-want +got):\n%s", diff)
			}
		})
	}
}

func index(events []string, prefix string) int {
	for i, e := range events {
		if strings.HasPrefix(e, prefix) {
			return i
		}
	}
	return -1
}

// before returns the events before the first with the prefix.
func before(events []string, prefix string) []string {
	if i := index(events, prefix); i >= 0 {
		return events[:i]
	}
	return events
}

// between returns the events from the first with prefix from to the first
// with prefix to after it.
func between(events []string, from, to string) []string {
	rest := events[max(index(events, from), 0):]
	if j := index(rest, to); j >= 0 {
		return rest[:j+1]
	}
	return rest
}

// An invocation that reads more than feed.flood_threshold changes counts one
// flood and warns; LargestBatch carries the changes it read.
func TestFloodDetection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		threshold int
		wantFlood float64
	}{
		{"over the threshold", 250, 1},
		{"at the threshold", 300, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(nil)
			r.feed.batch = thenIdle(r, batchOf(1, 300))
			r.poller.Job.Feed.FloodThreshold = tt.threshold
			var emf bytes.Buffer
			r.poller.Metrics = metrics.New(&emf, map[string]string{"Job": "orders"})
			if _, err := r.run(t, 8*time.Second); err != nil {
				t.Fatal(err)
			}
			var flood, largest float64
			for _, line := range bytes.Split(bytes.TrimSpace(emf.Bytes()), []byte("\n")) {
				var rec map[string]any
				if err := json.Unmarshal(line, &rec); err != nil {
					t.Fatalf("EMF: %v", err)
				}
				for name, into := range map[string]*float64{metrics.FloodBatches: &flood, metrics.LargestBatch: &largest} {
					switch v := rec[name].(type) {
					case float64:
						if name == metrics.FloodBatches {
							*into += v
						} else {
							*into = max(*into, v)
						}
					case []any:
						for _, x := range v {
							*into = max(*into, x.(float64))
						}
					}
				}
			}
			if flood != tt.wantFlood || largest != 300 {
				t.Errorf("FloodBatches %v LargestBatch %v, want %v and 300", flood, largest, tt.wantFlood)
			}
			if warned := strings.Contains(r.logs.String(), "flood detected"); warned != (tt.wantFlood > 0) {
				t.Errorf("flood warning %v, want %v:\n%s", warned, tt.wantFlood > 0, r.logs)
			}
		})
	}
}

// notingLeases records what the poller notes for operators.
type notingLeases struct {
	*fakeLeases
	mu      sync.Mutex
	largest []int64
	authAt  []time.Time
}

func (n *notingLeases) NoteLargestBatch(ctx context.Context, _ string, v int64) error {
	if err := ctx.Err(); err != nil {
		return err // as the DynamoDB client does
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.largest = append(n.largest, v)
	return nil
}

func (n *notingLeases) NoteSourceAuthFailure(_ context.Context, _ string, at time.Time) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.authAt = append(n.authAt, at)
	return nil
}

// The job item learns the largest batch (only when it grew) and when the
// source refused our credentials.
func TestNotesForOperators(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.feed.batch = thenIdle(r, batchOf(1, 300))
	nl := &notingLeases{fakeLeases: r.leases}
	r.poller.Leases = nl
	// The first run is stopped from outside once its batch is queued, as
	// a local run is once idle: the note is written all the same.
	ctx, cancel := context.WithCancel(t.Context())
	r.poller.OnBatch = func(bool) { cancel() }
	if _, err := r.poller.Run(ctx, poll.Invocation{Owner: "me", Host: "host", Deadline: r.w.Now().Add(5 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	r.poller.OnBatch = nil
	r.feed.batch = thenIdle(r, batchOf(301, 400)) // 100: less than 300
	if _, err := r.run(t, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	r.feed.batch = func(int, string) (*feed.Batch, error) {
		return nil, &feed.StatusError{Op: "changes", Status: 401, Reason: "unauthorized"}
	}
	if _, err := r.run(t, 5*time.Second); err == nil {
		t.Fatal("run succeeded against a 401")
	}
	nl.mu.Lock()
	defer nl.mu.Unlock()
	if diff := cmp.Diff([]int64{300}, nl.largest); diff != "" {
		t.Errorf("largest batches noted (-want +got):\n%s", diff)
	}
	if len(nl.authAt) != 1 {
		t.Errorf("auth failures noted %v, want one", nl.authAt)
	}
}
