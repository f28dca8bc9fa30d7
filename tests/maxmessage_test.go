package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/failure"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/statetable/outage"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
	"github.com/changes-worker/changes-worker/shared/writer"
)

// largestMessageBytes is the largest stack.max_message_bytes the
// configuration accepts.
func largestMessageBytes(t *testing.T) int {
	t.Helper()
	accepts := func(n int) bool {
		_, err := config.Parse(fmt.Appendf(nil, `{"stack":{"max_message_bytes":%d},"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},
			"outputs":[{"id":"s","type":"s3","s3":{}}]}]}`, n))
		return err == nil
	}
	if !accepts(1024) {
		t.Fatal("stack.max_message_bytes 1024 refused")
	}
	// The accepted values are one range from 1024 up.
	return 1023 + sort.Search(8<<20, func(i int) bool { return !accepts(1024 + i) })
}

// On LocalStack's SQS, which counts a message's attributes (name, data type
// and value) toward SQS's 1 MiB limit as AWS does: a message of the largest
// body the configuration lets the poller queue can be held back, moved to
// the DLQ with the largest failure record, redriven with that record, held
// back again with the record, and moved to the DLQ again; on a standard
// queue, where held back is sent back to its queue with the deferral
// counter, and on a FIFO queue, where it is kept in flight at the head of
// its group and the output's intake paused, the outage record naming it
// without its body (too large for the record).
func TestLargestMessageHeldAndDeadLettered(t *testing.T) {
	parallel(t)
	ctx := t.Context()
	n := largestMessageBytes(t)
	t.Logf("largest stack.max_message_bytes accepted: %d", n)
	const maxReceive = 4
	// Output ids of one length: the poller sizes a body for the longest.
	outputs := map[string]string{"plain": config.OrderingNone, "group": config.OrderingPerDocument}
	job := &config.Job{ID: "orders", Source: config.Source{Type: config.SourceCouchDB}}
	for id, ordering := range outputs {
		job.Outputs = append(job.Outputs, &config.Output{ID: id, Type: config.OutputHTTP, Ordering: ordering, MaxReceiveCount: maxReceive,
			HTTP: &config.HTTPOutput{URL: "http://127.0.0.1:9/docs/{doc_id}"}})
	}
	s := stack.ForTest(t, stack.Options{Config: &config.File{
		Stack: config.Stack{MaxMessageBytes: n, PollerTimeout: config.Duration(20 * time.Second), WriterTimeout: config.Duration(10 * time.Second)},
		Jobs:  []*config.Job{job},
	}})

	// One change whose envelope is exactly n bytes on each queue, queued as
	// the poller queues it. The document id is longer than the failure
	// record keeps.
	env := &change.Envelope{V: 1, Job: "orders", Output: "plain", DocID: strings.Repeat("d", 2*failure.MaxText), Rev: "1-a",
		Seq: json.RawMessage(`"1"`), Version: change.Version{Generation: 1, Counter: 1}, EnqueuedAt: time.Now().UTC(), Doc: json.RawMessage(`{"p":""}`)}
	base, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	env.Output, env.Doc = "", json.RawMessage(`{"p":"`+strings.Repeat("x", n-len(base))+`"}`)
	var targets []fanout.Target
	queues := map[string]dlq.Queues{}
	for id := range outputs {
		q, err := s.Queues(ctx, "orders", id)
		if err != nil {
			t.Fatal(err)
		}
		queues[id] = q
		targets = append(targets, fanout.NewTarget(s.Config.Jobs[0].Output(id), q.WorkURL))
	}
	snd := &fanout.Sender{SQS: s.Deps.SQS, S3: s.Deps.S3, Bucket: s.Config.Stack.Bucket, MaxBytes: s.Config.Stack.MaxMessageBytes}
	if _, err := snd.Send(ctx, targets, []*change.Envelope{env}, func() error { return nil }); err != nil {
		t.Fatalf("queue the change: %v", err)
	}

	backpressure := &deliver.Error{Class: deliver.Transient, Reason: "http_status", HTTPStatus: 429, Backpressure: true, RetryAfter: time.Second,
		Err: errors.New("too many requests")}
	// Nine failure attributes, the longest texts: with the counter, the
	// ten SQS allows on a message.
	refused := &deliver.Error{Class: deliver.Permanent, Reason: strings.Repeat("r", 2*failure.MaxText),
		Err: errors.New(strings.Repeat("é", failure.MaxText))}
	for id := range outputs {
		t.Run(id, func(t *testing.T) {
			q := queues[id]
			m := receiveOne(t, s, q.WorkURL)
			if got := len(aws.ToString(m.Body)); got != n {
				t.Fatalf("queued a body of %d bytes, want %d (the largest max_message_bytes)", got, n)
			}
			body := aws.ToString(m.Body)

			// Held back on the receive before the last: sent back with
			// the deferral counter, or kept in flight.
			m = holdAs(t, s, q, m, maxReceive-1, backpressure)
			if want := map[bool]string{false: "1", true: ""}[q.FIFO]; aws.ToString(m.Body) != body || attr(m, writer.AttrDeferrals) != want {
				t.Fatalf("held back: body of %d bytes, deferrals %q; want the body and %q", len(aws.ToString(m.Body)), attr(m, writer.AttrDeferrals), want)
			}

			// Refused: to the DLQ with the largest failure record.
			handleAs(t, s, q, m, 1, refused)
			m = receiveOne(t, s, q.DLQURL)
			if aws.ToString(m.Body) != body || attr(m, failure.AttrReason) == "" || attr(m, failure.AttrDocID) == "" {
				t.Fatalf("dead-lettered: body of %d bytes, attributes %v", len(aws.ToString(m.Body)), attrNames(m))
			}
			deleteMessage(t, s, q.DLQURL, m)

			// Redriven with its record, held back again: the record and
			// the counter go back with it; then to the DLQ again.
			redrive := &sqs.SendMessageInput{QueueUrl: &q.WorkURL, MessageBody: m.Body, MessageAttributes: m.MessageAttributes}
			if q.FIFO {
				redrive.MessageGroupId, redrive.MessageDeduplicationId = aws.String(fanout.GroupID(env.DocID)), aws.String("redrive-"+id)
			}
			if _, err := s.Deps.SQS.SendMessage(ctx, redrive); err != nil {
				t.Fatalf("redrive: %v", err)
			}
			m = receiveOne(t, s, q.WorkURL)
			m = holdAs(t, s, q, m, maxReceive-1, backpressure)
			if aws.ToString(m.Body) != body || (!q.FIFO && attr(m, writer.AttrDeferrals) != "1") || attr(m, failure.AttrReason) == "" {
				t.Fatalf("redriven and held back: body of %d bytes, attributes %v", len(aws.ToString(m.Body)), attrNames(m))
			}
			handleAs(t, s, q, m, 1, refused)
			m = receiveOne(t, s, q.DLQURL)
			if aws.ToString(m.Body) != body || attr(m, failure.AttrAttempts) != "2" {
				t.Fatalf("dead-lettered again: body of %d bytes, attempts %q; want the body and 2", len(aws.ToString(m.Body)), attr(m, failure.AttrAttempts))
			}
		})
	}
}

