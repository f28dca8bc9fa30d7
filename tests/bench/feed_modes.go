package main

// feed-modes: each feed mode of each local source, side by side in one run:
// end-to-end latency from a source write to the row in PostgreSQL, and the
// HTTP requests the poller sends the source per 1,000 changes.
//
// For every (source, mode) a fresh database and an isolated stack (the real
// local runtime: poller on its 1m schedule with poller_timeout 90s, feed
// timeout 10s, include_docs, lease TTL 10s, two writer loops) start; the
// poller reads the source through a reverse proxy that counts requests by
// kind. After a warm-up document has arrived (and, in a streaming mode, the
// stream has opened), modeDocs documents are written modeInterval apart and
// a watcher queries the table every 10 ms; a document's latency runs from
// just before its PUT to the query that first returned its row. Requests are
// counted from the first timed write until the last row arrived. The runs
// are sequential, each within one poller invocation.
//
// Sources: pouchdb-server (longpoll, continuous; it has no eventsource
// feed) and a Sync Gateway 3.1.0 started here (longpoll, continuous,
// websocket) read as a user whose channel is "*".

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/metrics"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

const (
	modeDocs     = 200
	modeInterval = 100 * time.Millisecond // 10 writes a second
	modeDrain    = time.Minute
	// modePasswordEnv holds the Sync Gateway user's password for the
	// stacks' jobs (resolved from the environment).
	modePasswordEnv = "BENCH_SG_PASSWORD"
)

func init() { register("feed-modes", feedModes) }

// modeSource is one database to read: through the proxy at read, written
// at write.
type modeSource struct {
	kind  string // config source type
	read  string // database URL the poller reads (the proxy's)
	write string // database URL documents are written to
	auth  *config.Auth
	proxy *countingProxy
}

// modeFigures is what one (source, mode) measured.
type modeFigures struct {
	label           string
	p50, p95, max   float64 // ms
	changes, bodies float64 // requests per 1,000 changes
	streams         int64   // streams opened over the whole run
	total           int64   // requests to the source over the whole run
	queuedP95       float64 // ms from the poller's enqueue to the delivery
	checkpoints     float64 // checkpoint writes over the whole run
}

func feedModes(ctx context.Context, r *results) error {
	var all []modeFigures
	for _, mode := range []string{config.ModeLongpoll, config.ModeContinuous} {
		src, done, err := couchModeSource(ctx)
		if err != nil {
			return err
		}
		f, err := modeRun(ctx, r, "pouchdb-server "+mode, src, mode)
		done()
		if err != nil {
			return err
		}
		all = append(all, f)
	}
	r.add("pouchdb-server eventsource", "not offered", "pouchdb-server answers feed=eventsource with a JSON page; the poller refuses it (ErrModeUnsupported)")

	sg, err := testenv.NewSyncGateway(ctx, testenv.SyncGatewayOptions{})
	if err != nil {
		return fmt.Errorf("start sync gateway: %w", err)
	}
	defer sg.Close()
	os.Setenv(modePasswordEnv, "benchpw")
	for i, mode := range []string{config.ModeLongpoll, config.ModeContinuous, config.ModeWebSocket} {
		src, done, err := sgModeSource(ctx, sg, fmt.Sprintf("bench_modes_%d_%d", time.Now().Unix(), i))
		if err != nil {
			return err
		}
		f, err := modeRun(ctx, r, "sync_gateway "+mode, src, mode)
		done()
		if err != nil {
			return err
		}
		all = append(all, f)
	}
	fmt.Printf("  %-28s %7s %7s %7s %9s %12s %9s %8s %8s %12s\n", "source, mode", "p50 ms", "p95 ms", "max ms", "SQS p95", "_changes/1k", "other/1k", "streams", "run req", "checkpoints")
	for _, f := range all {
		fmt.Printf("  %-28s %7.0f %7.0f %7.0f %9.0f %12.1f %9.1f %8d %8d %12.0f\n", f.label, f.p50, f.p95, f.max, f.queuedP95, f.changes, f.bodies, f.streams, f.total, f.checkpoints)
	}
	fmt.Printf("  (/1k: requests per 1,000 changes while the %d documents were written and delivered; streams and run req: over the whole run, warm-up and catch-up included; SQS p95: enqueue to delivery; checkpoints: writes over the whole run)\n", modeDocs)
	return nil
}

