// Package dlq inspects and empties the dead-letter queue of one (job, output):
// it decodes the failed changes with the reasons the writer recorded (a
// failure.Record in the message attributes), groups them by reason,
// moves them back to the output's work queue (Redriver), and purges them.
//
// The DLQ message body is the original envelope, untouched, so a redriven
// change keeps its observation version: the output's monotonic apply ignores
// it when the output already holds something newer, and a stale revision
// coming back from the DLQ can never regress an output.
package dlq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/failure"
)

// SQS is the part of the SQS client this package calls.
type SQS interface {
	GetQueueUrl(ctx context.Context, in *sqs.GetQueueUrlInput, optFns ...func(*sqs.Options)) (*sqs.GetQueueUrlOutput, error)
	GetQueueAttributes(ctx context.Context, in *sqs.GetQueueAttributesInput, optFns ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, optFns ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, optFns ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
	DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, optFns ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
	ChangeMessageVisibilityBatch(ctx context.Context, in *sqs.ChangeMessageVisibilityBatchInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityBatchOutput, error)
	PurgeQueue(ctx context.Context, in *sqs.PurgeQueueInput, optFns ...func(*sqs.Options)) (*sqs.PurgeQueueOutput, error)
	StartMessageMoveTask(ctx context.Context, in *sqs.StartMessageMoveTaskInput, optFns ...func(*sqs.Options)) (*sqs.StartMessageMoveTaskOutput, error)
	ListMessageMoveTasks(ctx context.Context, in *sqs.ListMessageMoveTasksInput, optFns ...func(*sqs.Options)) (*sqs.ListMessageMoveTasksOutput, error)
	CancelMessageMoveTask(ctx context.Context, in *sqs.CancelMessageMoveTaskInput, optFns ...func(*sqs.Options)) (*sqs.CancelMessageMoveTaskOutput, error)
}

// Queues are the work queue and the DLQ of one (job, output).
type Queues struct {
	Job, Output string
	FIFO        bool
	// Total: the output orders its whole feed in one message group
	// (ordering total).
	Total bool

	WorkName, WorkURL, WorkARN string
	DLQName, DLQURL, DLQARN    string
}

// Resolve finds the URLs and ARNs of the queues of (j, o), named as
// config.File.QueueName and DLQName name them.
func Resolve(ctx context.Context, c SQS, f *config.File, j *config.Job, o *config.Output) (Queues, error) {
	q := Queues{Job: j.ID, Output: o.ID, FIFO: o.FIFO(), Total: o.Ordering == config.OrderingTotal, WorkName: f.QueueName(j, o), DLQName: f.DLQName(j, o)}
	var err error
	if q.WorkURL, q.WorkARN, err = queue(ctx, c, q.WorkName); err != nil {
		return q, err
	}
	if q.DLQURL, q.DLQARN, err = queue(ctx, c, q.DLQName); err != nil {
		return q, err
	}
	return q, nil
}

func queue(ctx context.Context, c SQS, name string) (url, arn string, err error) {
	u, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		return "", "", fmt.Errorf("get queue url %s: %w", name, err)
	}
	url = aws.ToString(u.QueueUrl)
	a, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: &url, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn},
	})
	if err != nil {
		return "", "", fmt.Errorf("get queue arn %s: %w", name, err)
	}
	return url, a.Attributes[string(sqstypes.QueueAttributeNameQueueArn)], nil
}

// Depth is how many messages a queue holds, by state (SQS's approximate counts).
type Depth struct {
	Visible  int `json:"visible"`
	InFlight int `json:"in_flight"`
	Delayed  int `json:"delayed"`
}

// Total is every message the queue holds.
func (d Depth) Total() int { return d.Visible + d.InFlight + d.Delayed }

// QueueDepth reads a queue's approximate message counts.
func QueueDepth(ctx context.Context, c SQS, url string) (Depth, error) {
	a, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: &url,
		AttributeNames: []sqstypes.QueueAttributeName{
			sqstypes.QueueAttributeNameApproximateNumberOfMessages,
			sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
			sqstypes.QueueAttributeNameApproximateNumberOfMessagesDelayed,
		},
	})
	if err != nil {
		return Depth{}, fmt.Errorf("get queue depth: %w", err)
	}
	n := func(k sqstypes.QueueAttributeName) int {
		v, _ := strconv.Atoi(a.Attributes[string(k)])
		return v
	}
	return Depth{
		Visible:  n(sqstypes.QueueAttributeNameApproximateNumberOfMessages),
		InFlight: n(sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible),
		Delayed:  n(sqstypes.QueueAttributeNameApproximateNumberOfMessagesDelayed),
	}, nil
}

