package poll_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/metrics"
	"github.com/changes-worker/changes-worker/shared/poll"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

// idleRig is a rig whose job has the default schedule and latency
// objective, idle as given, and a feed that has nothing new after seq 0,
// each read taking a second of the clock.
func idleRig(idle string) *rig {
	r := newRig(nil)
	r.poller.Job.Idle = idle
	r.poller.Job.Schedule = config.Duration(config.DefaultSchedule)
	r.poller.Job.LatencyObjective = config.Duration(config.DefaultLatencyObjective)
	r.leases.checkpoint = json.RawMessage("0")
	r.feed.batch = func(_ int, since string) (*feed.Batch, error) {
		r.w.Advance(time.Second)
		return empty(since), nil
	}
	return r
}

// TestIdleSleep: with idle sleep an invocation that finds the feed idle
// ends once it has read it for its idle stay, releasing the lease, and the
// next tick's invocation reads on; with idle watch it reads for its whole
// budget. A busy feed is read for the whole budget in both.
func TestIdleSleep(t *testing.T) {
	t.Parallel()
	const budget = 85 * time.Second // a 90s deadline less its margin
	tests := []struct {
		name    string
		idle    string
		busyFor int // reads that bring a change before the feed goes idle
		// wantEnd bounds when, after its start, the invocation ends.
		wantEndMin, wantEndMax time.Duration
	}{
		{name: "sleep: an idle feed ends the invocation after its stay", idle: config.IdleSleep,
			wantEndMin: config.SleepAllowance, wantEndMax: config.SleepAllowance + 2*time.Second},
		{name: "watch: an idle feed is read for the whole budget", idle: config.IdleWatch,
			wantEndMin: budget - 2*time.Second, wantEndMax: budget + time.Second},
		{name: "sleep: a busy feed is read past the stay, until it goes idle", idle: config.IdleSleep, busyFor: 20,
			wantEndMin: 20 * time.Second, wantEndMax: 23 * time.Second},
		{name: "sleep: a feed busy for the whole budget is read for the whole budget", idle: config.IdleSleep, busyFor: 1000,
			wantEndMin: budget - 2*time.Second, wantEndMax: budget + time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := idleRig(tt.idle)
			r.feed.batch = func(call int, since string) (*feed.Batch, error) {
				r.w.Advance(time.Second)
				if call <= tt.busyFor {
					return batchOf(call, call), nil
				}
				return empty(since), nil
			}
			start := r.w.Now()
			res, err := r.run(t, 90*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			ended := r.w.Now().Sub(start)
			if ended < tt.wantEndMin || ended > tt.wantEndMax {
				t.Errorf("ended %s after its start, want between %s and %s", ended, tt.wantEndMin, tt.wantEndMax)
			}
			if res.Role != "active" || !res.CaughtUp {
				t.Errorf("result %+v, want active and caught up", res)
			}
			events := r.w.log()
			if events[len(events)-1] != "release" {
				t.Errorf("last event %q, want the release", events[len(events)-1])
			}
			if n := min(tt.busyFor, 1000); n > 0 && len(r.sender.docs()) < min(n, 80) {
				t.Errorf("sent %d changes, want every change read", len(r.sender.docs()))
			}
		})
	}
}