// handleAs hands m to a fresh writer as its receives-th receive, with every
// change failing with fail, and deletes it as the event source mapping
// would. The writer must handle it (send it back or to the DLQ), not leave
// it to be received again.
func handleAs(t *testing.T, s *stack.Stack, q dlq.Queues, m sqstypes.Message, receives int, fail error) {
	t.Helper()
	h := s.Deps.Writer()
	h.Sinks = func(context.Context, config.Route) (deliver.Sink, error) { return failingSink{fail}, nil }
	ev := writer.Event(q.WorkARN, s.Deps.AWS.Region, []sqstypes.Message{m})
	ev.Records[0].Attributes["ApproximateReceiveCount"] = strconv.Itoa(receives)
	resp, err := h.Handle(t.Context(), ev)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BatchItemFailures) != 0 {
		t.Fatalf("the writer could not send the message on (left to be received again): %s", strings.Join(logErrors.FindAllString(s.Logs().Tail(5), -1), "; "))
	}
	if del := writer.DeleteEntries([]sqstypes.Message{m}, resp); len(del) == 1 {
		deleteMessage(t, s, q.WorkURL, m)
	}
}

// holdAs hands m to a fresh writer as its receives-th receive, with every
// change failing with fail, the output asking to slow down, and returns the
// message as it is received next. On a standard queue the writer must send
// it back (handleAs). On a FIFO queue it must keep it in flight and pause
// the output's intake, with an outage record that names m as the probe's
// change; the test then ends the pause, as a probe that found the output
// back does, and makes m visible again.
func holdAs(t *testing.T, s *stack.Stack, q dlq.Queues, m sqstypes.Message, receives int, fail error) sqstypes.Message {
	t.Helper()
	if !q.FIFO {
		handleAs(t, s, q, m, receives, fail)
		return receiveOne(t, s, q.WorkURL)
	}
	ctx := t.Context()
	h := s.Deps.Writer()
	h.Sinks = func(context.Context, config.Route) (deliver.Sink, error) { return failingSink{fail}, nil }
	h.Intake = nopIntake{}
	ev := writer.Event(q.WorkARN, s.Deps.AWS.Region, []sqstypes.Message{m})
	ev.Records[0].Attributes["ApproximateReceiveCount"] = strconv.Itoa(receives)
	resp, err := h.Handle(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BatchItemFailures) != 1 {
		t.Fatalf("the writer handled the held message (%+v), want it kept in flight", resp)
	}
	outages := &outage.Store{DB: s.Deps.DynamoDB, Table: s.Config.TableName()}
	rec, err := outages.Get(ctx, q.Job, q.Output)
	if err != nil {
		t.Fatal(err)
	}
	if rec == nil || rec.Intake != outage.IntakePaused || rec.ProbeMessageID != aws.ToString(m.MessageId) || rec.ProbeBody != "" {
		t.Fatalf("outage record %+v: want the intake paused, naming the message without its body", rec)
	}
	if err := outages.Resuming(ctx, q.Job, q.Output); err != nil {
		t.Fatal(err)
	}
	if ok, err := outages.Resumed(ctx, q.Job, q.Output); err != nil || !ok {
		t.Fatalf("end the pause: %v, %v", ok, err)
	}
	if _, err := s.Deps.SQS.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: &q.WorkURL, ReceiptHandle: m.ReceiptHandle}); err != nil {
		t.Fatal(err)
	}
	return receiveOne(t, s, q.WorkURL)
}

