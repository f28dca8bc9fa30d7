// Package localrun hosts the poller and writer handlers on one machine with
// the contracts Lambda gives them: the poller runs on a schedule tick with a
// deadline (so a new invocation overlaps the previous one and stands by), and
// the writer is fed by an SQS long-poll loop that hands it batches, deletes
// only the messages it did not report failed, and leaves the rest to the
// queue's visibility timeout, receive count and redrive policy. The loops of
// a work queue stop receiving while the writer has paused the queue's intake
// (the event source mapping turned off, on Lambda), and the writer's probe
// runs on a ticker, as its schedule runs it on Lambda.
package localrun

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/writer"
)

// Options control a run.
type Options struct {
	// Jobs restricts the run to these job ids; empty means every job.
	Jobs []string
	// Tick is the schedule interval. Default: each job's schedule.
	Tick time.Duration
	// PollerTimeout is each poller invocation's deadline. Default: each
	// job's poller timeout (config.File.PollerTimeout).
	PollerTimeout time.Duration
	// WriterTimeout is each writer invocation's deadline. Default: the stack's.
	WriterTimeout time.Duration
	// NoPoller / NoWriter run only one side (fault tests run pollers as
	// separate processes).
	NoPoller, NoWriter bool
	// UntilIdle stops the run, successfully, once every job is caught up and
	// every work queue is drained, or with an error once maxFailedPolls of
	// a job's poller invocations in a row failed: one that fails is tried
	// again at the next tick, as on Lambda.
	UntilIdle bool
	// Concurrency is the number of receivers (writer loops) per work queue,
	// each invoking the writer on the batches it receives. Default
	// DefaultReceivers.
	Concurrency int
	// ProbeEvery is how often the writer probes the outputs whose intake it
	// paused. Default DefaultProbeEvery.
	ProbeEvery time.Duration
}

// Runtime runs pipelines locally.
type Runtime struct {
	Deps *pipeline.Deps
	Opts Options
	Log  *slog.Logger

	invocations atomic.Int64
	inflight    atomic.Int64
	read        atomic.Int64
	enqueued    atomic.Int64
	invoked     atomic.Int64 // writer invocations
	handling    atomic.Int64 // time.Duration the writer spent in them
	polled      atomic.Int64 // poller invocations that ended
	polling     atomic.Int64 // time.Duration they ran
	writer      *writer.Handler
	intake      pauses
	mu          sync.Mutex
	caughtUp    map[string]bool
	failedPolls map[string]int // by job: its invocations that failed in a row
}

// Run runs until ctx ends or, with UntilIdle, until the pipelines are idle.
func (r *Runtime) Run(ctx context.Context) error {
	f := r.Deps.Config
	var jobs []*config.Job
	for _, j := range f.Jobs {
		if len(r.Opts.Jobs) == 0 || contains(r.Opts.Jobs, j.ID) {
			jobs = append(jobs, j)
		}
	}
	if len(jobs) == 0 {
		return errors.New("run: no job matches")
	}
	r.caughtUp = map[string]bool{}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 64)
	var wg sync.WaitGroup

	var queues []queue
	if !r.Opts.NoWriter {
		h := r.Deps.Writer()
		h.Intake = &r.intake
		r.writer = h
		wg.Go(func() { r.probe(ctx, h, jobs) })
		for _, j := range jobs {
			for _, o := range j.Outputs {
				q, err := r.queue(ctx, f.QueueName(j, o), o)
				if err != nil {
					return err
				}
				q.job = j.ID
				queues = append(queues, q)
				n := r.receivers()
				dels := newDeleter(r, q, n)
				wg.Go(func() {
					var loops sync.WaitGroup
					for i := range n {
						loops.Go(func() { r.writerLoop(ctx, h, q, i, n, dels) })
					}
					loops.Wait()
					dels.wait()
				})
			}
		}
	}
	if !r.Opts.NoPoller {
		r.Deps.OnBatch = r.batchDone
		for _, j := range jobs {
			if err := r.Deps.PreparePoller(ctx, j.ID); err != nil {
				return err
			}
			wg.Go(func() { r.schedule(ctx, j, errc) })
		}
	}
	var err error
	if r.Opts.UntilIdle {
		err = r.waitIdle(ctx, jobs, queues, errc)
		cancel()
	} else {
		select {
		case <-ctx.Done():
		case err = <-errc:
			cancel()
		}
	}
	wg.Wait()
	return err
}

// Summary is what a run did.
type Summary struct {
	Read, Enqueued int64
	Outputs        map[string]writer.Stats // by "job/output"
	// WriterInvocations is the number of batches handed to the writer, and
	// WriterTime the time it spent on them: what Lambda would bill.
	WriterInvocations int64
	WriterTime        time.Duration
	// PollerInvocations is the number of poller invocations that ended,
	// and PollerTime how long they ran: what Lambda would bill.
	PollerInvocations int64
	PollerTime        time.Duration
}

