package writer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/backpressure"
	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/failure"
)

type fakeSink struct {
	mu    sync.Mutex
	apply func(c *change.Envelope) error
	calls [][]string // doc ids per Apply call
}

func (s *fakeSink) Apply(ctx context.Context, cs []*change.Envelope) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, len(cs))
	errs := make([]error, len(cs))
	for i, c := range cs {
		ids[i] = c.DocID + "@" + c.Rev
		errs[i] = s.apply(c)
	}
	s.calls = append(s.calls, ids)
	return errs
}

type fakeSQS struct {
	mu         sync.Mutex
	sent       []*sqs.SendMessageInput
	visibility []int32
	handles    []string // the receipt handle of each visibility change
	sendErr    error
	// batches: the entries of each batch request; failEntries: the ids of
	// the entries SendMessageBatch fails.
	batches     []int
	failEntries map[string]bool
}

func (f *fakeSQS) GetQueueUrl(ctx context.Context, in *sqs.GetQueueUrlInput, _ ...func(*sqs.Options)) (*sqs.GetQueueUrlOutput, error) {
	return &sqs.GetQueueUrlOutput{QueueUrl: aws.String("https://queue/" + *in.QueueName)}, nil
}

func (f *fakeSQS) SendMessage(ctx context.Context, in *sqs.SendMessageInput, _ ...func(*sqs.Options)) (*sqs.SendMessageOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sendErr != nil {
		return nil, f.sendErr
	}
	f.sent = append(f.sent, in)
	return &sqs.SendMessageOutput{}, nil
}

func (f *fakeSQS) ChangeMessageVisibility(ctx context.Context, in *sqs.ChangeMessageVisibilityInput, _ ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.visibility = append(f.visibility, in.VisibilityTimeout)
	f.handles = append(f.handles, aws.ToString(in.ReceiptHandle))
	return &sqs.ChangeMessageVisibilityOutput{}, nil
}

// SendMessageBatch records each entry as the SendMessage it stands for, and
// the request's size; sendErr fails the request, failEntries the entries
// with those ids.
func (f *fakeSQS) SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, _ ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sendErr != nil {
		return nil, f.sendErr
	}
	f.batches = append(f.batches, len(in.Entries))
	out := &sqs.SendMessageBatchOutput{}
	for _, e := range in.Entries {
		if f.failEntries[aws.ToString(e.Id)] {
			out.Failed = append(out.Failed, sqstypes.BatchResultErrorEntry{Id: e.Id, Code: aws.String("InternalError"), SenderFault: false})
			continue
		}
		f.sent = append(f.sent, &sqs.SendMessageInput{QueueUrl: in.QueueUrl, MessageBody: e.MessageBody, MessageAttributes: e.MessageAttributes,
			DelaySeconds: e.DelaySeconds, MessageGroupId: e.MessageGroupId, MessageDeduplicationId: e.MessageDeduplicationId})
		out.Successful = append(out.Successful, sqstypes.SendMessageBatchResultEntry{Id: e.Id})
	}
	return out, nil
}

// ChangeMessageVisibilityBatch records each entry as the
// ChangeMessageVisibility it stands for.
func (f *fakeSQS) ChangeMessageVisibilityBatch(ctx context.Context, in *sqs.ChangeMessageVisibilityBatchInput, _ ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityBatchOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batches = append(f.batches, len(in.Entries))
	for _, e := range in.Entries {
		f.visibility = append(f.visibility, e.VisibilityTimeout)
		f.handles = append(f.handles, aws.ToString(e.ReceiptHandle))
	}
	return &sqs.ChangeMessageVisibilityBatchOutput{}, nil
}

