package localrun

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/writer"
)

// DefaultReceivers is the number of receivers per work queue when
// Options.Concurrency is zero.
const DefaultReceivers = 4

// eventSource plays the Lambda SQS event source mapping of one work queue:
// its receivers long-poll the queue, each invoking the handler with what it
// received, and the messages the handler did not report failed are deleted
// in the background while the receiver already waits for its next batch.
// Failed messages are left to the queue's visibility timeout, receive count
// and redrive policy.
type eventSource struct {
	rt      *Runtime
	h       *writer.Handler
	q       queue
	timeout time.Duration // each invocation's deadline

	deletes sync.WaitGroup
	slots   chan struct{} // bounds the deletes in flight
}

func newEventSource(rt *Runtime, h *writer.Handler, q queue) *eventSource {
	timeout := rt.Opts.WriterTimeout
	if timeout == 0 {
		timeout = rt.Deps.Config.Stack.WriterTimeout.D()
	}
	return &eventSource{rt: rt, h: h, q: q, timeout: timeout, slots: make(chan struct{}, 2*rt.receivers())}
}

func (r *Runtime) receivers() int {
	if r.Opts.Concurrency > 0 {
		return r.Opts.Concurrency
	}
	return DefaultReceivers
}

// run receives until ctx ends, then waits for the deletes in flight.
func (s *eventSource) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range s.rt.receivers() {
		wg.Go(func() { s.receive(ctx) })
	}
	wg.Wait()
	s.deletes.Wait()
}

// receiveMargin is how long a received batch stays hidden past the writer's
// deadline: time for the deletes that follow the handler.
const receiveMargin = 10 * time.Second

// receiveVisibility is the visibility timeout the receivers ask for, in
// seconds: the invocation's deadline plus receiveMargin, within SQS's limits.
func receiveVisibility(timeout time.Duration) int32 {
	s := int64((timeout + receiveMargin + time.Second - 1) / time.Second)
	return int32(min(max(s, 1), 43200))
}

// receive is one receiver: receive a batch, invoke the handler with a
// deadline, hand the deletion of what it did not report failed to the
// background, receive again.
//
// A receive's answer can be lost on its way back (a keep-alive connection
// closed under it: "use of closed network connection"). The SDK retries the
// call, as it should, but SQS already handed out the messages of the lost
// answer, and they stay hidden for their visibility timeout. So a receiver
// does not take the queue's visibility timeout, which is sized for Lambda
// (VisibilityFactor times the writer's timeout): each receive asks for the
// invocation's deadline plus receiveMargin, which the handler and the
// deletes cannot outlast, and a lost batch is back that much sooner. On a
// FIFO queue each receive also carries a ReceiveRequestAttemptId: SQS answers
// the SDK's retry of a receive whose answer was lost with the same messages.
func (s *eventSource) receive(ctx context.Context) {
	c := s.rt.Deps.SQS
	visibility := receiveVisibility(s.timeout)
	// A receive is never cancelled midway: SQS may already have handed the
	// messages out, and a dropped answer would hide them until they come
	// back. Stopping waits for the current long poll instead.
	rctx := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		in := &sqs.ReceiveMessageInput{
			QueueUrl:                    &s.q.url,
			MaxNumberOfMessages:         int32(min(s.q.out.BatchSize, receiveLimit)),
			WaitTimeSeconds:             1,
			VisibilityTimeout:           visibility,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
			MessageAttributeNames:       []string{"All"},
		}
		if s.q.out.FIFO() {
			in.ReceiveRequestAttemptId = aws.String(attemptID())
		}
		out, err := c.ReceiveMessage(rctx, in)
		if err != nil {
			if ctx.Err() == nil {
				s.rt.Log.Warn("receive messages", "queue", s.q.name, "error", err)
				_ = clock.Sleep(ctx, time.Second)
			}
			continue
		}
		if len(out.Messages) == 0 {
			continue
		}
		// In flight from the receive until the deletion is done, so that
		// --until-idle never sees a drained queue with work still pending.
		s.rt.inflight.Add(1)
		msgs := s.gather(rctx, in, out.Messages)
		del := s.invoke(ctx, msgs)
		if len(del) == 0 {
			s.rt.inflight.Add(-1)
			continue
		}
		s.slots <- struct{}{}
		s.deletes.Add(1)
		go func() {
			defer s.deletes.Done()
			defer s.rt.inflight.Add(-1)
			defer func() { <-s.slots }()
			s.delete(ctx, del)
		}()
	}
}

// receiveLimit is SQS's cap on the messages of one ReceiveMessage.
const receiveLimit = 10

// batchingWindow is how long a batch larger than receiveLimit is gathered,
// as the event source mapping's MaximumBatchingWindow (the stack sets one
// second).
const batchingWindow = time.Second

// gather tops a full receive up to the output's batch size with more
// receives, for at most batchingWindow, as the event source mapping gathers
// batches of more than ten messages. It stops early when the queue has no
// more to give: waiting would only delay the batch.
func (s *eventSource) gather(ctx context.Context, first *sqs.ReceiveMessageInput, msgs []sqstypes.Message) []sqstypes.Message {
	want := s.q.out.BatchSize
	if want <= receiveLimit || len(msgs) < receiveLimit {
		return msgs
	}
	deadline := time.Now().Add(batchingWindow)
	for len(msgs) < want && time.Now().Before(deadline) {
		in := *first
		in.MaxNumberOfMessages = int32(min(want-len(msgs), receiveLimit))
		in.WaitTimeSeconds = 0
		if s.q.out.FIFO() {
			in.ReceiveRequestAttemptId = aws.String(attemptID())
		}
		out, err := s.rt.Deps.SQS.ReceiveMessage(ctx, &in)
		if err != nil || len(out.Messages) == 0 {
			break
		}
		msgs = append(msgs, out.Messages...)
	}
	return msgs
}

// attemptID returns a fresh ReceiveRequestAttemptId.
func attemptID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// invoke runs the handler on one batch and returns the messages to delete.
func (s *eventSource) invoke(ctx context.Context, msgs []sqstypes.Message) []sqstypes.DeleteMessageBatchRequestEntry {
	ev := writer.Event(s.q.arn, s.rt.Deps.AWS.Region, msgs)
	// The messages stay with us even if the run is stopping: finish the batch.
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	start := time.Now()
	resp, err := s.h.Handle(ictx, ev)
	s.rt.invoked.Add(1)
	s.rt.handling.Add(int64(time.Since(start)))
	if err != nil {
		s.rt.Log.Error("writer invocation failed; batch will be retried", "queue", s.q.name, "error", err)
		return nil
	}
	return writer.DeleteEntries(msgs, resp)
}

// delete removes handled messages from the queue, ten per
// DeleteMessageBatch. A message whose deletion fails is delivered again
// after its visibility timeout, which the sinks absorb.
func (s *eventSource) delete(ctx context.Context, del []sqstypes.DeleteMessageBatchRequestEntry) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	for chunk := range slices.Chunk(del, receiveLimit) {
		d, err := s.rt.Deps.SQS.DeleteMessageBatch(dctx, &sqs.DeleteMessageBatchInput{QueueUrl: &s.q.url, Entries: chunk})
		if err != nil {
			s.rt.Log.Warn("delete messages", "queue", s.q.name, "error", err)
			continue
		}
		for _, f := range d.Failed {
			s.rt.Log.Warn("delete message", "queue", s.q.name, "code", aws.ToString(f.Code))
		}
	}
}
