package tests

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/statetable/outage"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/tests/faults"
)

// outageLength is how long the outage tests keep their output down:
// CHANGES_TEST_OUTAGE (a Go duration), default 2m.
func outageLength(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv("CHANGES_TEST_OUTAGE")
	if v == "" {
		return 2 * time.Minute
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("CHANGES_TEST_OUTAGE=%q: %v", v, err)
	}
	return d
}

// shortOutageRetry makes the writer try a down output again after 1 s, then
// 2 s, up to 4 s: the time an outage test needs is the outage, not the
// retry wait.
func shortOutageRetry(o *config.Output) {
	o.Outage = config.Outage{Retry: config.Duration(time.Second), MaxRetry: config.Duration(4 * time.Second)}
}

// outageFigures are what an outage test measured.
type outageFigures struct {
	Length  time.Duration // the output was down
	Changes int           // document writes during the outage
	Held    int           // the work queue's largest depth during the outage: messages held
	Drain   time.Duration // from the output's return to the output equal to the source, queue empty
	DLQ     int           // messages in the output's DLQ at the end
	Stats   localrun.Summary
	Record  *outage.State // the outage record seen during the outage
}

func (f outageFigures) String() string {
	st := f.Stats.Outputs
	return fmt.Sprintf("outage %s, %d document writes during it, up to %d messages held in the queue, drained %s after recovery, DLQ %d; writer stats %+v",
		f.Length.Round(time.Second), f.Changes, f.Held, f.Drain.Round(100*time.Millisecond), f.DLQ, st)
}

// runOutage runs the stack's pipeline until output holds the first
// documents, takes the output down with cut for length while documents
// keep changing (a write every 250 ms), brings it back with mend, and waits
// until the output (state) equals the source and its work queue is empty.
// It fails the test if anything reached the DLQ.
func runOutage(t *testing.T, s *testStack, output string, state func() map[string]string, cut, mend func(), length time.Duration) outageFigures {
	t.Helper()
	ctx := t.Context()
	rt, stop := s.RunInBackground(t, localrun.Options{Tick: 2 * time.Second})
	defer stop()

	s.load(ctx, sample.Options{Docs: 20, Seed: 31})
	if !waitConverged(t, s, state, 2*time.Minute) {
		t.FailNow()
	}
	q, err := s.Queues(ctx, "orders", output)
	if err != nil {
		t.Fatal(err)
	}

	var fig outageFigures
	cut()
	start := time.Now()
	revs := map[string]string{}
	for i := 0; time.Since(start) < length; i++ {
		id := fmt.Sprintf("during-%03d", i%40)
		body := map[string]any{"type": "order", "n": i}
		if rev := revs[id]; rev != "" {
			body["_rev"] = rev
		}
		rev, err := s.PutDoc(ctx, id, body)
		if err != nil {
			t.Fatal(err)
		}
		revs[id] = rev
		fig.Changes++
		if i%4 == 0 {
			if d, err := dlq.QueueDepth(ctx, s.Deps.SQS, q.WorkURL); err == nil {
				fig.Held = max(fig.Held, d.Total())
			}
			if fig.Record == nil {
				fig.Record, _ = (&outage.Store{DB: s.Deps.DynamoDB, Table: s.Config.TableName()}).Get(ctx, "orders", output)
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	mend()
	fig.Length = time.Since(start)
	back := time.Now()
	if waitConverged(t, s, state, 90*time.Second+stall) {
		const within = time.Minute + stall
		for deadline := time.Now().Add(within); ; time.Sleep(250 * time.Millisecond) {
			d, err := dlq.QueueDepth(ctx, s.Deps.SQS, q.WorkURL)
			if err == nil && d.Total() == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("work queue of %s not empty %s after the output equals the source: %+v", output, within, d)
				break
			}
		}
	}
	fig.Drain = time.Since(back)
	fig.DLQ = len(receiveAll(t, s, output))
	fig.Stats = rt.Summary()
	if fig.DLQ != 0 {
		t.Errorf("DLQ of %s holds %d messages, want none", output, fig.DLQ)
	}
	if st := fig.Stats.Outputs["orders/"+output]; st.DeadLettered != 0 || st.Held == 0 {
		t.Errorf("writer stats %+v: want messages held and none dead-lettered", st)
	}
	if fig.Record == nil || fig.Record.Since.IsZero() || fig.Record.LastError == "" {
		t.Errorf("outage record during the outage: %+v, want one with since and the last error", fig.Record)
	}
	if rec, err := (&outage.Store{DB: s.Deps.DynamoDB, Table: s.Config.TableName()}).Get(ctx, "orders", output); err != nil || rec != nil {
		t.Errorf("outage record after recovery: %+v, %v; want none", rec, err)
	}
	return fig
}

// waitConverged waits until state equals the source's winners, and
// reports whether it did; if not, it fails the test with the number of
// documents that differ.
func waitConverged(t *testing.T, s *testStack, state func() map[string]string, within time.Duration) bool {
	t.Helper()
	ctx := t.Context()
	var want, got map[string]string
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		want, got = s.sourceState(ctx), state()
		if cmp.Equal(want, got) {
			return true
		}
	}
	differ := 0
	for id, rev := range want {
		if got[id] != rev {
			differ++
		}
	}
	t.Errorf("output not equal to the source within %s: %d of %d documents missing or at another revision", within, differ, len(want))
	return false
}

// PostgreSQL cut off (a proxy in front of it refuses every connection) for
// minutes while documents keep arriving, then back: nothing is
// dead-lettered, and the output ends equal to the source, every document at
// its winning revision.
func TestPostgresDownNothingDeadLettered(t *testing.T) {
	parallel(t)
	u, err := url.Parse(testenv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faults.NewProxy(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	u.Host = proxy.URL()[len("http://"):]
	s := newStack(t, stackOptions{
		outputs: []string{"pg"}, maxReceive: 3, secrets: map[string]string{"OUTAGE_TEST_PG_DSN": u.String()},
		pg: func(o *config.Output) {
			o.Postgres.DSN = config.SecretRef{Env: "OUTAGE_TEST_PG_DSN"}
			shortOutageRetry(o)
		},
	})
	ctx := t.Context()
	state := func() map[string]string {
		got, err := s.Revs(ctx, "orders", "pg")
		if err != nil {
			return nil // the writer creates the table with its first change
		}
		return got
	}
	fig := runOutage(t, s, "pg", state, proxy.Cut, proxy.Mend, outageLength(t))
	t.Logf("postgres: %s", fig)
}

// The HTTP receiver answers 503 to every request for minutes: nothing is
// dead-lettered, everything arrives once it accepts again.
func TestHTTPUnavailableNothingDeadLettered(t *testing.T) {
	parallel(t)
	var mu sync.Mutex
	down := false
	s := newStack(t, stackOptions{
		outputs: []string{"rest"}, maxReceive: 3, rest: shortOutageRetry,
		wrapRest: func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				d := down
				mu.Unlock()
				if d {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				next.ServeHTTP(w, r)
			})
		},
	})
	set := func(v bool) func() {
		return func() {
			mu.Lock()
			defer mu.Unlock()
			down = v
		}
	}
	fig := runOutage(t, s, "rest", s.httpState, set(true), set(false), outageLength(t))
	t.Logf("http 503: %s", fig)
}

// The S3 output's bucket unreachable (every request for its objects fails
// to connect) or refusing us (403 AccessDenied), then back: nothing is
// dead-lettered. The claim-check bucket, SQS and DynamoDB stay reachable.
func TestS3BucketUnreachableNothingDeadLettered(t *testing.T) {
	parallel(t)
	for _, mode := range []string{"unreachable", "access denied"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			cutter := &s3Cutter{prefix: "/archive/", denied: mode == "access denied"}
			s := newStack(t, stackOptions{
				outputs: []string{"archive"}, maxReceive: 3, archive: shortOutageRetry, httpClient: cutter.wrap,
			})
			ctx := t.Context()
			fig := runOutage(t, s, "archive", func() map[string]string { return s.s3State(ctx) },
				func() { cutter.set(true) }, func() { cutter.set(false) }, outageLength(t)/2)
			t.Logf("s3 %s: %s (requests refused: %s)", mode, fig, strconv.Itoa(int(cutter.refused.Load())))
		})
	}
}