func testConfig(t *testing.T, ordering string) *config.File {
	t.Helper()
	f, err := config.Parse([]byte(fmt.Sprintf(`{"jobs":[{"id":"j","source":{"type":"couchdb","url":"http://h/db"},
		"outputs":[{"id":"o","type":"http","ordering":%q,"max_receive_count":3,"http":{"url":"http://x/{doc_id}"}}]}]}`, ordering)))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func record(t *testing.T, f *config.File, id, doc, rev string, counter int64, receives int) events.SQSMessage {
	t.Helper()
	j := f.Jobs[0]
	e := change.Envelope{V: 1, Job: "j", Output: "o", DocID: doc, Rev: rev, Seq: json.RawMessage(fmt.Sprint(counter)),
		Version: change.Version{Generation: 1, Counter: counter}, Doc: json.RawMessage(`{}`)}
	b, _ := json.Marshal(e)
	return events.SQSMessage{
		MessageId: id, ReceiptHandle: "rh-" + id, Body: string(b),
		EventSourceARN: "arn:aws:sqs:us-east-1:000000000000:" + f.QueueName(j, j.Outputs[0]),
		Attributes:     map[string]string{"MessageGroupId": doc, "ApproximateReceiveCount": fmt.Sprint(receives)},
	}
}

func newHandler(f *config.File, sink *fakeSink, q *fakeSQS) *Handler {
	return &Handler{
		Config: f, SQS: q, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Sinks: func(context.Context, config.Route) (deliver.Sink, error) { return sink, nil },
	}
}

// On a FIFO queue, a transient failure blocks the later messages of its
// group in the batch (they are never applied), while other groups proceed.
func TestFIFOGroupBlocking(t *testing.T) {
	t.Parallel()
	f := testConfig(t, "per_document")
	sink := &fakeSink{apply: func(c *change.Envelope) error {
		if c.DocID == "a" && c.Rev == "1-a" {
			return deliver.TransientError("http_status", errors.New("503"))
		}
		return nil
	}}
	q := &fakeSQS{}
	h := newHandler(f, sink, q)
	ev := events.SQSEvent{Records: []events.SQSMessage{
		record(t, f, "m1", "a", "1-a", 1, 1), record(t, f, "m2", "b", "1-b", 2, 1),
		record(t, f, "m3", "a", "2-a", 3, 1), record(t, f, "m4", "b", "2-b", 4, 1),
	}}
	resp, err := h.Handle(context.Background(), ev)
	if err != nil {
		t.Fatal(err)
	}
	var failed []string
	for _, f := range resp.BatchItemFailures {
		failed = append(failed, f.ItemIdentifier)
	}
	sort.Strings(failed)
	if d := cmp.Diff([]string{"m1", "m3"}, failed); d != "" {
		t.Errorf("failed messages (-want +got):\n%s", d)
	}
	wantCalls := [][]string{{"a@1-a", "b@1-b"}, {"b@2-b"}}
	if d := cmp.Diff(wantCalls, sink.calls); d != "" {
		t.Errorf("apply rounds (-want +got):\n%s", d)
	}
	if len(q.visibility) != 2 {
		t.Errorf("visibility changes %v, want one backoff per failed message", q.visibility)
	}
	if len(q.sent) != 0 {
		t.Errorf("%d messages sent to the DLQ, want none", len(q.sent))
	}
}

// Permanent failures, undecodable bodies and transient failures on their
// last receive go to the DLQ with reasons and count as handled.
func TestDeadLettering(t *testing.T) {
	t.Parallel()
	f := testConfig(t, "none")
	sink := &fakeSink{apply: func(c *change.Envelope) error {
		switch c.DocID {
		case "bad":
			return &deliver.Error{Class: deliver.Permanent, Reason: "http_status", HTTPStatus: 400, Err: errors.New("bad request")}
		case "flaky":
			return deliver.TransientError("http_status", errors.New("503"))
		}
		return nil
	}}
	q := &fakeSQS{}
	h := newHandler(f, sink, q)
	garbage := record(t, f, "m4", "x", "1-x", 4, 1)
	garbage.Body = "{not json"
	ev := events.SQSEvent{Records: []events.SQSMessage{
		record(t, f, "m1", "ok", "1-a", 1, 1), record(t, f, "m2", "bad", "1-b", 2, 1),
		record(t, f, "m3", "flaky", "1-c", 3, 3), garbage,
	}}
	resp, err := h.Handle(context.Background(), ev)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BatchItemFailures) != 0 {
		t.Errorf("failures %v, want none (all handled)", resp.BatchItemFailures)
	}
	got := map[string]string{}
	for _, in := range q.sent {
		a := in.MessageAttributes
		got[aws.ToString(a[failure.AttrReason].StringValue)] = aws.ToString(a[failure.AttrClass].StringValue) + "/" + aws.ToString(a[failure.AttrAttempts].StringValue)
		if aws.ToString(in.QueueUrl) != "https://queue/"+f.DLQName(f.Jobs[0], f.Jobs[0].Outputs[0]) {
			t.Errorf("sent to %s, want the DLQ", aws.ToString(in.QueueUrl))
		}
	}
	want := map[string]string{"http_status": "transient/3", "decode": "permanent/1"}
	// Two http_status failures: the permanent one and the exhausted transient one.
	if len(q.sent) != 3 || got["decode"] != want["decode"] {
		t.Errorf("DLQ messages %v, want 3 including %v", got, want)
	}
	st := h.Stats()["j/o"]
	if st.Delivered != 1 || st.DeadLettered != 3 {
		t.Errorf("stats %+v", st)
	}
	// If the DLQ refuses, the message is retried rather than dropped.
	q.sendErr = errors.New("sqs down")
	resp, _ = h.Handle(context.Background(), events.SQSEvent{Records: []events.SQSMessage{record(t, f, "m9", "bad", "1-b", 9, 1)}})
	if len(resp.BatchItemFailures) != 1 {
		t.Errorf("failures %v, want m9 retried when the DLQ is unreachable", resp.BatchItemFailures)
	}
}