// nopIntake is an intake whose pauses and resumes do nothing.
type nopIntake struct{}

func (nopIntake) Pause(context.Context, config.Route) error  { return nil }
func (nopIntake) Resume(context.Context, config.Route) error { return nil }

// logErrors finds the error of each log line.
var logErrors = regexp.MustCompile(`error="[^"]*"`)

type failingSink struct{ err error }

func (f failingSink) Apply(_ context.Context, cs []*change.Envelope) []error {
	errs := make([]error, len(cs))
	for i := range errs {
		errs[i] = f.err
	}
	return errs
}

// receiveOne receives one message of the queue at url, with its attributes,
// waiting up to a minute for it: a loaded LocalStack takes seconds to move a
// message to its DLQ. The message stays in flight for 15 s, so that one
// received by a request whose answer was lost (the SDK sends it again, and
// the second receive finds the message in flight) comes back within the wait.
func receiveOne(t *testing.T, s *stack.Stack, url string) sqstypes.Message {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		out, err := s.Deps.SQS.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{
			QueueUrl: &url, MaxNumberOfMessages: 1, WaitTimeSeconds: 1, VisibilityTimeout: 15,
			MessageAttributeNames: []string{"All"}, MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) == 1 {
			return out.Messages[0]
		}
	}
	t.Fatalf("no message in %s", url)
	return sqstypes.Message{}
}

func deleteMessage(t *testing.T, s *stack.Stack, url string, m sqstypes.Message) {
	t.Helper()
	if _, err := s.Deps.SQS.DeleteMessage(t.Context(), &sqs.DeleteMessageInput{QueueUrl: &url, ReceiptHandle: m.ReceiptHandle}); err != nil {
		t.Fatal(err)
	}
}

func attr(m sqstypes.Message, name string) string {
	return aws.ToString(m.MessageAttributes[name].StringValue)
}

func attrNames(m sqstypes.Message) []string {
	var names []string
	for k := range m.MessageAttributes {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}