// Message is one decoded DLQ message.
type Message struct {
	ID      string    `json:"message_id"`
	SentAt  time.Time `json:"sent_at,omitzero"` // when it entered the DLQ
	GroupID string    `json:"group_id,omitempty"`
	// Receives counts the DLQ's own receives (inspection included).
	Receives int            `json:"dlq_receives"`
	Failure  failure.Record `json:"failure"`
	// Envelope is the change, nil when the body is not JSON. It is set, with
	// EnvelopeError, when the body is JSON but not a valid envelope.
	Envelope      *change.Envelope `json:"envelope,omitempty"`
	EnvelopeError string           `json:"envelope_error,omitempty"`
	BodyBytes     int              `json:"body_bytes"`
	// Archived is set for a message read from the DLQ's archive (Archive):
	// it left the DLQ for the archive then.
	Archived *Archived `json:"archived,omitempty"`
	// ClaimCheckError, for an archived message whose envelope names a
	// claim check, says why the archive could not keep its content.
	ClaimCheckError string `json:"claim_check_error,omitempty"`

	body          string
	receiptHandle string
	attributes    map[string]sqstypes.MessageAttributeValue
	sequence      string // FIFO sequence number in the DLQ
	claimCheck    []byte // an archived message's claim check content
}

// Body is the message body exactly as queued: the envelope JSON, document
// body included. Never log it.
func (m *Message) Body() string { return m.body }

// DocID is the envelope's document id, else the one the writer recorded.
func (m *Message) DocID() string {
	if m.Envelope != nil && m.Envelope.DocID != "" {
		return m.Envelope.DocID
	}
	return m.Failure.DocID
}

// Decode turns a received SQS message into a Message.
func Decode(m sqstypes.Message) Message {
	out := Message{
		ID:            aws.ToString(m.MessageId),
		GroupID:       m.Attributes[string(sqstypes.MessageSystemAttributeNameMessageGroupId)],
		body:          aws.ToString(m.Body),
		receiptHandle: aws.ToString(m.ReceiptHandle),
		attributes:    m.MessageAttributes,
	}
	out.BodyBytes = len(out.body)
	if ms, err := strconv.ParseInt(m.Attributes[string(sqstypes.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil {
		out.SentAt = time.UnixMilli(ms).UTC()
	}
	out.Receives, _ = strconv.Atoi(m.Attributes[string(sqstypes.MessageSystemAttributeNameApproximateReceiveCount)])
	out.sequence = m.Attributes[string(sqstypes.MessageSystemAttributeNameSequenceNumber)]

	out.Failure = failure.Parse(failure.SQSValues(m.MessageAttributes))

	var env change.Envelope
	if err := json.Unmarshal([]byte(out.body), &env); err != nil {
		out.EnvelopeError = fmt.Sprintf("body is not JSON: %v", err)
		return out
	}
	out.Envelope = &env
	if err := env.Check(); err != nil {
		out.EnvelopeError = err.Error()
	}
	return out
}

// ScanOptions bound a Scan.
type ScanOptions struct {
	// Max stops the scan after this many messages; 0 means DefaultScanMax.
	Max int
	// Visibility hides each message received for this long, so that one
	// scan sees each message once; default DefaultScanVisibility. Messages
	// are made visible again when the scan ends.
	Visibility time.Duration
}

// Scan defaults.
const (
	DefaultScanMax        = 10000
	DefaultScanVisibility = 60 * time.Second
)

// Scan receives the DLQ's messages, each once, and calls fn for each until
// fn returns false, Max messages were seen, or the queue has no more visible
// messages. It then makes every message it received visible again, so it
// moves and deletes nothing; each message's DLQ receive count goes up by one
// (harmless: a DLQ has no redrive policy). While a scan runs, the messages it
// holds are hidden from other readers of the DLQ (a redrive).
//
// On a FIFO DLQ only the first message of each group (document) can be
// received while the scan holds it, so a scan sees one failure per document.
// Scan is safe for concurrent use; concurrent scans see disjoint messages.
func Scan(ctx context.Context, c SQS, url string, opts ScanOptions, fn func(Message) bool) (int, error) {
	if opts.Max <= 0 {
		opts.Max = DefaultScanMax
	}
	if opts.Visibility <= 0 {
		opts.Visibility = DefaultScanVisibility
	}
	seen := map[string]bool{}
	var held []sqstypes.Message
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = release(rctx, c, url, held)
	}()
	for len(seen) < opts.Max {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    &url,
			MaxNumberOfMessages:         int32(min(10, opts.Max-len(seen))),
			WaitTimeSeconds:             1,
			VisibilityTimeout:           int32(opts.Visibility / time.Second),
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
			MessageAttributeNames:       []string{"All"},
		})
		if err != nil {
			return len(seen), fmt.Errorf("receive from dlq: %w", err)
		}
		if len(out.Messages) == 0 {
			return len(seen), nil
		}
		held = append(held, out.Messages...)
		for _, m := range out.Messages {
			id := aws.ToString(m.MessageId)
			if seen[id] {
				continue
			}
			seen[id] = true
			if !fn(Decode(m)) {
				return len(seen), nil
			}
		}
	}
	return len(seen), nil
}

