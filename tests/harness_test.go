// Package tests holds the end-to-end and fault tests: the real poller and
// writer code against the local AWS emulator, the CouchDB-compatible source
// and PostgreSQL, started by `make up`.
//
// Every test runs beside the others, -parallel at a time. go test would
// start them in no set order, and the tests that deploy the stack to
// LocalStack (a1_… to a4_…, and the walkthrough) wait minutes on deploys,
// schedules and outages: started late, they would set the package's end.
// So TestMain lifts go test's own bound, and the tests share -parallel
// slots: those tests take theirs first (deployedParallel), the others a
// moment later (parallel).
package tests

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/demo/receiver"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/poll"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

type sqsMessage = sqstypes.Message

// testStack is one isolated pipeline on the local services (stack.ForTest)
// with one job, "orders", and an HTTP receiver for its http output.
type testStack struct {
	*stack.Stack
	t    *testing.T
	recv *receiver.Server
}

type stackOptions struct {
	limit      int
	fetch      string
	ttl        time.Duration
	sourceURL  string // overrides the created database (fault tests)
	maxReceive int
	outputs    []string // subset of pg, rest, archive; default all
	// attachments, when set, is the job's attachments setting.
	attachments *config.Attachments
	// httpClient, when set, wraps the AWS SDK's HTTP client (fault injection).
	httpClient func(aws.HTTPClient) aws.HTTPClient
	// wrapRest, when set, wraps the HTTP receiver (a slow or refusing output).
	wrapRest func(http.Handler) http.Handler
	// rest, pg and archive, when set, adjust their output's settings.
	rest, pg, archive func(*config.Output)
	// secrets are environment variables only this stack's pipeline sees.
	secrets map[string]string
	// idle is the job's idle setting; default watch.
	idle string
	// docIDs is stack.doc_ids; default plain.
	docIDs string
	// logLevel is the level of the captured pipeline log; default info.
	logLevel slog.Level
}

// slots bound the tests that run at once: -parallel of them (TestMain).
var slots chan struct{}

// slotsAfter is how long a test that does not deploy waits, once released,
// before it asks for a slot: the deployed tests, released with it, take
// theirs first.
const slotsAfter = time.Second

// parallel marks t parallel (t.Parallel) and waits for one of the slots,
// which t holds until it and its subtests end.
func parallel(t *testing.T) {
	t.Helper()
	t.Parallel()
	start := time.Now()
	time.Sleep(slotsAfter)
	takeSlot(t, start)
}

// deployedParallel is parallel for a test that deploys the stack: it asks
// for its slot at once.
func deployedParallel(t *testing.T) {
	t.Helper()
	t.Parallel()
	takeSlot(t, time.Now())
}

// takeSlot waits for a slot and logs how long t waited since start, in the
// form tests/testtimes subtracts from the test's time.
func takeSlot(t *testing.T, start time.Time) {
	t.Helper()
	slots <- struct{}{}
	t.Cleanup(func() { <-slots })
	t.Logf("waited %s for a test slot", time.Since(start).Round(time.Millisecond))
}

// parallelStack marks t parallel (parallel) and returns its context and a
// new stack built from o.
func parallelStack(t *testing.T, o stackOptions) (context.Context, *testStack) {
	t.Helper()
	parallel(t)
	return t.Context(), newStack(t, o)
}