// TestIdleSleepNextTickReadsOn: a change made after an idle invocation
// ended is read and queued by the next tick's invocation, which takes the
// released lease as a handoff and checkpoints it.
func TestIdleSleepNextTickReadsOn(t *testing.T) {
	t.Parallel()
	r := idleRig(config.IdleSleep)
	if _, err := r.run(t, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := len(r.sender.docs()); got != 0 {
		t.Fatalf("the idle invocation sent %d changes", got)
	}
	// A change arrives between the ticks.
	r.w.Advance(30 * time.Second)
	r.feed.batch = func(_ int, since string) (*feed.Batch, error) {
		r.w.Advance(time.Second)
		if since == "0" {
			return batchOf(1, 1), nil
		}
		return empty(since), nil
	}
	start := r.w.Now()
	res, err := r.run(t, 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.Takeover != lease.Handoff || res.Generation != 2 {
		t.Errorf("next tick took the lease as %q at generation %d, want a handoff at 2", res.Takeover, res.Generation)
	}
	if got := r.sender.docs(); len(got) != 1 || got[0] != "d001" {
		t.Errorf("next tick sent %v, want d001", got)
	}
	if got := r.leases.stored(); got != "1" {
		t.Errorf("stored checkpoint %q, want 1", got)
	}
	if ended := r.w.Now().Sub(start); ended > config.SleepAllowance+2*time.Second {
		t.Errorf("next tick ran %s, want it to end after its stay once idle again", ended)
	}
}

// TestIdleStandbyAndTakeover: in both modes an invocation that finds the
// lease held stands by and takes over when the holder releases it, and one
// that finds it expired takes over at once as a failover.
func TestIdleStandbyAndTakeover(t *testing.T) {
	t.Parallel()
	for _, idle := range []string{config.IdleWatch, config.IdleSleep} {
		t.Run(idle+" standby", func(t *testing.T) {
			t.Parallel()
			r := idleRig(idle)
			r.leases.holdBy("busy")
			r.leases.freeAfterReads = 3
			res, err := r.run(t, 90*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if res.Role != "active" || res.Takeover != lease.Handoff || res.Generation != 2 {
				t.Errorf("result %+v, want active after a handoff at generation 2", res)
			}
		})
		t.Run(idle+" failover", func(t *testing.T) {
			t.Parallel()
			r := idleRig(idle)
			r.leases.holdBy("crashed")
			r.w.Advance(ttl + time.Second)
			res, err := r.run(t, 90*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if res.Role != "active" || res.Takeover != lease.Failover || res.Generation != 2 {
				t.Errorf("result %+v, want active after a failover at generation 2", res)
			}
		})
	}
}

// TestIdleMetrics: what each mode publishes, and that every alarm on the
// poller's metrics can fire in it. An idle invocation that sleeps publishes
// Role (the lease-holder alarm's) and none of the routine metrics; one that
// watches publishes them all. In both, a stuck invocation publishes the
// pending changes without a checkpoint (the no-progress alarm's) and its
// errors (the poller-errors alarm's); an idle invocation that sleeps still
// publishes its errors when the source refuses it.
func TestIdleMetrics(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		idle     string
		stuck    bool
		refused  bool // the source refuses the poller's credentials
		want     []string
		wantNone []string
	}{
		{name: "sleep, idle", idle: config.IdleSleep, want: []string{metrics.Role},
			wantNone: []string{metrics.LagSeconds, metrics.PendingChanges, metrics.ChangesRead, metrics.LeaseRenewed, metrics.LeaseAcquired, metrics.Checkpoints, metrics.PollerErrors}},
		{name: "watch, idle", idle: config.IdleWatch,
			want: []string{metrics.Role, metrics.LagSeconds, metrics.PendingChanges, metrics.ChangesRead, metrics.LeaseRenewed, metrics.LeaseAcquired}},
		{name: "sleep, stuck", idle: config.IdleSleep, stuck: true, want: []string{metrics.Role, metrics.PendingChanges, metrics.PollerErrors},
			wantNone: []string{metrics.Checkpoints}},
		{name: "watch, stuck", idle: config.IdleWatch, stuck: true, want: []string{metrics.Role, metrics.PendingChanges, metrics.PollerErrors},
			wantNone: []string{metrics.Checkpoints}},
		{name: "sleep, source refusing", idle: config.IdleSleep, refused: true, want: []string{metrics.Role, metrics.PollerErrors},
			wantNone: []string{metrics.LagSeconds, metrics.ChangesRead}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := idleRig(tt.idle)
			var out bytes.Buffer
			r.poller.Metrics = metrics.New(&out, map[string]string{"Job": "orders"})
			if tt.stuck {
				// Changes wait at the source; SQS refuses them.
				r.feed.batch = func(int, string) (*feed.Batch, error) {
					r.w.Advance(time.Second)
					b := batchOf(1, 5)
					b.Pending = 7
					return b, nil
				}
				r.sender.before = func(int) error { return errSQS }
			}
			if tt.refused {
				r.feed.batch = func(int, string) (*feed.Batch, error) {
					return nil, &feed.StatusError{Op: "changes", Status: 401, Reason: "unauthorized"}
				}
			}
			_, err := r.run(t, 90*time.Second)
			if (tt.stuck || tt.refused) != (err != nil) {
				t.Fatalf("Run error = %v", err)
			}
			got := emitted(t, out.String())
			for _, m := range tt.want {
				if _, ok := got[m]; !ok {
					t.Errorf("%s not published; published %v", m, got)
				}
			}
			for _, m := range tt.wantNone {
				if _, ok := got[m]; ok {
					t.Errorf("%s published; want it left out", m)
				}
			}
			if tt.stuck && got[metrics.PendingChanges] < 1 {
				t.Errorf("pending changes published as %v, want above 0", got[metrics.PendingChanges])
			}
			if !tt.stuck && !tt.refused && got[metrics.Role] != 1 {
				t.Errorf("Role published at most %v, want 1 (the lease held)", got[metrics.Role])
			}
			// An idle feed read once a second for 85 s spans two or
			// three minutes: a record at most per minute read, and the
			// invocation's last.
			if n := strings.Count(out.String(), "\n"); tt.idle == config.IdleWatch && !tt.stuck && n > 4 {
				t.Errorf("%d metric records for an idle feed watched for 85 s, want one a minute at most (and the last)", n)
			}
		})
	}
}

// emitted returns the largest value of every metric in EMF records.
func emitted(t *testing.T, records string) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	for _, line := range strings.Split(strings.TrimSpace(records), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("record %q: %v", line, err)
		}
		aws, _ := rec["_aws"].(map[string]any)
		for _, d := range aws["CloudWatchMetrics"].([]any) {
			for _, m := range d.(map[string]any)["Metrics"].([]any) {
				name := m.(map[string]any)["Name"].(string)
				for _, v := range values(rec[name]) {
					if cur, ok := got[name]; !ok || v > cur {
						got[name] = v
					}
				}
			}
		}
	}
	return got
}

