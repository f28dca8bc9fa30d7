package deliver

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

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
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
		Sinks: func(context.Context, config.Route) (Sink, error) { return sink, nil },
	}
}

// On a FIFO queue, a transient failure blocks the later messages of its
// group in the batch (they are never applied), while other groups proceed.
func TestFIFOGroupBlocking(t *testing.T) {
	t.Parallel()
	f := testConfig(t, "per_document")
	sink := &fakeSink{apply: func(c *change.Envelope) error {
		if c.DocID == "a" && c.Rev == "1-a" {
			return TransientError("http_status", errors.New("503"))
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
			return &Error{Class: Permanent, Reason: "http_status", HTTPStatus: 400, Err: errors.New("bad request")}
		case "flaky":
			return TransientError("http_status", errors.New("503"))
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
		got[aws.ToString(a[AttrReason].StringValue)] = aws.ToString(a[AttrClass].StringValue) + "/" + aws.ToString(a[AttrAttempts].StringValue)
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

func TestAttrText(t *testing.T) {
	t.Parallel()
	got := attrText("é\x00b"+string([]byte{0xff})+"ééé", 7)
	if got != "é?b?é" {
		t.Errorf("attrText = %q", got)
	}
}