// Summary returns the counters of the run so far.
func (r *Runtime) Summary() Summary {
	s := Summary{Read: r.read.Load(), Enqueued: r.enqueued.Load(),
		WriterInvocations: r.invoked.Load(), WriterTime: time.Duration(r.handling.Load()),
		PollerInvocations: r.polled.Load(), PollerTime: time.Duration(r.polling.Load())}
	if r.writer != nil {
		s.Outputs = r.writer.Stats()
	}
	return s
}

// batchDone records whether a job is caught up after a poller's batch.
func (r *Runtime) batchDone(job string, caughtUp bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.caughtUp[job] = caughtUp
}

// schedule starts a poller invocation at every tick, as EventBridge does.
func (r *Runtime) schedule(ctx context.Context, j *config.Job, errc chan<- error) {
	tick := r.Opts.Tick
	if tick == 0 {
		tick = j.Schedule.D()
	}
	host := pipeline.Hostname()
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		n := r.invocations.Add(1)
		owner := fmt.Sprintf("local-%s-%d-%d", host, os.Getpid(), n)
		wg.Go(func() { r.poll(ctx, j, owner, errc) })
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// poll runs one poller invocation through the Lambda handler, with what
// Lambda gives it: the schedule event, and a context carrying the request
// id (the owner) and the deadline.
func (r *Runtime) poll(ctx context.Context, j *config.Job, owner string, errc chan<- error) {
	timeout := r.Opts.PollerTimeout
	if timeout == 0 {
		timeout = r.Deps.Config.PollerTimeout(j)
	}
	ictx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ictx = lambdacontext.NewContext(ictx, &lambdacontext.LambdaContext{AwsRequestID: owner})
	start := time.Now()
	res, err := r.Deps.HandleSchedule(ictx, pipeline.ScheduleEvent{Job: j.ID})
	r.polled.Add(1)
	r.polling.Add(int64(time.Since(start)))
	r.read.Add(int64(res.Read))
	r.enqueued.Add(int64(res.Enqueued))
	if ctx.Err() != nil {
		return
	}
	if failed := r.pollFailed(j.ID, err, res.Role); err != nil {
		r.Log.Error("poller invocation failed", "job", j.ID, "owner", owner, "error", err, "failed_in_a_row", failed)
		if !r.Opts.UntilIdle || failed < maxFailedPolls {
			return // as on Lambda: the next tick tries again
		}
		select {
		case errc <- fmt.Errorf("%d poller invocations in a row failed, the last: %w", failed, err):
		default:
		}
		return
	}
	r.Log.Debug("poller invocation ended", "job", j.ID, "owner", owner, "role", res.Role, "read", res.Read, "enqueued", res.Enqueued)
}

// maxFailedPolls is how many of a job's poller invocations in a row fail
// before a run with UntilIdle gives up: one can fail on a slow moment of a
// service (its deadline reached), as the next tick would on Lambda.
const maxFailedPolls = 3

// pollFailed counts a job's poller invocations that failed in a row and
// returns the count. An invocation that was active and ended without error
// sets it back to zero; one that stood by leaves it, as standing by says
// nothing of whether the job can be polled.
func (r *Runtime) pollFailed(job string, err error, role string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failedPolls == nil {
		r.failedPolls = map[string]int{}
	}
	switch {
	case err != nil:
		r.failedPolls[job]++
	case role == "active":
		r.failedPolls[job] = 0
	}
	return r.failedPolls[job]
}

type queue struct {
	name, url, arn string
	job            string
	out            *config.Output
}

func (r *Runtime) queue(ctx context.Context, name string, o *config.Output) (queue, error) {
	c := r.Deps.SQS
	u, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		return queue{}, fmt.Errorf("get queue url %s in region %s (check the region and stack.prefix; on the local services, changesctl bootstrap creates the queues): %w", name, r.Deps.AWS.Region, err)
	}
	a, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: u.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn},
	})
	if err != nil {
		return queue{}, fmt.Errorf("get queue arn %s: %w", name, err)
	}
	return queue{name: name, url: aws.ToString(u.QueueUrl), arn: a.Attributes["QueueArn"], out: o}, nil
}

// receiveMargin is how long a received batch stays hidden past the writer's
// deadline: time for the deletes that follow the handler.
const receiveMargin = 10 * time.Second

// receiveVisibility is the visibility timeout the writer loop asks for, in
// seconds: the invocation's deadline plus receiveMargin, within SQS's limits.
func receiveVisibility(timeout time.Duration) int32 {
	s := int64((timeout + receiveMargin + time.Second - 1) / time.Second)
	return int32(min(max(s, 1), 43200))
}