func values(v any) []float64 {
	switch x := v.(type) {
	case float64:
		return []float64{x}
	case []any:
		var out []float64
		for _, e := range x {
			if f, ok := e.(float64); ok {
				out = append(out, f)
			}
		}
		return out
	}
	return nil
}

// trickleStream is a stream on which a change arrives every interval until
// n have: Next returns the change due within its wait, moving the clock to
// it, or nothing once the wait is over.
type trickleStream struct {
	w        *world
	interval time.Duration
	n, sent  int
	nextAt   time.Time
}

func (s *trickleStream) Next(_ context.Context, wait time.Duration) (*feed.Batch, error) {
	if s.sent < s.n && !s.nextAt.After(s.w.Now().Add(wait)) {
		s.w.Advance(max(s.nextAt.Sub(s.w.Now()), 0))
		s.sent++
		s.nextAt = s.w.Now().Add(s.interval)
		return streamed(s.sent, s.sent), nil
	}
	s.w.Advance(wait)
	return &feed.Batch{Rows: []feed.Row{}, LastSeq: json.RawMessage(strconv.Itoa(s.sent)), Pending: -1}, nil
}

func (s *trickleStream) Close() error { return nil }

// TestIdleSleepTrickle: with idle sleep, a trickle faster than a long poll
// keeps the invocation reading, whether the feed is read in pages or
// streamed: a read cut short to write a checkpoint held back comes back
// empty, but the feed was not idle for a whole long poll.
func TestIdleSleepTrickle(t *testing.T) {
	t.Parallel()
	r := idleRig(config.IdleSleep)
	s := &trickleStream{w: r.w, interval: 700 * time.Millisecond, n: 30}
	s.nextAt = r.w.Now().Add(s.interval)
	r.poller.OpenStream = func(context.Context, json.RawMessage) (poll.Stream, error) { return s, nil }
	if _, err := r.run(t, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := len(r.sender.docs()); got != 30 {
		t.Errorf("sent %d of the 30 changes of the trickle before ending, want all", got)
	}
}

// TestIdleSleepEndsWithItsStay: the last wait of an idle invocation that
// sleeps ends with its stay, not a long poll after it.
func TestIdleSleepEndsWithItsStay(t *testing.T) {
	t.Parallel()
	r := idleRig(config.IdleSleep)
	// A stay of 5.5 s, which whole-second waits would overshoot.
	r.poller.Job.LatencyObjective = config.Duration(config.DefaultSchedule - 500*time.Millisecond)
	s := &trickleStream{w: r.w}
	r.poller.OpenStream = func(context.Context, json.RawMessage) (poll.Stream, error) { return s, nil }
	start := r.w.Now()
	if _, err := r.run(t, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	stay := r.poller.Job.IdleStay()
	if ended := r.w.Now().Sub(start); ended < stay || ended > stay+100*time.Millisecond {
		t.Errorf("ended %s after its start, want at its stay (%s)", ended, stay)
	}
}
