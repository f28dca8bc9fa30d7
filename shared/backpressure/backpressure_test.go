package backpressure

import (
	"errors"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/deliver"
)

func feed(t *Tracker, d time.Duration, n int) {
	for range n {
		t.Observe(d, nil)
	}
}

func TestLatency(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		baseline   time.Duration
		latest     time.Duration
		threshold  float64
		wantActive bool
		wantLimit  int // of 8
	}{
		{"normal", 10 * time.Millisecond, 12 * time.Millisecond, 0, false, 8},
		{"at threshold is not over", 10 * time.Millisecond, 20 * time.Millisecond, 0, false, 8},
		{"past default threshold", 10 * time.Millisecond, 40 * time.Millisecond, 0, true, 2},
		{"past configured threshold", 10 * time.Millisecond, 40 * time.Millisecond, 5, false, 8},
		{"far past: one at a time", 10 * time.Millisecond, time.Second, 0, true, 1},
		{"past threshold by less than the minimum increase", time.Millisecond, 5 * time.Millisecond, 0, false, 8},
		{"past threshold by the minimum increase", time.Millisecond, 11 * time.Millisecond, 0, true, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tr := New(Settings{Threshold: tc.threshold, BaselineRequests: 5, Window: 4}, clock.NewManual(time.Unix(0, 0)).Now)
			feed(tr, tc.baseline, 5)
			if st := tr.State(); st.Active || st.Baseline != tc.baseline {
				t.Fatalf("after baseline: %+v", st)
			}
			feed(tr, tc.latest, 4)
			st := tr.State()
			if st.Active != tc.wantActive {
				t.Fatalf("active = %v, want %v (%+v)", st.Active, tc.wantActive, st)
			}
			if got := tr.Limit(8); got != tc.wantLimit {
				t.Fatalf("Limit(8) = %d, want %d", got, tc.wantLimit)
			}
			if d := tr.Delay(1); (d > 0) != tc.wantActive {
				t.Fatalf("Delay = %v with active %v", d, tc.wantActive)
			}
		})
	}
}

func TestNoAdviceBeforeBaseline(t *testing.T) {
	t.Parallel()
	tr := New(Settings{BaselineRequests: 10}, clock.NewManual(time.Unix(0, 0)).Now)
	feed(tr, time.Millisecond, 8)
	feed(tr, time.Hour, 1)
	if st := tr.State(); st.Active || st.Baseline != 0 {
		t.Fatalf("state before baseline: %+v", st)
	}
}

func TestRecoversWhenLatencyReturns(t *testing.T) {
	t.Parallel()
	tr := New(Settings{BaselineRequests: 3, Window: 3}, clock.NewManual(time.Unix(0, 0)).Now)
	feed(tr, 10*time.Millisecond, 3)
	feed(tr, 50*time.Millisecond, 3)
	if !tr.State().Active {
		t.Fatal("not active after slow requests")
	}
	feed(tr, 11*time.Millisecond, 2)
	if !tr.State().Active {
		t.Fatal("recovered before the window turned over") // avg (50+11+11)/3 = 24ms > 20ms
	}
	feed(tr, 11*time.Millisecond, 1)
	if st := tr.State(); st.Active || tr.Limit(4) != 4 || tr.Delay(3) != 0 {
		t.Fatalf("still active after latency returned: %+v", st)
	}
}