// couchModeSource creates a pouchdb-server database behind a counting
// proxy; done removes both.
func couchModeSource(ctx context.Context) (*modeSource, func(), error) {
	base := testenv.CouchBaseURL()
	name := testenv.UniqueName("bench-modes")
	if err := sample.CreateDB(ctx, coreSourceClient, base+"/"+name); err != nil {
		return nil, nil, fmt.Errorf("create source database (start the local services with `make up`): %w", err)
	}
	p, err := newCountingProxy(base)
	if err != nil {
		return nil, nil, err
	}
	done := func() {
		p.srv.Close()
		req, _ := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodDelete, base+"/"+name, nil)
		if resp, err := coreSourceClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	return &modeSource{kind: config.SourceCouchDB, read: p.srv.URL + "/" + name, write: base + "/" + name, proxy: p}, done, nil
}

// sgModeSource creates a Sync Gateway database and a user "bench" who sees
// every document (channel "*"), behind a counting proxy; done closes the
// proxy (Sync Gateway databases live until the server stops).
func sgModeSource(ctx context.Context, sg *testenv.SyncGateway, name string) (*modeSource, func(), error) {
	admin := sg.AdminURL + "/" + name
	dbConfig := map[string]any{"server": "walrus:", "bucket": name, "num_index_replicas": 0,
		"enable_shared_bucket_access": false, "sync": testenv.DefaultSyncFunction}
	if err := sgAdmin(ctx, sg, http.MethodPut, admin+"/", dbConfig); err != nil {
		return nil, nil, err
	}
	if err := sgAdmin(ctx, sg, http.MethodPut, admin+"/_user/bench", map[string]any{"name": "bench", "password": "benchpw", "admin_channels": []string{"*"}}); err != nil {
		return nil, nil, err
	}
	p, err := newCountingProxy(sg.PublicURL)
	if err != nil {
		return nil, nil, err
	}
	auth := &config.Auth{Type: "basic", Username: "bench", Password: &config.SecretRef{Env: modePasswordEnv}}
	return &modeSource{kind: config.SourceSyncGateway, read: p.srv.URL + "/" + name, write: admin, auth: auth, proxy: p}, p.srv.Close, nil
}

