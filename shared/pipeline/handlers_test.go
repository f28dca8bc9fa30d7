package pipeline_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/poll"
	"github.com/changes-worker/changes-worker/shared/provision"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// scheduleStack is one job on the local services: a source database, the
// job's table and queue, and the Deps a Lambda cold start would build.
type scheduleStack struct {
	t    *testing.T
	db   string
	cfg  *config.File
	deps *pipeline.Deps
}

func newScheduleStack(t *testing.T) *scheduleStack {
	t.Helper()
	return newScheduleStackWith(t, "")
}

// newScheduleStackWith is newScheduleStack with more job settings (JSON
// members, each followed by a comma).
func newScheduleStackWith(t *testing.T, job string) *scheduleStack {
	t.Helper()
	awsCfg := testenv.AWS(t)
	s := &scheduleStack{t: t, db: testenv.CouchDB(t)}
	prefix := "p" + testenv.Name(t)
	cfg, err := config.Parse(fmt.Appendf(nil, `{
		"stack": {"prefix": %q, "bucket": "changes-worker-tests", "poller_timeout": "10s"},
		"jobs": [{"id": "orders", %s "source": {"type": "couchdb", "url": %q},
			"feed": {"limit": 100, "timeout": "1s"}, "lease": {"ttl": "6s"},
			"outputs": [{"id": "pg", "type": "postgres", "postgres": {"dsn": {"env": "CHANGES_TEST_PG_DSN"}, "table": "unused"}}]}]}`,
		prefix, job, s.db))
	if err != nil {
		t.Fatalf("parse config: %v", err)
	}
	// A shorter invocation than a configuration may ask for, as the local
	// runtime's --poller-timeout allows, to keep the test short.
	cfg.Stack.PollerTimeout = config.Duration(4 * time.Second)
	s.cfg = cfg
	s.deps = pipeline.New(cfg, awsCfg, func(string) (string, bool) { return "", false },
		slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	t.Cleanup(s.deps.Close)
	if _, err := provision.Apply(t.Context(), provision.Clients{DynamoDB: s.deps.DynamoDB, SQS: s.deps.SQS, S3: s.deps.S3}, cfg); err != nil {
		t.Fatalf("provision: %v", err)
	}
	return s
}

func (s *scheduleStack) put(ids ...string) {
	s.t.Helper()
	for _, id := range ids {
		req, _ := http.NewRequestWithContext(s.t.Context(), http.MethodPut, s.db+"/"+id, strings.NewReader(`{"n":1}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			s.t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			s.t.Fatalf("put %s: status %d", id, resp.StatusCode)
		}
	}
}

// queued receives n envelopes from the job's queue.
func (s *scheduleStack) queued(n int) []*change.Envelope {
	s.t.Helper()
	j := s.cfg.Jobs[0]
	name := s.cfg.QueueName(j, j.Outputs[0])
	u, err := s.deps.SQS.GetQueueUrl(s.t.Context(), &sqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		s.t.Fatal(err)
	}
	var out []*change.Envelope
	for deadline := time.Now().Add(10 * time.Second); len(out) < n && time.Now().Before(deadline); {
		got, err := s.deps.SQS.ReceiveMessage(s.t.Context(), &sqs.ReceiveMessageInput{QueueUrl: u.QueueUrl, MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
		if err != nil {
			s.t.Fatal(err)
		}
		for _, m := range got.Messages {
			e, err := change.Decode([]byte(aws.ToString(m.Body)))
			if err != nil {
				s.t.Fatalf("decode message: %v", err)
			}
			out = append(out, e)
			if _, err := s.deps.SQS.DeleteMessage(s.t.Context(), &sqs.DeleteMessageInput{QueueUrl: u.QueueUrl, ReceiptHandle: m.ReceiptHandle}); err != nil {
				s.t.Fatal(err)
			}
		}
	}
	slices.SortFunc(out, func(a, b *change.Envelope) int { return a.Version.Compare(b.Version) })
	return out
}

func (s *scheduleStack) state() *lease.State {
	s.t.Helper()
	st, err := lease.New(s.deps.DynamoDB, s.cfg.TableName()).Get(s.t.Context(), "orders")
	if err != nil {
		s.t.Fatal(err)
	}
	return st
}

// invoke calls the handler as Lambda does: the schedule event, and a
// context with the request id and, unless timeout is 0, a deadline.
func (s *scheduleStack) invoke(requestID string, timeout time.Duration) (poll.Result, error) {
	ctx := s.t.Context()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	ctx = lambdacontext.NewContext(ctx, &lambdacontext.LambdaContext{AwsRequestID: requestID})
	return s.deps.HandleSchedule(ctx, pipeline.ScheduleEvent{Job: "orders"})
}

// TestHandleSchedule drives the poller Lambda's handler, as Lambda and the
// local runtime call it, against the local services.
func TestHandleSchedule(t *testing.T) {
	t.Parallel()
	s := newScheduleStack(t)
	s.put("a", "b", "c")
	start := time.Now()
	res, err := s.invoke("req-1", 3*time.Second)
	if err != nil {
		t.Fatalf("first invocation: %v", err)
	}
	if elapsed := time.Since(start); elapsed > 3*time.Second {
		t.Errorf("first invocation ran %s, past its 3s deadline", elapsed)
	}
	want := poll.Result{Role: "active", Generation: 1, Takeover: lease.First, Read: 3, Enqueued: 3, Checkpoint: res.Checkpoint, CaughtUp: true}
	if diff := cmp.Diff(want, res); diff != "" || res.Checkpoint == nil {
		t.Errorf("first invocation (-want +got):\n%s", diff)
	}
	st := s.state()
	if st.Owner != "req-1" || !st.Released || !bytes.Equal(st.Checkpoint, res.Checkpoint) {
		t.Errorf("job item after the first invocation: owner %s released %t checkpoint %s, want req-1, released, %s",
			st.Owner, st.Released, st.Checkpoint, res.Checkpoint)
	}
	var got []string
	for i, e := range s.queued(3) {
		got = append(got, e.DocID)
		if e.Version != (change.Version{Generation: 1, Counter: int64(i + 1)}) || e.Job != "orders" || e.Output != "pg" {
			t.Errorf("envelope %s: version %s job %s output %s", e.DocID, e.Version, e.Job, e.Output)
		}
	}
	if diff := cmp.Diff([]string{"a", "b", "c"}, got); diff != "" {
		t.Errorf("queued (-want +got):\n%s", diff)
	}

	// The next tick resumes from the checkpoint, under a new generation.
	s.put("d")
	res, err = s.invoke("req-2", 3*time.Second)
	if err != nil {
		t.Fatalf("second invocation: %v", err)
	}
	if res.Role != "active" || res.Generation != 2 || res.Takeover != lease.Handoff || res.Read != 1 || res.Enqueued != 1 {
		t.Errorf("second invocation: %+v", res)
	}
	if st := s.state(); st.Owner != "req-2" || !st.Released || st.Generation != 2 {
		t.Errorf("job item after the second invocation: owner %s released %t generation %d", st.Owner, st.Released, st.Generation)
	}
	if q := s.queued(1); len(q) != 1 || q[0].DocID != "d" || q[0].Version != (change.Version{Generation: 2, Counter: 1}) {
		t.Errorf("second invocation queued %+v, want d at 2.1", q)
	}
}

// TestHandleScheduleClock: without a deadline in the context, the handler
// gives the invocation the stack's poller timeout on the Deps clock, the
// poller's own. With the clock an hour ahead (a fault test skews it), a
// deadline taken from the system clock would lie an hour in the past and
// nothing would be read.
func TestHandleScheduleClock(t *testing.T) {
	t.Parallel()
	s := newScheduleStack(t)
	s.deps.Now = func() time.Time { return time.Now().Add(time.Hour) }
	s.put("a", "b")
	start := time.Now()
	res, err := s.invoke("req-1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Role != "active" || res.Read != 2 || res.Enqueued != 2 {
		t.Errorf("invocation: %+v, want 2 changes read and queued", res)
	}
	// The budget: 4s less a 1s margin; the last long poll may run past it
	// by up to the feed client's slack.
	if elapsed := time.Since(start); elapsed < 2*time.Second || elapsed > 3*time.Second+feed.DefaultSlack+time.Second {
		t.Errorf("invocation ran %s, want about 3s", elapsed)
	}
	if st := s.state(); !bytes.Equal(st.Checkpoint, res.Checkpoint) || !st.Released {
		t.Errorf("job item: checkpoint %s released %t, want %s released", st.Checkpoint, st.Released, res.Checkpoint)
	}
}

// TestHandleScheduleFailoverStartsAStandby: in a Lambda function, an
// invocation that takes the lease over from a holder that crashed invokes
// its own function once, asynchronously, with its job's event, so that the
// new holder has a standby before the next tick; one that takes a released
// lease does not.
func TestHandleScheduleFailoverStartsAStandby(t *testing.T) {
	t.Parallel()
	s := newScheduleStack(t)
	var mu sync.Mutex
	var invokes []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		invokes = append(invokes, fmt.Sprintf("%s %s %s %s", r.Method, r.URL.Path, r.Header.Get("X-Amz-Invocation-Type"), body))
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	s.deps.Lambda = lambda.NewFromConfig(testenv.AWS(t), func(o *lambda.Options) { o.BaseEndpoint = aws.String(srv.URL) })
	s.deps.Function = "shop-orders-poller"
	if _, _, err := lease.New(s.deps.DynamoDB, s.cfg.TableName()).Acquire(t.Context(), "orders", "crashed", "host-1", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	s.put("a")
	res, err := s.invoke("req-1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.Role != "active" || res.Takeover != lease.Failover {
		t.Fatalf("invocation beside a crashed holder: %+v, want active by failover", res)
	}
	res, err = s.invoke("req-2", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.Takeover != lease.Handoff {
		t.Fatalf("next invocation: %+v, want a handoff", res)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{`POST /2015-03-31/functions/shop-orders-poller/invocations Event {"job":"orders"}`}
	if diff := cmp.Diff(want, invokes); diff != "" {
		t.Errorf("Lambda requests (-want +got):\n%s", diff)
	}
}

func TestHandleScheduleBadEvent(t *testing.T) {
	t.Parallel()
	s := newScheduleStack(t)
	tests := []struct {
		name string
		ev   pipeline.ScheduleEvent
		want string
	}{
		{name: "no job", ev: pipeline.ScheduleEvent{}, want: "event has no job"},
		{name: "unknown job", ev: pipeline.ScheduleEvent{Job: "invoices"}, want: `no job "invoices"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res, err := s.deps.HandleSchedule(t.Context(), tt.ev)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("HandleSchedule(%+v) = %v, want an error saying %q", tt.ev, err, tt.want)
			}
			if res.Role != "" || res.Read != 0 {
				t.Errorf("result %+v of a bad event", res)
			}
		})
	}
}
