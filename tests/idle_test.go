package tests

import (
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/poll"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
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
	pair := s.runPollerPair(ctx, p, func(int) time.Duration { return budget })
	results, took := pair.results, pair.took
	if results[0].Role != "active" || results[0].Enqueued != 20 {
		t.Errorf("first invocation %+v, want active with 20 changes queued", results[0])
	}
	if results[1].Role != "active" || results[1].Takeover != lease.Handoff || results[1].Enqueued != 0 {
		t.Errorf("second invocation %+v, want a standby that took the lease as a handoff, with nothing to queue", results[1])
	}
	// The first ends after its stay and a read or two more, well within
	// its budget; the second as soon as a read after the handoff finds
	// nothing, its stay being over by then. Each bound lies halfway to the
	// budget: a local service's slow answer is not a run to the budget.
	if d := took[0]; d < stay || d > (stay+budget)/2 {
		t.Errorf("first invocation ran %s, want its idle stay (%s) and a read or two, not its budget (%s)", d.Round(time.Millisecond), stay, budget)
	}
	if d := took[1]; d > (took[0]+budget)/2 {
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

// TestUntilIdleOutlastsAFailedInvocation: a run until idle tries a failed
// poller invocation again at the next tick, as the schedule does on Lambda.
// With the source's first read refused, every document still arrives and
// the run ends idle; with every read refused, the run ends with an error
// once three invocations in a row failed, well before its own deadline.
func TestUntilIdleOutlastsAFailedInvocation(t *testing.T) {
	parallel(t)
	for _, tc := range []struct {
		name   string
		refuse int64
	}{
		{"the first read refused", 1},
		{"every read refused", math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			target, err := url.Parse(testenv.CouchBaseURL())
			if err != nil {
				t.Fatal(err)
			}
			proxy := httputil.NewSingleHostReverseProxy(target)
			var reads atomic.Int64
			src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.HasSuffix(r.URL.Path, "/_changes") && reads.Add(1) <= tc.refuse {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusNotFound)
					io.WriteString(w, `{"error":"not_found","reason":"refused by the test"}`)
					return
				}
				proxy.ServeHTTP(w, r)
			}))
			t.Cleanup(src.Close)
			s := stack.ForTest(t, stack.Options{SourceBase: src.URL, Config: &config.File{
				Stack: config.Stack{PollerTimeout: config.Duration(15 * time.Second), WriterTimeout: config.Duration(10 * time.Second)},
				Jobs: []*config.Job{{ID: "orders",
					Feed: config.Feed{Limit: 50, Timeout: config.Duration(2 * time.Second)}, Lease: config.Lease{TTL: config.Duration(6 * time.Second)},
					Outputs: []*config.Output{{ID: "archive", Type: config.OutputS3, S3: &config.S3Output{}}}}},
			}})
			if _, err := sample.Load(ctx, http.DefaultClient, s.SourceURL, sample.Options{Docs: 20, Seed: 9}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err = s.RunUntilIdle(ctx, localrun.Options{Tick: time.Second})
			took := time.Since(start)
			if tc.refuse == 1 {
				if err != nil {
					t.Fatalf("run after one refused read: %v", err)
				}
				want, err := s.SourceWinners(ctx)
				if err != nil {
					t.Fatal(err)
				}
				got, err := s.Revs(ctx, "orders", "archive")
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("archive after one refused read (-source +output):\n%s", diff)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "3 poller invocations in a row failed") || !strings.Contains(err.Error(), "404") {
				t.Fatalf("run with every read refused: %v; want an error saying 3 invocations in a row failed with the source's 404", err)
			}
			if took > 2*time.Minute {
				t.Errorf("run with every read refused ended after %s, want it to give up after three invocations", took.Round(time.Second))
			}
			t.Logf("gave up after %s: %v", took.Round(time.Millisecond), err)
		})
	}
}