// sgAdmin sends one request to Sync Gateway's admin interface.
func sgAdmin(ctx context.Context, sg *testenv.SyncGateway, method, u string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("encode admin request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, strings.NewReader(string(b)))
	if err != nil {
		return fmt.Errorf("build admin request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := sg.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("sync gateway admin %s: %w", method, err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("sync gateway admin %s %s: status %d", method, u, resp.StatusCode)
	}
	return nil
}

// modeRun measures one mode on one source and records its figures.
func modeRun(ctx context.Context, r *results, label string, src *modeSource, mode string) (modeFigures, error) {
	fig := modeFigures{label: label}
	st, err := stack.New(ctx, stack.Options{Name: "bench-fm", Config: modeConfig(src, mode)})
	if err != nil {
		return fig, err
	}
	defer coreClose(ctx, st)
	table, _, err := st.PostgresTables("bench", "pg")
	if err != nil {
		return fig, err
	}
	pool, err := coreOpenPool(ctx, 2)
	if err != nil {
		return fig, err
	}
	defer pool.Close()

	rctx, stop := context.WithCancel(ctx)
	defer stop()
	rt := &localrun.Runtime{Deps: st.Deps, Log: st.Deps.Log}
	run := &coreRunState{done: make(chan struct{})}
	go func() { run.err = rt.Run(rctx); close(run.done) }()
	defer func() { stop(); <-run.done }()

	w := &coreRowWatcher{pool: pool, table: table, source: src.write, sent: map[string]time.Time{}, seen: map[string]time.Time{}}
	go w.run(rctx)
	if err := modeWarmUp(ctx, st, w, run, mode); err != nil {
		return fig, fmt.Errorf("%s: %w", label, err)
	}
	before := src.proxy.snapshot()
	tick := time.NewTicker(modeInterval)
	defer tick.Stop()
	for i := range modeDocs {
		if err := w.write(ctx, fmt.Sprintf("m-%04d", i), i+1); err != nil {
			return fig, err
		}
		select {
		case <-ctx.Done():
			return fig, ctx.Err()
		case <-run.done:
			return fig, run.stopped()
		case <-tick.C:
		}
	}
	if err := w.wait(ctx, run, modeDrain); err != nil {
		return fig, fmt.Errorf("%s: %w", label, err)
	}
	used := src.proxy.snapshot().minus(before)
	lat, _ := w.latencies(time.Now(), time.Second)
	var xs []float64
	for _, d := range lat {
		xs = append(xs, coreMillis(d))
	}
	fig.p50, fig.p95, fig.max = percentile(xs, 50), percentile(xs, 95), percentile(xs, 100)
	per := 1000 / float64(modeDocs)
	whole := src.proxy.snapshot()
	fig.changes, fig.bodies, fig.streams = float64(used.changes+used.streams)*per, float64(used.other)*per, whole.streams
	fig.total = whole.changes + whole.streams + whole.other
	r.add(label+" p50 ms", fig.p50, fmt.Sprintf("%d writes, %d a second; load average %s", len(xs), time.Second/modeInterval, loadAverage()))
	r.add(label+" p95 ms", fig.p95, "")
	// The writer's EndToEndLatency metric runs from the poller's enqueue to
	// the delivery: the part of the latency that is not the source's or the
	// poller's.
	queued := emfValues(st.Metrics().String(), "EndToEndLatency")
	fig.queuedP95 = percentile(queued, 95)
	r.add(label+" enqueue to delivery p95 ms", fig.queuedP95, fmt.Sprintf("the writer's EndToEndLatency metric; p50 %.0f ms, max %.0f ms", percentile(queued, 50), percentile(queued, 100)))
	checkpoints := 0.0
	for _, v := range emfValues(st.Metrics().String(), metrics.Checkpoints) {
		checkpoints += v
	}
	fig.checkpoints = checkpoints
	r.add(label+" checkpoint writes", checkpoints, fmt.Sprintf("over the whole run, for %d changes", modeDocs+1))
	r.add(label+" _changes requests per 1k changes", fig.changes, fmt.Sprintf("%d long polls, %d streams opened in the window", used.changes, used.streams))
	r.add(label+" other source requests per 1k changes", fig.bodies, "bodies come with include_docs; these are document GETs and the rest")
	if lines := logLines(st.Logs().String(), time.Time{}, 0, 0); len(lines) > 0 {
		fmt.Printf("  pipeline warnings and errors:\n")
		for _, l := range lines {
			fmt.Printf("    %s\n", l)
		}
	}
	return fig, nil
}

// modeConfig is the job of a feed-modes run.
func modeConfig(src *modeSource, mode string) *config.File {
	return &config.File{
		Stack: config.Stack{PollerTimeout: config.Duration(90 * time.Second), WriterTimeout: config.Duration(30 * time.Second)},
		Jobs: []*config.Job{{
			ID:     "bench",
			Source: config.Source{Type: src.kind, URL: src.read, Auth: src.auth},
			Feed:   config.Feed{Limit: 500, Timeout: config.Duration(10 * time.Second), Fetch: config.FetchIncludeDocs, Mode: mode},
			Lease:  config.Lease{TTL: config.Duration(10 * time.Second)},
			Outputs: []*config.Output{{ID: "pg", Type: config.OutputPostgres, Ordering: config.OrderingNone,
				Postgres: &config.PostgresOutput{CreateTables: true}}},
		}},
	}
}

// modeWarmUp writes one document and waits for its row (the writer creates
// the table with it) and, in a streaming mode, for the stream to open.
func modeWarmUp(ctx context.Context, st *stack.Stack, w *coreRowWatcher, run *coreRunState, mode string) error {
	if err := w.write(ctx, "warmup", 0); err != nil {
		return err
	}
	if err := w.wait(ctx, run, 90*time.Second); err != nil {
		return fmt.Errorf("warm-up document: %w", err)
	}
	w.reset()
	if mode == config.ModeLongpoll {
		return nil
	}
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(st.Logs().String(), `msg="stream opened"`); {
		if time.Now().After(deadline) {
			return fmt.Errorf("no stream opened within 30s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// countingProxy forwards requests to a source and counts them by kind.
type countingProxy struct {
	srv                     *httptest.Server
	changes, streams, other atomic.Int64
}

// proxyCounts is a snapshot of a countingProxy's counters.
type proxyCounts struct{ changes, streams, other int64 }

func (c proxyCounts) minus(o proxyCounts) proxyCounts {
	return proxyCounts{c.changes - o.changes, c.streams - o.streams, c.other - o.other}
}

func newCountingProxy(target string) (*countingProxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("parse source url: %w", err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1 // streams pass through as they come
	p := &countingProxy{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch feed := req.URL.Query().Get("feed"); {
		case !strings.HasSuffix(req.URL.Path, "/_changes"):
			p.other.Add(1)
		case feed == "" || feed == "normal" || feed == "longpoll":
			p.changes.Add(1)
		default:
			p.streams.Add(1)
		}
		rp.ServeHTTP(w, req)
	}))
	return p, nil
}

func (p *countingProxy) snapshot() proxyCounts {
	return proxyCounts{p.changes.Load(), p.streams.Load(), p.other.Load()}
}

// loadAverage is the machine's one-minute load average, or "?".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	first, _, _ := strings.Cut(string(b), " ")
	return first
}