// release makes received messages visible again at once.
func release(ctx context.Context, c SQS, url string, msgs []sqstypes.Message) error {
	var errs []error
	for chunk := range slices.Chunk(msgs, 10) {
		entries := make([]sqstypes.ChangeMessageVisibilityBatchRequestEntry, len(chunk))
		for i, m := range chunk {
			entries[i] = sqstypes.ChangeMessageVisibilityBatchRequestEntry{
				Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0,
			}
		}
		if _, err := c.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: &url, Entries: entries}); err != nil {
			errs = append(errs, fmt.Errorf("release dlq messages: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Group is the DLQ messages that failed for one reason.
type Group struct {
	Class      string    `json:"class"`
	Reason     string    `json:"reason"`
	HTTPStatus int       `json:"http_status,omitempty"`
	SQLState   string    `json:"sql_state,omitempty"`
	Count      int       `json:"count"`
	Archived   int       `json:"archived"` // of Count, those read from the DLQ's archive
	Samples    []string  `json:"sample_doc_ids"`
	Error      string    `json:"error"` // the most recent failure's error text
	FirstAt    time.Time `json:"first_failure_at,omitzero"`
	LastAt     time.Time `json:"last_failure_at,omitzero"`
}

// Summarize groups messages by (class, reason, HTTP status, SQL state),
// largest group first, keeping up to samples distinct document ids per
// group.
func Summarize(msgs []Message, samples int) []Group {
	type key struct {
		class, reason string
		status        int
		state         string
	}
	byKey := map[key]*Group{}
	var order []key
	for _, m := range msgs {
		f := m.Failure
		k := key{f.Class, f.Reason, f.HTTPStatus, f.SQLState}
		g := byKey[k]
		if g == nil {
			g = &Group{Class: f.Class, Reason: f.Reason, HTTPStatus: f.HTTPStatus, SQLState: f.SQLState, Samples: []string{}}
			if !f.Recorded() {
				g.Error = "no reason recorded: the queue's redrive policy moved it (the writer failed or timed out on every receive)"
			}
			byKey[k] = g
			order = append(order, k)
		}
		g.Count++
		if m.Archived != nil {
			g.Archived++
		}
		if id := m.DocID(); id != "" && len(g.Samples) < samples && !slices.Contains(g.Samples, id) {
			g.Samples = append(g.Samples, id)
		}
		last := f.LastAt
		if last.IsZero() {
			last = m.SentAt
		}
		first := f.FirstAt
		if first.IsZero() {
			first = last
		}
		if f.Error != "" && (g.LastAt.IsZero() || !last.Before(g.LastAt)) {
			g.Error = f.Error
		}
		if g.FirstAt.IsZero() || (!first.IsZero() && first.Before(g.FirstAt)) {
			g.FirstAt = first
		}
		if last.After(g.LastAt) {
			g.LastAt = last
		}
	}
	out := make([]Group, 0, len(order))
	for _, k := range order {
		out = append(out, *byKey[k])
	}
	slices.SortStableFunc(out, func(a, b Group) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Class+a.Reason, b.Class+b.Reason)
	})
	return out
}

// Purge deletes every message of the DLQ, in flight or not. SQS allows one
// purge per queue every 60 seconds and may take that long to complete.
func Purge(ctx context.Context, c SQS, url string) error {
	if _, err := c.PurgeQueue(ctx, &sqs.PurgeQueueInput{QueueUrl: &url}); err != nil {
		return fmt.Errorf("purge dlq: %w", err)
	}
	return nil
}
