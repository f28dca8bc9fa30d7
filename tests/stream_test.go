package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

// newStreamStack is a stack whose job "orders" reads the created CouchDB-
// compatible database in feed mode mode into one PostgreSQL output.
func newStreamStack(t *testing.T, mode string) *testStack {
	t.Helper()
	cfg := stack.PostgresJob("orders", config.Source{Type: config.SourceCouchDB},
		config.Feed{Limit: 50, Timeout: config.Duration(2 * time.Second), Mode: mode})
	return &testStack{Stack: stack.ForTest(t, stack.Options{Config: cfg}), t: t}
}

// putter returns a function that writes {"v": v} as the document id into
// s's source, as a new revision of the one in revs, which it keeps.
func putter(t *testing.T, s *testStack, revs map[string]string) func(id string, v int) {
	return func(id string, v int) {
		t.Helper()
		body := map[string]any{"v": v}
		if revs[id] != "" {
			body["_rev"] = revs[id]
		}
		rev, err := s.PutDoc(t.Context(), id, body)
		if err != nil {
			t.Fatal(err)
		}
		revs[id] = rev
	}
}

// runOneInvocation runs the pipeline in the background with one poller
// invocation lasting the whole test (a schedule longer than the test), and
// returns the function that stops it.
func runOneInvocation(t *testing.T, deps *pipeline.Deps) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	rt := &localrun.Runtime{Deps: deps, Opts: localrun.Options{Tick: 10 * time.Minute, PollerTimeout: 3 * time.Minute}, Log: deps.Log}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := rt.Run(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("run: %v", err)
		}
	})
	return func() { cancel(); wg.Wait() }
}

// TestStreamPipelineCouchDB: with feed.mode continuous, the poller catches
// up, opens one stream, and inserts, updates and deletes made while that
// stream is open reach PostgreSQL through it: the output ends equal to the
// source, and the invocation never closed or lost its stream meanwhile.
func TestStreamPipelineCouchDB(t *testing.T) {
	parallel(t)
	ctx := t.Context()
	s := newStreamStack(t, config.ModeContinuous)
	revs := map[string]string{}
	put := putter(t, s, revs)
	for i := range 20 {
		put(fmt.Sprintf("before-%02d", i), i)
	}
	started := time.Now()
	stop := runOneInvocation(t, s.Deps)
	defer stop()
	s.Logs().WaitFor(t, `msg="stream opened" job=orders`, 60*time.Second)
	t.Logf("stream opened %s after the start", time.Since(started).Round(time.Millisecond))

	for i := range 30 {
		put(fmt.Sprintf("during-%02d é/ü", i), i)
	}
	for i := range 10 {
		put(fmt.Sprintf("before-%02d", i), 100+i)
		put(fmt.Sprintf("during-%02d é/ü", i), 100+i)
	}
	for _, id := range []string{"before-10", "before-11", "during-20 é/ü", "during-21 é/ü", "during-00 é/ü"} {
		if err := s.DeleteDoc(ctx, id, revs[id]); err != nil {
			t.Fatal(err)
		}
	}
	want := s.sourceState(ctx)
	wrote := time.Now()
	waitEqual(t, want, func() map[string]string { return s.pgState(ctx) })
	t.Logf("the output equals the source %s after the last write", time.Since(wrote).Round(time.Millisecond))

	s.Logs().CheckOneStream(t)
}

// waitEqual waits up to a minute for got() to equal want.
func waitEqual(t *testing.T, want map[string]string, got func() map[string]string) {
	t.Helper()
	var last map[string]string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if last = got(); cmp.Equal(want, last) {
			return
		}
	}
	t.Fatalf("output differs from the source after a minute (-source +output):\n%s", cmp.Diff(want, last))
}

// TestStreamPipelineCutByPageBytes: with fetch bulk_get and a small
// page_bytes, bursts written while the stream is open arrive in stream
// batches whose bodies exceed the budget, so each is cut after a few
// documents; the rows after each cut still reach PostgreSQL (read again
// with pages), and the output ends equal to the source.
func TestStreamPipelineCutByPageBytes(t *testing.T) {
	parallel(t)
	ctx := t.Context()
	cfg := stack.PostgresJob("orders", config.Source{Type: config.SourceCouchDB},
		config.Feed{Limit: 50, Timeout: config.Duration(2 * time.Second), Mode: config.ModeContinuous,
			Fetch: config.FetchBulkGet, PageBytes: 64 << 10})
	s := &testStack{Stack: stack.ForTest(t, stack.Options{Config: cfg}), t: t}
	if _, err := s.PutDoc(ctx, "before", map[string]any{"v": 0}); err != nil {
		t.Fatal(err)
	}
	stop := runOneInvocation(t, s.Deps)
	defer stop()
	s.Logs().WaitFor(t, `msg="stream opened" job=orders`, 60*time.Second)
	pad := strings.Repeat("x", 16<<10)
	for burst := range 3 {
		docs := make([]map[string]any, 0, 30)
		for i := range 30 {
			docs = append(docs, map[string]any{"_id": fmt.Sprintf("b%d-%02d", burst, i), "pad": pad})
		}
		body, err := json.Marshal(map[string]any{"docs": docs})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post(s.SourceURL+"/_bulk_docs", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("_bulk_docs: status %d", resp.StatusCode)
		}
		time.Sleep(2 * time.Second)
	}
	waitEqual(t, s.sourceState(ctx), func() map[string]string { return s.pgState(ctx) })
	if logs := s.Logs().String(); !strings.Contains(logs, `msg="page cut short" job=orders`) || !strings.Contains(logs, "reason=\"page_bytes: the bodies fetched") {
		t.Errorf("no batch was cut by page_bytes: the test did not test the cut")
	}
}

