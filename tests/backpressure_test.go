package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/metrics"
)

// emfValues returns, in order, every value of metric name that the writer
// recorded for output.
func emfValues(t *testing.T, out, output, name string) []float64 {
	t.Helper()
	var vals []float64
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("metrics line is not JSON: %v", err)
		}
		if rec["Output"] != output {
			continue
		}
		switch v := rec[name].(type) {
		case float64:
			vals = append(vals, v)
		case []any:
			for _, x := range v {
				vals = append(vals, x.(float64))
			}
		}
	}
	return vals
}

func sum(vs []float64) float64 {
	var s float64
	for _, v := range vs {
		s += v
	}
	return s
}

// tooManyRequestsFor wraps the HTTP receiver: it answers 429 with
// Retry-After: 1 for d from the first request, counting the refusals in
// refused, then passes requests on.
func tooManyRequestsFor(d time.Duration, refused *atomic.Int32) func(http.Handler) http.Handler {
	var refusing atomic.Bool
	refusing.Store(true)
	var once sync.Once
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			once.Do(func() { time.AfterFunc(d, func() { refusing.Store(false) }) })
			if refusing.Load() {
				refused.Add(1)
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusTooManyRequests)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// An output that answers 429 with Retry-After for longer than its messages'
// receives would last without backpressure: the writer holds them back
// (visibility, then a resend with a fresh receive count), nothing is
// dead-lettered, and everything arrives once the output accepts again.
func TestBackpressureRetryAfterNothingDeadLettered(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	var refused atomic.Int32
	s := newStack(t, stackOptions{
		outputs: []string{"rest"}, maxReceive: 3, rest: func(o *config.Output) { o.Ordering = config.OrderingNone },
		// With a receive count of 3 and the plain transient backoff (2 s,
		// 4 s), every message would reach the DLQ within 8 s.
		wrapRest: tooManyRequestsFor(8*time.Second, &refused),
	})
	s.load(ctx, sample.Options{Docs: 40, Seed: 11})
	sum0 := s.runUntilIdle(ctx, localrun.Options{})

	if d := cmp.Diff(s.sourceState(ctx), s.httpState()); d != "" {
		t.Errorf("receiver (-want +got):\n%s", d)
	}
	st := sum0.Outputs["orders/rest"]
	if st.DeadLettered != 0 || st.Deferred == 0 || refused.Load() == 0 {
		t.Errorf("stats %+v after %d refusals: want deferrals and nothing dead-lettered", st, refused.Load())
	}
	if msgs := receiveAll(t, s, "rest"); len(msgs) != 0 {
		t.Errorf("DLQ holds %d messages, want none", len(msgs))
	}
	out := s.Metrics().String()
	active := emfValues(t, out, "rest", metrics.BackpressureActive)
	if first := slices.Index(active, 1); first < 0 || !slices.Contains(active[first:], 0) {
		t.Errorf("BackpressureActive values %v: want a 1 (paused) followed by a 0 (recovered)", active)
	}
	if n := sum(emfValues(t, out, "rest", metrics.BackpressureDelays)); n != float64(st.Deferred) {
		t.Errorf("BackpressureDelays total %v, want %d (the deferrals)", n, st.Deferred)
	}
	if secs := sum(emfValues(t, out, "rest", metrics.BackpressureDelaySeconds)); secs < float64(st.Deferred) {
		t.Errorf("BackpressureDelaySeconds total %v for %d deferrals of at least 1 s", secs, st.Deferred)
	}
	t.Logf("refused %d requests, deferred %d messages, retried %d", refused.Load(), st.Deferred, st.Retried)
}

// An output whose latency rises far past its baseline and then recovers:
// the writer lowers its parallelism (one request at a time, one receiver)
// while it is slow, returns to normal afterwards, and delivers everything
// with nothing dead-lettered.
func TestBackpressureLatencyRisesAndRecovers(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	const (
		fastFirst = 15  // requests that make the baseline (and a few more)
		slowUntil = 100 // requests after which the output is fast again
		checkFrom = 70  // slow requests from here on start after the tracker reacted, even late on a loaded machine
	)
	// inFlight counts every request; lateInFlight those started from
	// checkFrom on, after the tracker reacted: a slow request started before
	// may still be running beside them, and is not what the lowered
	// parallelism governs.
	var n, inFlight, lateInFlight, peakSlow, peakFast atomic.Int32
	// A slow request takes 600 ms: on a loaded machine the writer measured
	// a baseline of 190-210 ms for the fast ones (its own scheduling, not
	// the output), and with 300 ms a slow request, once the parallelism
	// was lowered, came back under twice that baseline, so the writer
	// raised it again.
	const slowTime = 600 * time.Millisecond
	peak := func(p *atomic.Int32, v int32) {
		for {
			old := p.Load()
			if v <= old || p.CompareAndSwap(old, v) {
				return
			}
		}
	}
	s := newStack(t, stackOptions{
		outputs: []string{"rest"}, maxReceive: 3,
		rest: func(o *config.Output) {
			o.Ordering = config.OrderingNone
			o.Backpressure = config.Backpressure{BaselineRequests: 10, Window: 5}
		},
		wrapRest: func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				i := n.Add(1)
				cur := inFlight.Add(1)
				defer inFlight.Add(-1)
				switch {
				case i > fastFirst && i <= slowUntil:
					if i >= checkFrom {
						peak(&peakSlow, lateInFlight.Add(1))
						defer lateInFlight.Add(-1)
					}
					time.Sleep(slowTime)
				default:
					if i <= fastFirst {
						peak(&peakFast, cur)
					}
					time.Sleep(5 * time.Millisecond)
				}
				next.ServeHTTP(w, r)
			})
		},
	})
	s.load(ctx, sample.Options{Docs: 150, Seed: 5})
	// Two receivers: the bound below counts the batch one of them may have
	// started before the tracker reacted.
	sum0 := s.runUntilIdle(ctx, localrun.Options{Concurrency: 2})

	if d := cmp.Diff(s.sourceState(ctx), s.httpState()); d != "" {
		t.Errorf("receiver (-want +got):\n%s", d)
	}
	st := sum0.Outputs["orders/rest"]
	if st.DeadLettered != 0 {
		t.Errorf("stats %+v: want nothing dead-lettered", st)
	}
	if msgs := receiveAll(t, s, "rest"); len(msgs) != 0 {
		t.Errorf("DLQ holds %d messages, want none", len(msgs))
	}
	if p := peakSlow.Load(); p > 2 {
		t.Errorf("%d requests at once while the output was slow, want at most 2 (one receiver, one request, and a batch started before)", p)
	}
	if p := peakFast.Load(); p < 3 {
		t.Errorf("only %d requests at once before the slowdown: the test does not show a lowered parallelism", p)
	}
	active := emfValues(t, s.Metrics().String(), "rest", metrics.BackpressureActive)
	// Recovered: the writer saw the output slow (a 1) and later back at its
	// baseline (a 0 after it). The last value alone is not the measure: on a
	// loaded machine an ordinary request can take twice the baseline again.
	if first := slices.Index(active, 1); first < 0 || !slices.Contains(active[first:], 0) {
		t.Errorf("BackpressureActive values %v: want a 1 (slow) followed by a 0 (recovered)", active)
	}
	t.Logf("requests %d, peak at once before %d, while slow %d; BackpressureActive %v", n.Load(), peakFast.Load(), peakSlow.Load(), active)
}