// writerLoop is the Lambda SQS event source: receive a batch, invoke the
// handler with a deadline, delete what it did not report as failed.
//
// A receive's answer can be lost on its way back (a keep-alive connection
// closed under it: "use of closed network connection"). The SDK retries the
// call, as it should, but SQS already handed out the messages of the lost
// answer, and they stay hidden for their visibility timeout. So the loop
// does not take the queue's visibility timeout, which is sized for Lambda
// (VisibilityFactor times the writer's timeout): each receive asks for the
// invocation's deadline plus receiveMargin, which the handler and the
// deletes cannot outlast, and a lost batch is back that much sooner. On a
// FIFO queue each receive also carries a ReceiveRequestAttemptId: SQS answers
// the SDK's retry of a receive whose answer was lost with the same messages.
//
// Loop i of n receives only while i is below the output's receiver limit: a
// struggling output (writer backpressure) is fed by fewer loops, down to
// one, until it recovers.
//
// A batch larger than ten messages is gathered from several receives
// (gather), and what the handler did not report failed is deleted in the
// background (deleter) while the loop already waits for its next batch.
func (r *Runtime) writerLoop(ctx context.Context, h *writer.Handler, q queue, i, n int, dels *deleter) {
	c := r.Deps.SQS
	timeout := r.Opts.WriterTimeout
	if timeout == 0 {
		timeout = r.Deps.Config.Stack.WriterTimeout.D()
	}
	visibility := receiveVisibility(timeout)
	// A receive is never cancelled midway: SQS may already have handed the
	// messages out, and a dropped answer would hide them until they come
	// back. Stopping waits for the current long poll instead.
	rctx := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		if i >= h.ReceiverLimit(q.job, q.out.ID, n) || r.intake.paused(q.job, q.out.ID) {
			_ = clock.Sleep(ctx, receiverIdle)
			continue
		}
		in := &sqs.ReceiveMessageInput{
			QueueUrl:                    &q.url,
			MaxNumberOfMessages:         int32(min(q.out.BatchSize, receiveLimit)),
			WaitTimeSeconds:             1,
			VisibilityTimeout:           visibility,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
			MessageAttributeNames:       []string{"All"},
		}
		if q.out.FIFO() {
			in.ReceiveRequestAttemptId = aws.String(attemptID())
		}
		out, err := c.ReceiveMessage(rctx, in)
		if err != nil {
			if ctx.Err() == nil {
				r.Log.Warn("receive messages", "queue", q.name, "error", err)
				_ = clock.Sleep(ctx, time.Second)
			}
			continue
		}
		if len(out.Messages) == 0 {
			continue
		}
		// In flight from the receive until the deletion is done, so that
		// --until-idle never sees a drained queue with work still pending.
		r.inflight.Add(1)
		msgs := r.gather(rctx, q, in, out.Messages)
		dels.delete(ctx, r.invoke(ctx, h, q, msgs, timeout))
	}
}

// receiverIdle is how long a writer loop held back by backpressure or a
// paused intake waits before it looks at the output's state again.
const receiverIdle = 250 * time.Millisecond

// attemptID returns a fresh ReceiveRequestAttemptId.
func attemptID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// invoke runs the handler on one batch, with the invocation's deadline, and
// returns the messages to delete: those it did not report failed.
func (r *Runtime) invoke(ctx context.Context, h *writer.Handler, q queue, msgs []sqstypes.Message, timeout time.Duration) []sqstypes.DeleteMessageBatchRequestEntry {
	ev := writer.Event(q.arn, r.Deps.AWS.Region, msgs)
	// The messages stay with us even if the run is stopping: finish the batch.
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	start := time.Now()
	resp, err := h.Handle(ictx, ev)
	r.invoked.Add(1)
	r.handling.Add(int64(time.Since(start)))
	if err != nil {
		r.Log.Error("writer invocation failed; batch will be retried", "queue", q.name, "error", err)
		return nil
	}
	return writer.DeleteEntries(msgs, resp)
}

// waitIdle returns nil when, twice in a row, every job is caught up, no
// writer batch is in flight and every work queue is empty.
func (r *Runtime) waitIdle(ctx context.Context, jobs []*config.Job, queues []queue, errc <-chan error) error {
	streak := 0
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			return err
		case <-t.C:
		}
		idle, err := r.idle(ctx, jobs, queues)
		if err != nil {
			return err
		}
		if idle {
			streak++
		} else {
			streak = 0
		}
		if streak >= 3 {
			return nil
		}
	}
}

func (r *Runtime) idle(ctx context.Context, jobs []*config.Job, queues []queue) (bool, error) {
	if !r.Opts.NoPoller {
		r.mu.Lock()
		for _, j := range jobs {
			if !r.caughtUp[j.ID] {
				r.mu.Unlock()
				return false, nil
			}
		}
		r.mu.Unlock()
	}
	if r.inflight.Load() > 0 {
		return false, nil
	}
	for _, q := range queues {
		d, err := dlq.QueueDepth(ctx, r.Deps.SQS, q.url)
		if err != nil {
			return false, err
		}
		if d.Total() > 0 {
			return false, nil
		}
	}
	return true, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
