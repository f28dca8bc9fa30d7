// Package backpressure decides when an output is struggling and how much the
// writer should slow down for it. A Tracker learns the output's normal
// request latency from its first requests (the baseline), keeps a rolling
// average of the latest ones, and is active from when that average is above
// a threshold times the baseline and at least a minimum increase above it
// until it is back under halfway between the two (or within half the
// minimum increase), and while the output itself asked for a pause (HTTP 429
// or 503 with Retry-After, PostgreSQL too_many_connections).
package backpressure

import (
	"errors"
	"sync"
	"time"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
)

// Defaults of Settings: an output's defaults in the configuration.
const (
	DefaultThreshold        = config.DefaultBackpressureThreshold
	DefaultBaselineRequests = config.DefaultBackpressureBaseline
	DefaultWindow           = config.DefaultBackpressureWindow
	// DefaultMinIncrease is the least rise over the baseline that counts as
	// slow (see config.DefaultBackpressureMinIncrease for why).
	DefaultMinIncrease = config.DefaultBackpressureMinIncrease
	// DefaultPause is how long an output that signalled backpressure without
	// a Retry-After is left alone.
	DefaultPause = 5 * time.Second
	// MaxPause bounds any pause, as deliver.ParseRetryAfter bounds a
	// Retry-After.
	MaxPause = deliver.MaxRetryAfter
)

// Settings tune a Tracker; zero fields take the defaults.
type Settings struct {
	// Threshold is the ratio of rolling average to baseline latency above
	// which the tracker is active.
	Threshold float64
	// BaselineRequests is how many first successful requests make the
	// baseline.
	BaselineRequests int
	// Window is how many latest requests the rolling average covers.
	Window int
	// MinIncrease is how far above the baseline the rolling average must
	// also be for the tracker to be active.
	MinIncrease time.Duration
}

func (s Settings) withDefaults() Settings {
	if s.Threshold <= 1 {
		s.Threshold = DefaultThreshold
	}
	if s.BaselineRequests < 1 {
		s.BaselineRequests = DefaultBaselineRequests
	}
	if s.Window < 1 {
		s.Window = DefaultWindow
	}
	if s.MinIncrease <= 0 {
		s.MinIncrease = DefaultMinIncrease
	}
	return s
}

// Tracker follows one output. Safe for concurrent use; it satisfies
// deliver.Pacer.
type Tracker struct {
	set Settings
	now clock.Clock

	mu       sync.Mutex
	baseSum  time.Duration
	baseN    int
	baseline time.Duration
	window   []time.Duration
	next     int
	slow     bool      // the rolling average said slow at the last State
	until    time.Time // paused by the output's own signal until then
}

var _ deliver.Pacer = (*Tracker)(nil)

// New returns a tracker with settings s reading time from now (the zero
// Clock is the system clock).
func New(s Settings, now clock.Clock) *Tracker {
	return &Tracker{set: s.withDefaults(), now: now}
}

// Observe records one request: its latency feeds the baseline and the
// rolling average when it succeeded or failed for a reason of its own; a
// backpressure failure pauses the tracker for its Retry-After (or
// DefaultPause) instead.
func (t *Tracker) Observe(d time.Duration, err error) {
	var de *deliver.Error
	if errors.As(err, &de) && de.Backpressure {
		t.Pause(de.RetryAfter)
		return
	}
	if err != nil {
		// A failed request's time (a refused connection, a timeout) says
		// nothing about how fast the output serves.
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.baseN < t.set.BaselineRequests {
		t.baseSum += d
		t.baseN++
		if t.baseN == t.set.BaselineRequests {
			t.baseline = t.baseSum / time.Duration(t.baseN)
		}
		return
	}
	if len(t.window) < t.set.Window {
		t.window = append(t.window, d)
		return
	}
	t.window[t.next] = d
	t.next = (t.next + 1) % len(t.window)
}

// Pause makes the tracker active for d (DefaultPause when d is zero, at most
// MaxPause), or longer if it already is.
func (t *Tracker) Pause(d time.Duration) {
	if d <= 0 {
		d = DefaultPause
	}
	d = min(d, MaxPause)
	t.mu.Lock()
	defer t.mu.Unlock()
	if u := t.now.Now().Add(d); u.After(t.until) {
		t.until = u
	}
}

// State is what the tracker currently advises.
type State struct {
	Active   bool
	Paused   time.Duration // left of a pause the output asked for; 0 when none
	Ratio    float64       // rolling average / baseline; 0 before the baseline
	Baseline time.Duration
}

// State returns the current advice.
func (t *Tracker) State() State {
	t.mu.Lock()
	defer t.mu.Unlock()
	var st State
	st.Baseline = t.baseline
	if left := t.until.Sub(t.now.Now()); left > 0 {
		st.Paused = left
		st.Active = true
	}
	if t.baseline > 0 && len(t.window) > 0 {
		var sum time.Duration
		for _, d := range t.window {
			sum += d
		}
		avg := sum / time.Duration(len(t.window))
		st.Ratio = float64(avg) / float64(t.baseline)
		slow := st.Ratio > t.set.Threshold && avg-t.baseline >= t.set.MinIncrease
		if t.slow && !slow {
			// Once slow, the output stays so until its average is back under
			// halfway between the baseline and the threshold, or within half
			// the minimum increase of the baseline: an average hovering at
			// the threshold does not switch the parallelism at every request.
			slow = st.Ratio > 1+(t.set.Threshold-1)/2 && avg-t.baseline >= t.set.MinIncrease/2
		}
		t.slow = slow
		st.Active = st.Active || slow
	}
	return st
}

// Limit returns the parallelism for a maximum of max: max when inactive, 1
// while paused, and max divided by the latency ratio (at least 1) while the
// output is slow.
func (t *Tracker) Limit(max int) int {
	st := t.State()
	switch {
	case !st.Active:
		return max
	case st.Paused > 0:
		return 1
	default:
		return clamp(int(float64(max)/st.Ratio), 1, max)
	}
}

// Delay is how long a message that failed while the tracker is active
// should stay invisible: what is left of a pause, or (ratio - 1) baselines
// per attempt while slow, at least a second; zero when inactive.
func (t *Tracker) Delay(attempts int) time.Duration {
	st := t.State()
	if !st.Active {
		return 0
	}
	d := st.Paused
	if slow := time.Duration((st.Ratio - 1) * float64(st.Baseline) * float64(max(attempts, 1))); slow > d {
		d = slow
	}
	return clamp(d, time.Second, MaxPause)
}

func clamp[T int | time.Duration](v, lo, hi T) T {
	return max(lo, min(v, hi))
}