// A change redriven from the DLQ that fails again goes back with its whole
// history: its earlier attempts added to this receive's, its first failure
// kept. The message reaches the handler the way the local runtime hands it
// over (Event), attributes included.
func TestRedrivenFailureKeepsHistory(t *testing.T) {
	t.Parallel()
	f := testConfig(t, "none")
	sink := &fakeSink{apply: func(c *change.Envelope) error {
		return &deliver.Error{Class: deliver.Permanent, Reason: "http_status", HTTPStatus: 422, Err: errors.New("unprocessable")}
	}}
	q := &fakeSQS{}
	h := newHandler(f, sink, q)
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	h.Now = func() time.Time { return now }
	firstFailed := now.Add(-48 * time.Hour)
	prev := failure.Record{Class: "transient", Reason: "connection", Error: "transient connection: refused",
		Attempts: 3, FirstAt: firstFailed, LastAt: now.Add(-47 * time.Hour), Job: "j", Output: "o", DocID: "a"}
	rec := record(t, f, "m1", "a", "1-a", 1, 2)
	msg := sqstypes.Message{
		MessageId: aws.String(rec.MessageId), ReceiptHandle: aws.String(rec.ReceiptHandle), Body: aws.String(rec.Body),
		Attributes:        map[string]string{"ApproximateReceiveCount": "2", "ApproximateFirstReceiveTimestamp": fmt.Sprint(now.Add(-time.Minute).UnixMilli())},
		MessageAttributes: prev.Attributes(),
	}
	resp, err := h.Handle(t.Context(), Event(rec.EventSourceARN, "us-east-1", []sqstypes.Message{msg}))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BatchItemFailures) != 0 || len(q.sent) != 1 {
		t.Fatalf("failures %v, %d sent to the DLQ; want the message dead-lettered", resp.BatchItemFailures, len(q.sent))
	}
	got := failure.Parse(failure.SQSValues(q.sent[0].MessageAttributes))
	want := failure.Record{Class: "permanent", Reason: "http_status", Error: "permanent http_status (http 422): unprocessable",
		HTTPStatus: 422, Attempts: 2 + 3, FirstAt: firstFailed, LastAt: now, Job: "j", Output: "o", DocID: "a"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("DLQ failure record (-want +got):\n%s", d)
	}
	if aws.ToString(q.sent[0].MessageBody) != rec.Body {
		t.Errorf("DLQ body changed: %s", aws.ToString(q.sent[0].MessageBody))
	}
}

// A 429 never reaches the DLQ: early receives get their visibility extended
// to the Retry-After; on a standard queue the receive before the last is
// sent back as a new message (a fresh receive count, deferrals counted)
// instead of failing, while on a FIFO queue the change stays in flight at
// the head of its group on every receive (a resend would pass its
// document's later changes).
func TestBackpressureNeverDeadLetters(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		ordering   string
		receives   int
		wantFailed bool
		wantVis    []int32
		wantSent   int
	}{
		{name: "first receive: visibility", ordering: "none", receives: 1, wantFailed: true, wantVis: []int32{7}},
		{name: "before last: sent back", ordering: "none", receives: 2, wantSent: 1},
		{name: "last receive: sent back, not dead-lettered", ordering: "none", receives: 3, wantSent: 1},
		{name: "fifo last receive: in flight", ordering: "per_document", receives: 3, wantFailed: true, wantVis: []int32{7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := testConfig(t, tt.ordering)
			sink := &fakeSink{apply: func(c *change.Envelope) error {
				return &deliver.Error{Class: deliver.Transient, Reason: "http_status", HTTPStatus: 429, Backpressure: true, RetryAfter: 7 * time.Second}
			}}
			q := &fakeSQS{}
			h := newHandler(f, sink, q)
			rec := record(t, f, "m1", "a", "1-a", 1, tt.receives)
			rec.MessageAttributes = map[string]events.SQSMessageAttribute{AttrDeferrals: {DataType: "Number", StringValue: aws.String("4")}}
			resp, err := h.Handle(t.Context(), events.SQSEvent{Records: []events.SQSMessage{rec}})
			if err != nil {
				t.Fatal(err)
			}
			if got := len(resp.BatchItemFailures) == 1; got != tt.wantFailed {
				t.Fatalf("reported failed %v, want %v", got, tt.wantFailed)
			}
			if diff := cmp.Diff(tt.wantVis, q.visibility); diff != "" {
				t.Errorf("visibility (-want +got):\n%s", diff)
			}
			if len(q.sent) != tt.wantSent {
				t.Fatalf("sent %d messages, want %d", len(q.sent), tt.wantSent)
			}
			st := h.Stats()["j/o"]
			if st.DeadLettered != 0 || st.Deferred != 1 {
				t.Errorf("stats %+v, want nothing dead-lettered and one deferred", st)
			}
			if tt.wantSent == 0 {
				return
			}
			in := q.sent[0]
			if got := aws.ToString(in.QueueUrl); got != "https://queue/"+f.QueueName(f.Jobs[0], f.Jobs[0].Outputs[0]) {
				t.Errorf("sent to %s, want the work queue", got)
			}
			if got := aws.ToString(in.MessageAttributes[AttrDeferrals].StringValue); got != "5" {
				t.Errorf("deferrals %q, want 5", got)
			}
			if in.MessageBody == nil || *in.MessageBody != rec.Body {
				t.Error("body changed on the way back")
			}
			if in.DelaySeconds != 7 {
				t.Errorf("delay %d, want 7", in.DelaySeconds)
			}
		})
	}
}