// TestHysteresis: an output becomes slow past the threshold and stays slow
// until its average is back under halfway between the baseline and the
// threshold, so an average hovering at the threshold does not switch the
// parallelism back and forth at every request.
func TestHysteresis(t *testing.T) {
	t.Parallel()
	tr := New(Settings{BaselineRequests: 2, Window: 2}, clock.NewManual(time.Unix(0, 0)).Now)
	feed(tr, 20*time.Millisecond, 2) // baseline 20 ms: slow past 40, back under 30
	for i, step := range []struct {
		latency    time.Duration
		wantActive bool
	}{
		{38 * time.Millisecond, false}, // average 38 ms: under the threshold
		{44 * time.Millisecond, true},  // 41 ms: slow
		{38 * time.Millisecond, true},  // 41 ms
		{36 * time.Millisecond, true},  // 37 ms: under the threshold, still slow
		{44 * time.Millisecond, true},  // 40 ms
		{32 * time.Millisecond, true},  // 38 ms
		{30 * time.Millisecond, true},  // 31 ms
		{28 * time.Millisecond, false}, // 29 ms: back under halfway
		{38 * time.Millisecond, false}, // 33 ms: under the threshold
	} {
		tr.Observe(step.latency, nil)
		if st := tr.State(); st.Active != step.wantActive {
			t.Errorf("step %d (%s): active %v (ratio %.2f), want %v", i+1, step.latency, st.Active, st.Ratio, step.wantActive)
		}
	}
}

func TestPauseFromTheOutput(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(time.Unix(0, 0))
	tr := New(Settings{}, clk.Now)
	tr.Observe(time.Millisecond, &deliver.Error{Class: deliver.Transient, Backpressure: true, RetryAfter: 7 * time.Second})
	if st := tr.State(); !st.Active || st.Paused != 7*time.Second {
		t.Fatalf("after 429 Retry-After 7: %+v", st)
	}
	if tr.Limit(8) != 1 || tr.Delay(1) != 7*time.Second {
		t.Fatalf("limit %d delay %v while paused", tr.Limit(8), tr.Delay(1))
	}
	// A shorter signal does not shorten the pause.
	tr.Pause(time.Second)
	clk.Advance(6 * time.Second)
	if d := tr.Delay(1); d != time.Second {
		t.Fatalf("delay after 6s = %v, want 1s", d)
	}
	clk.Advance(time.Second)
	if st := tr.State(); st.Active {
		t.Fatalf("still paused after Retry-After: %+v", st)
	}
	// Without Retry-After: the default pause; a huge one is capped.
	tr.Observe(0, &deliver.Error{Backpressure: true})
	if st := tr.State(); st.Paused != DefaultPause {
		t.Fatalf("pause without Retry-After = %v", st.Paused)
	}
	tr.Pause(24 * time.Hour)
	if st := tr.State(); st.Paused != MaxPause {
		t.Fatalf("pause of a day = %v, want %v", st.Paused, MaxPause)
	}
}

func TestFailuresDoNotMoveTheAverage(t *testing.T) {
	t.Parallel()
	tr := New(Settings{BaselineRequests: 2, Window: 2}, clock.NewManual(time.Unix(0, 0)).Now)
	for range 5 {
		tr.Observe(time.Minute, errors.New("connection refused"))
	}
	feed(tr, 10*time.Millisecond, 2)
	tr.Observe(time.Minute, deliver.TransientError("timeout", errors.New("deadline")))
	if st := tr.State(); st.Active || st.Baseline != 10*time.Millisecond {
		t.Fatalf("failed requests counted: %+v", st)
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"3", 3 * time.Second},
		{"0", 0},
		{"-1", 0},
		{"soon", 0},
		{now.Add(90 * time.Second).Format(httpDate), 90 * time.Second},
		{now.Add(-time.Minute).Format(httpDate), 0},
		// An output cannot have a message held longer than MaxPause.
		{"300", 5 * time.Minute},
		{"301", 5 * time.Minute},
		{"999999999", 5 * time.Minute},
		{"99999999999999999", 5 * time.Minute},
		{now.Add(48 * time.Hour).Format(httpDate), 5 * time.Minute},
	}
	for _, tc := range tests {
		if got := deliver.ParseRetryAfter(tc.in, now); got != tc.want {
			t.Errorf("ParseRetryAfter(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

const httpDate = "Mon, 02 Jan 2006 15:04:05 GMT"