// s3Cutter wraps the pipeline's AWS HTTP client: while down, every request
// whose path holds prefix (the S3 output's objects) fails to connect, or
// with denied, is answered 403 AccessDenied. Safe for concurrent use.
type s3Cutter struct {
	prefix  string
	denied  bool
	down    atomic.Bool
	refused atomic.Int64
	next    aws.HTTPClient
}

func (c *s3Cutter) wrap(next aws.HTTPClient) aws.HTTPClient {
	c.next = next
	return c
}

func (c *s3Cutter) set(down bool) { c.down.Store(down) }

func (c *s3Cutter) Do(req *http.Request) (*http.Response, error) {
	if !c.down.Load() || !strings.Contains(req.URL.Path, c.prefix) {
		return c.next.Do(req)
	}
	c.refused.Add(1)
	if req.Body != nil {
		req.Body.Close()
	}
	if !c.denied {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	body := `<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>`
	return &http.Response{
		Status: "403 Forbidden", StatusCode: http.StatusForbidden, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  http.Header{"Content-Type": {"application/xml"}},
		Body:    io.NopCloser(strings.NewReader(body)),
		Request: req, ContentLength: int64(len(body)),
	}, nil
}

// A PostgreSQL output whose DSN secret holds a placeholder when the writers
// start (a stack deployed before the operator filled it in): the warm
// writer holds the messages, dead-letters none, and with the default
// outage and secret settings delivers everything within a minute of the
// secret being corrected, with no restart.
func TestWrongDSNCorrectedWhileWarm(t *testing.T) {
	parallel(t)
	ctx := t.Context()
	name, putSecret := testenv.Secret(t, "dsn-corrected", "CHANGE_ME")
	s := newStack(t, stackOptions{
		outputs: []string{"pg"}, maxReceive: 3,
		pg: func(o *config.Output) { o.Postgres.DSN = config.SecretRef{Secret: name} },
	})
	rt, stop := s.RunInBackground(t, localrun.Options{Tick: 2 * time.Second})
	defer stop()

	s.load(ctx, sample.Options{Docs: 20, Seed: 41})
	// Long enough for every message to pass max_receive_count (3) with
	// the plain transient backoff (2 s, 4 s).
	s.Logs().WaitFor(t, `msg="output is down; holding its messages"`, time.Minute)
	time.Sleep(20 * time.Second)
	putSecret(testenv.DSN())
	stored := time.Now()
	state := func() map[string]string {
		got, err := s.Revs(ctx, "orders", "pg")
		if err != nil {
			return nil // the writer creates the table with its first change
		}
		return got
	}
	if !waitConverged(t, s, state, 90*time.Second) {
		t.FailNow()
	}
	took := time.Since(stored)
	if n := len(receiveAll(t, s, "pg")); n != 0 {
		t.Errorf("DLQ holds %d messages, want none", n)
	}
	if took > time.Minute {
		t.Errorf("the corrected DSN took effect %s after it was stored, want within a minute", took.Round(time.Second))
	}
	t.Logf("corrected DSN stored; the warm writer delivered all 20 documents %s later; writer stats %+v", took.Round(100*time.Millisecond), rt.Summary().Outputs)
}