func newStack(t *testing.T, o stackOptions) *testStack {
	t.Helper()
	recv, err := receiver.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = recv
	if o.wrapRest != nil {
		h = o.wrapRest(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	if o.limit == 0 {
		o.limit = 200
	}
	if o.ttl == 0 {
		o.ttl = 10 * time.Second
	}
	if o.maxReceive == 0 {
		o.maxReceive = 4
	}
	if o.outputs == nil {
		o.outputs = []string{"pg", "rest", "archive"}
	}
	outs := map[string]*config.Output{
		"pg":      {Type: config.OutputPostgres, Postgres: &config.PostgresOutput{CreateTables: true}},
		"rest":    {Type: config.OutputHTTP, HTTP: &config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}", Timeout: config.Duration(5 * time.Second)}},
		"archive": {Type: config.OutputS3, S3: &config.S3Output{Prefix: "archive/"}},
	}
	job := &config.Job{
		ID:     "orders",
		Source: config.Source{Type: config.SourceCouchDB, URL: o.sourceURL},
		Feed:   config.Feed{Limit: o.limit, Timeout: config.Duration(2 * time.Second), Fetch: o.fetch},
		Lease:  config.Lease{TTL: config.Duration(o.ttl)},
		Idle:   o.idle,

		Attachments: o.attachments,
	}
	for id, adjust := range map[string]func(*config.Output){"rest": o.rest, "pg": o.pg, "archive": o.archive} {
		if adjust != nil {
			adjust(outs[id])
		}
	}
	for _, id := range o.outputs {
		out := outs[id]
		out.ID, out.MaxReceiveCount = id, o.maxReceive
		job.Outputs = append(job.Outputs, out)
	}
	cfg := &config.File{
		Stack: config.Stack{PollerTimeout: config.Duration(20 * time.Second), WriterTimeout: config.Duration(10 * time.Second), DocIDs: o.docIDs},
		Jobs:  []*config.Job{job},
	}
	return &testStack{Stack: stack.ForTest(t, stack.Options{Config: cfg, HTTPClient: o.httpClient, Secrets: o.secrets, LogLevel: o.logLevel}), t: t, recv: recv}
}

// load writes the sample documents o describes into the stack's source
// database.
func (s *testStack) load(ctx context.Context, o sample.Options) {
	s.t.Helper()
	if _, err := sample.Load(ctx, http.DefaultClient, s.SourceURL, o); err != nil {
		s.t.Fatalf("load sample documents: %v", err)
	}
}

// runUntilIdle runs pollers and writers in this process until idle.
func (s *testStack) runUntilIdle(ctx context.Context, opts localrun.Options) localrun.Summary {
	s.t.Helper()
	sum, err := s.RunUntilIdle(ctx, opts)
	if err != nil {
		s.t.Fatal(err)
	}
	return sum
}

// pgState returns doc id → rev of the documents the pg output holds.
func (s *testStack) pgState(ctx context.Context) map[string]string { return s.revs(ctx, "pg") }

// s3State returns doc id → rev of the documents the archive output holds.
func (s *testStack) s3State(ctx context.Context) map[string]string { return s.revs(ctx, "archive") }

// revs returns doc id → rev of the documents an output of the job holds, as
// its sink's state reader reads them.
func (s *testStack) revs(ctx context.Context, output string) map[string]string {
	s.t.Helper()
	got, err := s.Revs(ctx, "orders", output)
	if err != nil {
		s.t.Fatal(err)
	}
	return got
}

// sourceState returns doc id → winning rev of every live document in the
// stack's source database.
func (s *testStack) sourceState(ctx context.Context) map[string]string {
	s.t.Helper()
	got, err := s.SourceWinners(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	return got
}

// httpState returns doc id → rev of the documents the receiver holds.
func (s *testStack) httpState() map[string]string {
	s.t.Helper()
	docs, err := s.recv.Docs()
	if err != nil {
		s.t.Fatal(err)
	}
	got := make(map[string]string, len(docs))
	for id, d := range docs {
		got[id] = d.Rev
	}
	return got
}

// pollerPair is what two poller invocations run side by side returned.
type pollerPair struct {
	results [2]poll.Result
	errs    [2]error
	took    [2]time.Duration
}

// runPollerPair runs two invocations of p, owners p0 and p1, the second
// started once the first holds the job's lease (a fixed delay lets a slow
// first acquire lose the race); budget(i) is invocation i's budget.
func (s *testStack) runPollerPair(ctx context.Context, p *poll.Poller, budget func(i int) time.Duration) pollerPair {
	s.t.Helper()
	var (
		out   pollerPair
		wg    sync.WaitGroup
		first = make(chan struct{})
	)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i == 1 {
				select {
				case <-first:
				case <-ctx.Done():
					return
				}
			}
			start := time.Now()
			out.results[i], out.errs[i] = p.Run(ctx, poll.Invocation{Owner: fmt.Sprintf("p%d", i), Host: "h", Deadline: start.Add(budget(i))})
			out.took[i] = time.Since(start)
		}()
	}
	err := testenv.Poll(ctx, 30*time.Second, 20*time.Millisecond, func(ctx context.Context) (bool, error) {
		st, err := s.Leases.Get(ctx, "orders")
		return err == nil && st.Owner == "p0" && st.Held(time.Now()), err
	})
	close(first)
	wg.Wait()
	if err != nil {
		s.t.Fatalf("the first invocation did not take the lease: %v (it returned %+v, %v)", err, out.results[0], out.errs[0])
	}
	if out.errs[0] != nil || out.errs[1] != nil {
		s.t.Fatalf("runs: %v / %v", out.errs[0], out.errs[1])
	}
	return out
}