// While the output's pause lasts, the sink is not called at all, and an
// ordinary transient failure still reaches the DLQ on its last receive.
func TestPauseSkipsTheSink(t *testing.T) {
	t.Parallel()
	f := testConfig(t, "none")
	calls := 0
	sink := &fakeSink{apply: func(c *change.Envelope) error {
		calls++
		if c.DocID == "busy" {
			return &deliver.Error{Class: deliver.Transient, Reason: "http_status", HTTPStatus: 503, Backpressure: true, RetryAfter: 30 * time.Second}
		}
		return deliver.TransientError("http_status", errors.New("500"))
	}}
	q := &fakeSQS{}
	h := newHandler(f, sink, q)
	if _, err := h.Handle(t.Context(), events.SQSEvent{Records: []events.SQSMessage{record(t, f, "m1", "busy", "1-a", 1, 1)}}); err != nil {
		t.Fatal(err)
	}
	if st := h.Backpressure("j", "o"); !st.Active || st.Paused <= 0 {
		t.Fatalf("not paused after a 503: %+v", st)
	}
	resp, err := h.Handle(t.Context(), events.SQSEvent{Records: []events.SQSMessage{record(t, f, "m2", "other", "1-a", 2, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 1 || len(resp.BatchItemFailures) != 1 {
		t.Fatalf("sink called %d times, %d failed; want the paused batch not sent", calls, len(resp.BatchItemFailures))
	}
	if h.ReceiverLimit("j", "o", 4) != 1 {
		t.Errorf("receiver limit while paused = %d, want 1", h.ReceiverLimit("j", "o", 4))
	}

	g := newHandler(f, sink, &fakeSQS{})
	if _, err := g.Handle(t.Context(), events.SQSEvent{Records: []events.SQSMessage{record(t, f, "m3", "other", "1-a", 3, 3)}}); err != nil {
		t.Fatal(err)
	}
	if st := g.Stats()["j/o"]; st.DeadLettered != 1 || st.Deferred != 0 {
		t.Errorf("ordinary failure on last receive: %+v, want dead-lettered", st)
	}
}

// A slow output is logged when it becomes slow and when it recovers, not
// at every batch in between.
func TestSlowOutputLoggedOnChange(t *testing.T) {
	t.Parallel()
	f := testConfig(t, "none")
	var logs bytes.Buffer
	h := newHandler(f, &fakeSink{apply: func(*change.Envelope) error { return nil }}, &fakeSQS{})
	h.Log = slog.New(slog.NewTextHandler(&logs, nil))
	j := f.Jobs[0]
	route, ok := f.RouteByQueueName(f.QueueName(j, j.Outputs[0]))
	if !ok {
		t.Fatal("no route for the work queue")
	}
	tr := h.tracker(route)
	observe := func(n int, d time.Duration) {
		for range n {
			tr.Observe(d, nil)
		}
	}
	handle := func(counter int64) {
		t.Helper()
		if _, err := h.Handle(t.Context(), events.SQSEvent{Records: []events.SQSMessage{record(t, f, fmt.Sprint("m", counter), "a", "1-a", counter, 1)}}); err != nil {
			t.Fatal(err)
		}
	}
	count := func(msg string) int { return strings.Count(logs.String(), `msg="`+msg+`"`) }

	observe(backpressure.DefaultBaselineRequests, time.Millisecond)
	observe(backpressure.DefaultWindow, 20*time.Millisecond) // twenty times the baseline
	for i := range 3 {
		handle(int64(i + 1))
	}
	if got := count("output is slow; lowering parallelism"); got != 1 {
		t.Errorf("logged slow %d times over three slow batches, want once:\n%s", got, logs.String())
	}
	observe(backpressure.DefaultWindow, time.Millisecond)
	for i := range 3 {
		handle(int64(i + 4))
	}
	if got := count("output is no longer slow"); got != 1 {
		t.Errorf("logged recovered %d times over three batches, want once:\n%s", got, logs.String())
	}
	if got := count("output is slow; lowering parallelism"); got != 1 {
		t.Errorf("logged slow %d times in all, want once:\n%s", got, logs.String())
	}
}

// A message redriven from the DLQ already carries ten attributes, SQS's
// limit: it is sent back with them all and without the deferral counter.
func TestBackpressureResendKeepsTenAttributes(t *testing.T) {
	t.Parallel()
	f := testConfig(t, "none")
	sink := &fakeSink{apply: func(c *change.Envelope) error {
		return &deliver.Error{Class: deliver.Transient, Reason: "http_status", HTTPStatus: 503, Backpressure: true}
	}}
	q := &fakeSQS{}
	h := newHandler(f, sink, q)
	rec := record(t, f, "m1", "a", "1-a", 1, 3)
	rec.MessageAttributes = map[string]events.SQSMessageAttribute{}
	for i := range 10 {
		rec.MessageAttributes[fmt.Sprintf("attr-%d", i)] = events.SQSMessageAttribute{DataType: "String", StringValue: aws.String("x")}
	}
	resp, err := h.Handle(t.Context(), events.SQSEvent{Records: []events.SQSMessage{rec}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BatchItemFailures) != 0 || len(q.sent) != 1 {
		t.Fatalf("failed %v, sent %d: want the message sent back and handled", resp.BatchItemFailures, len(q.sent))
	}
	if got := q.sent[0].MessageAttributes; len(got) != 10 {
		t.Errorf("sent back with %d attributes, want the 10 it had", len(got))
	}
}

// stallingSink applies the changes of its first Apply and holds every later
// Apply until its context ends, failing its changes with the context's
// error: an output that stops answering mid-batch.
type stallingSink struct {
	mu      sync.Mutex
	applied []string
}

func (s *stallingSink) Apply(ctx context.Context, cs []*change.Envelope) []error {
	s.mu.Lock()
	first := s.applied == nil
	if first {
		s.applied = []string{}
		for _, c := range cs {
			s.applied = append(s.applied, c.DocID+"@"+c.Rev)
		}
	}
	s.mu.Unlock()
	errs := make([]error, len(cs))
	if first {
		return errs
	}
	<-ctx.Done()
	for i := range errs {
		errs[i] = ctx.Err()
	}
	return errs
}

// A batch whose output stops answering ends its work a reserve before the
// invocation's deadline and reports what it did: the changes applied are
// handled, the ones left are retried, none dead-lettered though this is
// their last receive, and the output is not taken for down.
func TestWorkCutShortBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	f := testConfig(t, "per_document")
	sink := &stallingSink{}
	q := &fakeSQS{}
	outages := &fakeOutages{}
	h := &Handler{Config: f, SQS: q, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Outages: outages,
		Sinks: func(context.Context, config.Route) (deliver.Sink, error) { return sink, nil }}
	ev := events.SQSEvent{Records: []events.SQSMessage{
		record(t, f, "m1", "a", "1-a", 1, 3), record(t, f, "m2", "b", "1-b", 2, 3), record(t, f, "m3", "a", "2-a", 3, 3),
	}}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := h.Handle(ctx, ev)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatalf("Handle returned after the invocation's deadline (%s)", took.Round(time.Millisecond))
	}
	var failed []string
	for _, f := range resp.BatchItemFailures {
		failed = append(failed, f.ItemIdentifier)
	}
	if d := cmp.Diff([]string{"m3"}, failed); d != "" {
		t.Errorf("retried (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"a@1-a", "b@1-b"}, sink.applied); d != "" {
		t.Errorf("applied (-want +got):\n%s", d)
	}
	if len(q.sent) != 0 || len(outages.marks) != 0 {
		t.Errorf("%d sent (to the DLQ or back), outage marks %+v: want none", len(q.sent), outages.marks)
	}
}
