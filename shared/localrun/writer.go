package localrun

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// DefaultReceivers is the number of writer loops (receivers) per work queue
// when Options.Concurrency is zero.
const DefaultReceivers = 4

func (r *Runtime) receivers() int {
	if r.Opts.Concurrency > 0 {
		return r.Opts.Concurrency
	}
	return DefaultReceivers
}

// receiveLimit is SQS's cap on the messages of one ReceiveMessage (and on the
// entries of one DeleteMessageBatch).
const receiveLimit = 10

// batchingWindow is how long a batch larger than receiveLimit is gathered,
// as the event source mapping's MaximumBatchingWindow (the stack sets one
// second).
const batchingWindow = time.Second

// gather tops a full receive up to the output's batch size with more
// receives, for at most batchingWindow, as the event source mapping gathers
// batches of more than ten messages (standard queues only: a FIFO queue's
// batch is at most ten). It stops early when the queue has no more to give:
// waiting would only delay the batch.
func (r *Runtime) gather(ctx context.Context, q queue, first *sqs.ReceiveMessageInput, msgs []sqstypes.Message) []sqstypes.Message {
	want := q.out.BatchSize
	if want <= receiveLimit || len(msgs) < receiveLimit || q.out.FIFO() {
		return msgs
	}
	deadline := time.Now().Add(batchingWindow)
	for len(msgs) < want && time.Now().Before(deadline) {
		in := *first
		in.MaxNumberOfMessages = int32(min(want-len(msgs), receiveLimit))
		in.WaitTimeSeconds = 0
		out, err := r.Deps.SQS.ReceiveMessage(ctx, &in)
		if err != nil || len(out.Messages) == 0 {
			break
		}
		msgs = append(msgs, out.Messages...)
	}
	return msgs
}

// deleter deletes the handled messages of one work queue in the background,
// ten per DeleteMessageBatch, at most a bounded number of batches at once.
// Each batch handed to delete was counted in flight by its writer loop; the
// deleter ends that when the batch is deleted.
type deleter struct {
	r     *Runtime
	q     queue
	wg    sync.WaitGroup
	slots chan struct{}
}

func newDeleter(r *Runtime, q queue, receivers int) *deleter {
	return &deleter{r: r, q: q, slots: make(chan struct{}, 2*receivers)}
}

// delete removes del from the queue in the background. A message whose
// deletion fails is delivered again after its visibility timeout, which the
// sinks absorb.
func (d *deleter) delete(ctx context.Context, del []sqstypes.DeleteMessageBatchRequestEntry) {
	if len(del) == 0 {
		d.r.inflight.Add(-1)
		return
	}
	d.slots <- struct{}{}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer d.r.inflight.Add(-1)
		defer func() { <-d.slots }()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), receiveMargin)
		defer cancel()
		for chunk := range slices.Chunk(del, receiveLimit) {
			out, err := d.r.Deps.SQS.DeleteMessageBatch(dctx, &sqs.DeleteMessageBatchInput{QueueUrl: &d.q.url, Entries: chunk})
			if err != nil {
				d.r.Log.Warn("delete messages", "queue", d.q.name, "error", err)
				continue
			}
			for _, f := range out.Failed {
				d.r.Log.Warn("delete message", "queue", d.q.name, "code", aws.ToString(f.Code))
			}
		}
	}()
}

// wait waits for the deletions under way.
func (d *deleter) wait() { d.wg.Wait() }
