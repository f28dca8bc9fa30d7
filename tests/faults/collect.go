package faults

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/writer"
)

// Message is one message a poller queued, as the writer received it.
type Message struct {
	ID         string // SQS message id
	DocID      string
	Rev        string
	Seq        string // the feed seq, as raw JSON
	Deleted    bool
	Version    change.Version
	EnqueuedAt time.Time // the sender's clock (skewed with --clock-skew)
	Sent       time.Time // SQS SentTimestamp: the server's clock when it accepted the message
}

// Collector is the stack's writer: it runs the real writer handler (the
// PostgreSQL sink) on batches received from the work queue, as the local
// runtime does, and records every message it receives (its envelope and its
// SQS send time) before handing it over. Running it while the pollers run
// keeps the queue short (the emulator's receive slows down with its length).
type Collector struct {
	stack   *Stack
	handler *writer.Handler
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu     sync.Mutex
	msgs   map[string]Message
	errors []string
}

// StartCollector starts loops receive-and-deliver loops on the work queue.
func (s *Stack) StartCollector(ctx context.Context, loops int) *Collector {
	ctx, cancel := context.WithCancel(ctx)
	c := &Collector{stack: s, handler: s.Deps.Writer(), cancel: cancel, msgs: map[string]Message{}}
	for range loops {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.loop(ctx)
		}()
	}
	return c
}

func (c *Collector) loop(ctx context.Context) {
	q := c.stack.Deps.SQS
	// A receive is never cancelled midway, so no answer is dropped with
	// messages in it; stopping waits for the current long poll.
	rctx := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		out, err := q.ReceiveMessage(rctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    &c.stack.QueueURL,
			MaxNumberOfMessages:         10,
			WaitTimeSeconds:             1,
			VisibilityTimeout:           30,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		if err != nil {
			c.fail("receive: %v", err)
			_ = clock.Sleep(ctx, time.Second)
			continue
		}
		if len(out.Messages) > 0 {
			c.deliver(rctx, out.Messages)
		}
	}
}

func (c *Collector) fail(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errors) < 20 {
		c.errors = append(c.errors, fmt.Sprintf(format, args...))
	}
}

func (c *Collector) deliver(ctx context.Context, msgs []sqstypes.Message) {
	for _, m := range msgs {
		c.record(m)
	}
	ev := writer.Event(c.stack.QueueARN, "", msgs)
	ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := c.handler.Handle(ictx, ev)
	if err != nil {
		c.fail("writer: %v", err)
		return // the messages come back after their visibility timeout
	}
	del := writer.DeleteEntries(msgs, resp)
	if len(del) == 0 {
		return
	}
	if _, err := c.stack.Deps.SQS.DeleteMessageBatch(ictx, &sqs.DeleteMessageBatchInput{QueueUrl: &c.stack.QueueURL, Entries: del}); err != nil {
		c.fail("delete: %v", err)
	}
}

func (c *Collector) record(m sqstypes.Message) {
	id := aws.ToString(m.MessageId)
	env, err := change.Decode([]byte(aws.ToString(m.Body)))
	if err != nil {
		c.fail("message %s: %v", id, err)
		return
	}
	ms, _ := strconv.ParseInt(m.Attributes[string(sqstypes.MessageSystemAttributeNameSentTimestamp)], 10, 64)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.msgs[id]; ok {
		return // received again
	}
	c.msgs[id] = Message{
		ID: id, DocID: env.DocID, Rev: env.Rev, Seq: string(env.Seq), Deleted: env.Tombstone(),
		Version: env.Version, EnqueuedAt: env.EnqueuedAt, Sent: time.UnixMilli(ms),
	}
}

// Drain waits until the work queue is empty and no batch is being
// delivered (three checks in a row, half a second apart).
func (c *Collector) Drain(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	streak := 0
	for streak < 3 {
		if err := clock.Sleep(ctx, 500*time.Millisecond); err != nil {
			d, _ := dlq.QueueDepth(context.WithoutCancel(ctx), c.stack.Deps.SQS, c.stack.QueueURL)
			return fmt.Errorf("work queue not drained within %s (%d messages left)", timeout, d.Total())
		}
		d, err := dlq.QueueDepth(ctx, c.stack.Deps.SQS, c.stack.QueueURL)
		if err != nil {
			return err
		}
		n := d.Total()
		// Received messages count as not visible until deleted, so an
		// empty queue means nothing is being delivered either.
		if n == 0 {
			streak++
		} else {
			streak = 0
		}
	}
	return nil
}

// Stop ends the loops (each finishes its current batch).
func (c *Collector) Stop() {
	c.cancel()
	c.wg.Wait()
}

// Messages returns every message received, ordered by send time.
func (c *Collector) Messages() []Message {
	c.mu.Lock()
	out := make([]Message, 0, len(c.msgs))
	for _, m := range c.msgs {
		out = append(out, m)
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Sent.Equal(out[j].Sent) {
			return out[i].Sent.Before(out[j].Sent)
		}
		return out[i].Version.Compare(out[j].Version) < 0
	})
	return out
}

// Errors are the collector's receive, decode and delivery failures.
func (c *Collector) Errors() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.errors...)
}

// Stats are the writer handler's counters.
func (c *Collector) Stats() writer.Stats {
	return c.handler.Stats()[Job+"/"+Output]
}