// TestStreamPipelineEventSourceRefused: pouchdb-server answers
// feed=eventsource with an ordinary JSON answer, so a job in that mode
// catches up in pages (the changes queued and checkpointed), then its
// invocation ends with ErrModeUnsupported naming the mode.
func TestStreamPipelineEventSourceRefused(t *testing.T) {
	parallel(t)
	ctx := t.Context()
	s := newStreamStack(t, config.ModeEventSource)
	for i := range 5 {
		if _, err := s.PutDoc(ctx, fmt.Sprintf("d%d", i), map[string]any{"v": i}); err != nil {
			t.Fatal(err)
		}
	}
	ictx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	res, err := s.Deps.HandleSchedule(ictx, pipeline.ScheduleEvent{Job: "orders"})
	if !errors.Is(err, feed.ErrModeUnsupported) || !strings.Contains(err.Error(), "feed=eventsource") {
		t.Fatalf("HandleSchedule error %v, want ErrModeUnsupported naming feed=eventsource", err)
	}
	if res.Enqueued != 5 || string(res.Checkpoint) != "5" {
		t.Errorf("result %+v, want the 5 changes queued and checkpoint 5 before the refusal", res)
	}
	t.Logf("refusal: %v", err)
}

// TestStreamPipelineDropped: the first streams are cut by a proxy between
// the poller and pouchdb-server while documents are written, updated and
// deleted; each time the poller goes back to pages from its checkpoint and
// opens a new stream, and the output ends equal to the source.
func TestStreamPipelineDropped(t *testing.T) {
	parallel(t)
	ctx := t.Context()
	s := newStreamStack(t, config.ModeContinuous)
	cutter := newStreamCutter(t, s.SourceURL, 3, 1500*time.Millisecond)
	// Point the job at the proxy before its poller is built.
	s.Config.Jobs[0].Source.URL = cutter.url
	revs := map[string]string{}
	put := putter(t, s, revs)
	put("before", 0)
	stop := runOneInvocation(t, s.Deps)
	defer stop()
	s.Logs().WaitFor(t, `msg="stream opened" job=orders`, 60*time.Second)
	for i := range 80 {
		id := fmt.Sprintf("d%02d", i%40)
		put(id, i)
		if i%10 == 9 {
			if err := s.DeleteDoc(ctx, id, revs[id]); err != nil {
				t.Fatal(err)
			}
			delete(revs, id)
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitEqual(t, s.sourceState(ctx), func() map[string]string { return s.pgState(ctx) })

	logs := s.Logs().String()
	if n := cutter.cut.Load(); n < 2 {
		t.Fatalf("the proxy cut %d streams while documents were written, want at least 2", n)
	}
	if n := strings.Count(logs, `msg="stream ended; catching up with pages"`); n < 2 {
		t.Errorf("%d streams ended in the log, want at least 2", n)
	}
	if n := strings.Count(logs, `msg="stream opened"`); n < 3 {
		t.Errorf("%d streams opened, want at least 3 (the first and one after each cut)", n)
	}
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, `msg="stream ended`) {
			t.Log(l[strings.Index(l, "error="):])
		}
	}
}

// streamCutter is a proxy to a source that cuts its first n streaming
// answers a while after their headers.
type streamCutter struct {
	url string
	cut atomic.Int64
}

func newStreamCutter(t *testing.T, db string, n int64, after time.Duration) *streamCutter {
	t.Helper()
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	base := *u
	base.Path = ""
	rp := httputil.NewSingleHostReverseProxy(&base)
	rp.FlushInterval = -1
	c := &streamCutter{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("feed") != config.ModeContinuous || c.cut.Add(1) > n {
			rp.ServeHTTP(w, r)
			return
		}
		cutAfter(w, r, base.Host, after)
	}))
	t.Cleanup(srv.Close)
	c.url = srv.URL + u.Path
	return c
}

// cutAfter forwards r to host and relays the answer as it comes, then
// breaks the connection once after has passed since the headers.
func cutAfter(w http.ResponseWriter, r *http.Request, host string, after time.Duration) {
	out := r.Clone(r.Context())
	out.URL.Scheme, out.URL.Host, out.RequestURI = "http", host, ""
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	timer := time.AfterFunc(after, func() { resp.Body.Close() })
	defer timer.Stop()
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			_, _ = w.Write(buf[:n])
			_ = rc.Flush()
		}
		if err != nil {
			panic(http.ErrAbortHandler) // the client sees the stream break
		}
	}
}
