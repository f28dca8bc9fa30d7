package writer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"

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
	sendErr    error
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
	return &sqs.ChangeMessageVisibilityOutput{}, nil
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
