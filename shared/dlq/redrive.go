package dlq

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/fanout"
)

// Mode selects how Redrive moves messages.
type Mode string

const (
	// ModeAuto uses the SQS message move task for a standard DLQ where the
	// endpoint supports it, and copies otherwise (always for a FIFO DLQ).
	ModeAuto Mode = "auto"
	// ModeTask starts an SQS message move task (StartMessageMoveTask): SQS
	// moves the messages itself, server side, and keeps moving them if this
	// process dies.
	ModeTask Mode = "task"
	// ModeCopy receives each message from the DLQ, sends it to the work
	// queue and deletes it from the DLQ only once the work queue accepted
	// it, journaling each step (see Redriver).
	ModeCopy Mode = "copy"
)

// ErrTaskUnsupported is returned in ModeTask when the endpoint does not
// implement message move tasks.
var ErrTaskUnsupported = errors.New("sqs endpoint does not support message move tasks")

// ErrTaskFIFO is returned in ModeTask for a FIFO DLQ. A message move task
// takes each message out of the DLQ and hands it to the work queue with the
// deduplication id it carries; a FIFO work queue that saw that id in the
// last 5 minutes accepts the message and drops it as a duplicate, after the
// DLQ let go of it. AWS documents that a message its redrive policy moves to
// a FIFO DLQ carries the original message's id as its deduplication id, but
// not what a move task does with it, and LocalStack (which keeps the original
// deduplication id) loses such messages. Copy mode sends each message with a
// deduplication id of its own (DeduplicationID), so nothing can be dropped.
var ErrTaskFIFO = errors.New("a message move task is not used on a FIFO dlq: the work queue could drop moved messages as duplicates of ones it saw in the last 5 minutes, after the dlq let go of them; copy mode (--mode copy) gives each message a deduplication id of its own")

// Defaults of the Redriver's copy mode.
const (
	DefaultVisibility = 60 * time.Second
	DefaultWorkers    = 4
	// maxTaskRate is SQS's cap on MaxNumberOfMessagesPerSecond.
	maxTaskRate = 500
	// fifoDedupWindow is how long a FIFO queue remembers deduplication ids.
	fifoDedupWindow = 5 * time.Minute
)

// Redriver moves the messages of a DLQ back to its work queue.
//
// In copy mode a message leaves the DLQ only after the work queue accepted
// it, so no message is ever lost. To keep a message from reaching the work
// queue twice when a redrive dies between the send and the delete, every
// step is journaled (see Journal) before the next one starts:
//
//  1. receive a batch from the DLQ (hidden for Visibility);
//  2. look the messages up in the journal: one recorded Sent is already on
//     the work queue, so it is only deleted from the DLQ (Recovered);
//  3. record the others Sending, then send them to the work queue;
//  4. record the accepted ones Sent, then delete them from the DLQ, then
//     forget them.
//
// Killed at any point, the process loses no message, and a redrive run
// again finishes the job: a message journaled Sent is only deleted from the
// DLQ, so it ends up on the work queue once. (Until then the messages of
// the batches in flight at the kill sit on both queues.) The one case the
// journal cannot decide is a message whose send was in flight: recorded
// Sending, and nobody can tell whether SQS took it. A resumed redrive sends
// it again (Resent). On a FIFO work queue the deduplication id, derived from
// the DLQ message id, makes SQS drop the second copy when it comes within 5
// minutes of the first; on a standard queue the work queue may then hold it
// twice. That duplicate is harmless: both copies carry the same envelope
// and version, and applying a version an output already holds changes
// nothing. (An SDK retry of a send whose answer was lost can duplicate the
// same way.)
//
// On a FIFO work queue a message goes back to the group the poller gives
// its route (fanout.Target.Group): the output's single group on a
// total-order output, else the envelope's document, else (no envelope) the
// group it had on the DLQ.
//
// Messages keep their body (the envelope, with its version) and message
// attributes (the failure reason) in both modes.
//
// With an Archive, the messages archived from the DLQ go back too, in the
// DLQ's order and before the DLQ's own (which were queued after them),
// copied with the same journal discipline whatever the mode: each object
// is deleted only once the work queue accepted its message, and a claim
// check the archive kept is written back first. The archive is looked at
// again after the DLQ, for what a sweep moved there meanwhile.
type Redriver struct {
	SQS     SQS
	Journal *Journal // copy mode and the archive; required there
	Queues  Queues
	// Archive, when set, is the DLQ's archive, redriven with it.
	Archive *Archive
	Mode    Mode
	// Rate bounds messages per second; 0 means unbounded (task mode: SQS
	// picks the rate). Task mode caps it at 500.
	Rate int
	// Limit stops a copy redrive after this many messages; 0 means all.
	// Task mode cannot stop early, so ModeAuto copies when Limit is set.
	Limit int
	// Visibility hides a received DLQ message while the copy works on it,
	// and bounds how long a redrive waits for messages another reader (or
	// a killed redrive) holds. Default DefaultVisibility.
	Visibility time.Duration
	// Workers is the number of concurrent copy loops. Default DefaultWorkers.
	Workers int
	// Progress, when set, is called from any goroutine as messages leave
	// the DLQ.
	Progress func(done, total int64)
	Log      *slog.Logger
	Now      clock.Clock // zero: the system clock
}

// Result is what a redrive did.
type Result struct {
	Mode Mode `json:"mode"`
	// Fallback says why ModeAuto copied instead of starting a task.
	Fallback string `json:"fallback,omitempty"`
	// TaskHandle identifies the SQS message move task (task mode).
	TaskHandle string `json:"task_handle,omitempty"`
	// Moved: sent to the work queue and deleted from the DLQ by this run
	// (task mode: SQS's count of moved messages).
	Moved int64 `json:"moved"`
	// Recovered: already sent by an interrupted run; only deleted from the DLQ.
	Recovered int64 `json:"recovered"`
	// Resent: an interrupted run may have sent them; sent again (on a
	// standard work queue they may now be there twice; harmless).
	Resent int64 `json:"resent"`
	// Left: messages still in the DLQ when the run ended (held by another
	// reader, or failed to send).
	Left int64 `json:"left"`
	// FromArchive: of the messages counted above, those sent back from
	// the DLQ's archive.
	FromArchive int64 `json:"from_archive"`
	// ArchiveLeft: messages still in the archive when the run ended.
	ArchiveLeft int64 `json:"archive_left"`
}

// Done is every message that left the DLQ.
func (r Result) Done() int64 { return r.Moved + r.Recovered + r.Resent }

func (r *Redriver) log() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.New(slog.DiscardHandler)
}

// Redrive moves the DLQ's messages to the work queue and returns what it did.
// It stops when the DLQ is empty (copy mode: no message visible and none in
// flight, or none received for Visibility while others hold some), when
// Limit messages were moved, or when ctx ends; a cancelled task is
// cancelled at SQS too. Redrives of one DLQ may run at once, here or in
// other processes: each receives different messages (SQS allows one move
// task per queue, so a second task fails to start). Redrive may be called
// again on the same Redriver once it returned.
func (r *Redriver) Redrive(ctx context.Context) (Result, error) {
	if r.Archive == nil {
		return r.redriveDLQ(ctx)
	}
	return r.withArchive(ctx)
}

// redriveDLQ moves the DLQ's messages in the Redriver's mode.
func (r *Redriver) redriveDLQ(ctx context.Context) (Result, error) {
	mode := r.Mode
	if mode == "" {
		mode = ModeAuto
	}
	switch mode {
	case ModeTask:
		if r.Limit > 0 {
			return Result{Mode: mode}, errors.New("redrive: a message move task cannot stop after a limit; use copy mode")
		}
		if r.Queues.FIFO {
			return Result{Mode: mode}, fmt.Errorf("redrive %s: %w", r.Queues.DLQName, ErrTaskFIFO)
		}
		return r.task(ctx)
	case ModeCopy:
		return r.copy(ctx)
	case ModeAuto:
		if r.Limit > 0 {
			res, err := r.copy(ctx)
			res.Fallback = "a limit was set"
			return res, err
		}
		if r.Queues.FIFO {
			res, err := r.copy(ctx)
			res.Fallback = "the dlq is FIFO (a move task could have its messages dropped as duplicates)"
			return res, err
		}
		res, err := r.task(ctx)
		if errors.Is(err, ErrTaskUnsupported) {
			r.log().Info("message move task unsupported; copying", "error", err)
			res, err = r.copy(ctx)
			res.Fallback = "the endpoint does not support message move tasks"
		}
		return res, err
	}
	return Result{}, fmt.Errorf("redrive: unknown mode %q (want auto, task or copy)", mode)
}

// task runs an SQS message move task and follows it until it ends.
func (r *Redriver) task(ctx context.Context) (Result, error) {
	res := Result{Mode: ModeTask}
	in := &sqs.StartMessageMoveTaskInput{SourceArn: &r.Queues.DLQARN, DestinationArn: &r.Queues.WorkARN}
	if r.Rate > 0 {
		in.MaxNumberOfMessagesPerSecond = aws.Int32(int32(min(r.Rate, maxTaskRate)))
	}
	// One attempt: starting is not idempotent (a second start while the
	// first runs fails).
	out, err := r.SQS.StartMessageMoveTask(ctx, in, func(o *sqs.Options) { o.RetryMaxAttempts = 1 })
	if err != nil {
		if Unsupported(err) {
			return res, fmt.Errorf("start message move task: %w: %w", ErrTaskUnsupported, err)
		}
		return res, fmt.Errorf("start message move task (use --mode copy to move messages without one): %w", err)
	}
	res.TaskHandle = aws.ToString(out.TaskHandle)
	r.log().Info("message move task started", "task", res.TaskHandle, "dlq", r.Queues.DLQName, "queue", r.Queues.WorkName)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if _, err := r.SQS.CancelMessageMoveTask(cctx, &sqs.CancelMessageMoveTaskInput{TaskHandle: &res.TaskHandle}); err != nil {
				return res, fmt.Errorf("cancel message move task %s (it may still be running): %w", res.TaskHandle, err)
			}
			return res, fmt.Errorf("redrive: %w (message move task cancelled)", ctx.Err())
		case <-t.C:
		}
		list, err := r.SQS.ListMessageMoveTasks(ctx, &sqs.ListMessageMoveTasksInput{SourceArn: &r.Queues.DLQARN, MaxResults: aws.Int32(1)})
		if err != nil {
			return res, fmt.Errorf("list message move tasks: %w", err)
		}
		// The most recent task of the DLQ comes first, and a queue runs one
		// task at a time: ours. (SQS names the handle only while it runs.)
		for _, e := range list.Results[:min(1, len(list.Results))] {
			res.Moved = e.ApproximateNumberOfMessagesMoved
			total := res.Moved
			if e.ApproximateNumberOfMessagesToMove != nil {
				total = max(total, *e.ApproximateNumberOfMessagesToMove)
			}
			if r.Progress != nil {
				r.Progress(res.Moved, total)
			}
			switch aws.ToString(e.Status) {
			case "COMPLETED":
				if d, err := QueueDepth(ctx, r.SQS, r.Queues.DLQURL); err == nil {
					res.Left = int64(d.Total())
				}
				return res, nil
			case "CANCELLED":
				return res, fmt.Errorf("message move task %s was cancelled", res.TaskHandle)
			case "FAILED":
				return res, fmt.Errorf("message move task %s failed: %s", res.TaskHandle, aws.ToString(e.FailureReason))
			}
		}
	}
}

// Unsupported reports whether err says the endpoint does not implement the
// operation: SQS's UnsupportedOperation error, or HTTP 501.
func Unsupported(err error) bool {
	var uo *sqstypes.UnsupportedOperation
	if errors.As(err, &uo) {
		return true
	}
	var re *awshttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotImplemented
}

// copyRun is the shared state of one copy redrive's workers.
type copyRun struct {
	r        *Redriver
	res      Result
	total    int64
	reserved atomic.Int64 // messages claimed against Limit
	lastRecv atomic.Int64 // unix nanos of the last non-empty receive
	pace     pacer
	mu       sync.Mutex // guards res
}

func (r *Redriver) copy(ctx context.Context) (Result, error) {
	if r.Journal == nil {
		return Result{Mode: ModeCopy}, errors.New("redrive: copy mode needs a journal")
	}
	d, err := QueueDepth(ctx, r.SQS, r.Queues.DLQURL)
	if err != nil {
		return Result{Mode: ModeCopy}, err
	}
	run := &copyRun{r: r, res: Result{Mode: ModeCopy}, total: int64(d.Total()), pace: pacer{rate: float64(r.Rate)}}
	if r.Limit > 0 {
		run.total = min(run.total, int64(r.Limit))
	}
	run.lastRecv.Store(r.Now.Now().UnixNano())
	if r.Progress != nil {
		r.Progress(0, run.total)
	}
	workers := r.Workers
	if workers <= 0 {
		workers = DefaultWorkers
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for i := range workers {
		wg.Go(func() {
			if err := run.loop(ctx); err != nil {
				errs[i] = err
				cancel()
			}
		})
	}
	wg.Wait()
	err = errors.Join(errs...)
	if d, derr := QueueDepth(context.WithoutCancel(ctx), r.SQS, r.Queues.DLQURL); derr == nil {
		run.res.Left = int64(d.Total())
	}
	return run.res, err
}

func (c *copyRun) visibility() time.Duration {
	if c.r.Visibility > 0 {
		return c.r.Visibility
	}
	return DefaultVisibility
}

// loop receives and moves batches until the DLQ is done or ctx ends. A
// cancelled context is not an error of the loop; the caller reports it.
func (c *copyRun) loop(ctx context.Context) error {
	r := c.r
	for ctx.Err() == nil {
		want := 10
		if r.Limit > 0 {
			left := int64(r.Limit) - c.reserved.Load()
			if left <= 0 {
				return nil
			}
			want = int(min(int64(want), left))
		}
		// Pace before receiving, so that no message waits hidden for its
		// turn: a batch at most the rate, and no faster than the rate.
		if r.Rate > 0 {
			want = min(want, r.Rate)
		}
		if err := c.pace.wait(ctx, want); err != nil {
			return nil
		}
		out, err := r.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    &r.Queues.DLQURL,
			MaxNumberOfMessages:         int32(want),
			WaitTimeSeconds:             1,
			VisibilityTimeout:           int32(c.visibility() / time.Second),
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
			MessageAttributeNames:       []string{"All"},
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("receive from dlq: %w", err)
		}
		if len(out.Messages) == 0 {
			done, err := c.drained(ctx)
			if err != nil || done {
				return err
			}
			continue
		}
		received := r.Now.Now()
		c.lastRecv.Store(received.UnixNano())
		msgs := make([]Message, len(out.Messages))
		for i, m := range out.Messages {
			msgs[i] = Decode(m)
		}
		if err := c.batch(ctx, msgs, received); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	return nil
}

// drained reports whether the redrive is over: nothing left in the DLQ, or
// only messages others hold and nothing received for a whole visibility
// timeout (time enough for a killed redrive's messages to come back).
func (c *copyRun) drained(ctx context.Context) (bool, error) {
	d, err := QueueDepth(ctx, c.r.SQS, c.r.Queues.DLQURL)
	if err != nil {
		if ctx.Err() != nil {
			return true, nil
		}
		return false, err
	}
	if d.Visible > 0 {
		return false, nil
	}
	if d.InFlight == 0 {
		return true, nil
	}
	idle := c.r.Now.Since(time.Unix(0, c.lastRecv.Load()))
	return idle > c.visibility()+5*time.Second, nil
}

// batch moves one received batch (see Redriver for the steps).
func (c *copyRun) batch(ctx context.Context, msgs []Message, received time.Time) error {
	r := c.r
	entries, err := r.Journal.Lookup(ctx, messageIDs(msgs))
	if err != nil {
		return err
	}
	var send, recovered []Message
	for _, m := range msgs {
		if entries[m.ID].State == Sent {
			recovered = append(recovered, m)
		} else {
			send = append(send, m)
		}
	}
	// Claim messages against the limit; give the excess back to the DLQ.
	if r.Limit > 0 {
		n := c.reserved.Add(int64(len(send) + len(recovered)))
		if over := min(n-int64(r.Limit), int64(len(send))); over > 0 {
			keep := len(send) - int(over)
			back := send[keep:]
			send = send[:keep]
			c.reserved.Add(-over)
			raw := make([]sqstypes.Message, len(back))
			for i, m := range back {
				raw[i] = sqstypes.Message{ReceiptHandle: aws.String(m.receiptHandle)}
			}
			if err := release(ctx, r.SQS, r.Queues.DLQURL, raw); err != nil {
				return err
			}
		}
	}
	for _, m := range send {
		if e := entries[m.ID]; e.State == Sending && (!r.Queues.FIFO || r.Now.Since(e.At) > fifoDedupWindow) {
			r.log().Warn("an interrupted redrive may have sent this message; sending it again (the work queue may hold it twice, which the output ignores)",
				"message_id", m.ID, "doc_id", m.DocID(), "interrupted_at", e.At)
		}
	}

	accepted, sendErr, err := c.journaledSend(ctx, send)
	if err != nil {
		return err
	}

	toDelete := slices.Concat(accepted, recovered)
	deleted, err := c.delete(ctx, toDelete)
	if err != nil {
		return errors.Join(sendErr, err)
	}
	// Forget entries only while our receipt handles were surely current: a
	// delete with a handle whose visibility timeout ran out can succeed
	// without deleting, and the message would come back unjournaled.
	if r.Now.Since(received) < c.visibility()/2 && len(deleted) > 0 {
		if err := r.Journal.Forget(ctx, deleted); err != nil {
			r.log().Warn("clear redrive journal", "error", err)
		}
	}

	var moved, rec, res int64
	gone := map[string]bool{}
	for _, id := range deleted {
		gone[id] = true
	}
	for _, m := range accepted {
		if !gone[m.ID] {
			continue
		}
		if entries[m.ID].State == Sending {
			res++
		} else {
			moved++
		}
	}
	for _, m := range recovered {
		if gone[m.ID] {
			rec++
		}
	}
	c.mu.Lock()
	c.res.Moved += moved
	c.res.Recovered += rec
	c.res.Resent += res
	done := c.res.Done()
	c.mu.Unlock()
	if r.Progress != nil {
		r.Progress(done, max(c.total, done))
	}
	return sendErr
}

// journaledSend sends msgs to the work queue (send) between their journal
// entries: Sending before, Sent with the work queue's message id for those
// SQS accepted. What was accepted before a failed request is returned with
// that request's error (sendErr), to be recorded and deleted all the same;
// the failed request's messages stay Sending. err is a journal write that
// failed: then nothing is to be deleted.
func (c *copyRun) journaledSend(ctx context.Context, msgs []Message) (accepted []Message, sendErr, err error) {
	if len(msgs) == 0 {
		return nil, nil, nil
	}
	j := c.r.Journal
	if err := j.Mark(ctx, messageIDs(msgs), Sending, nil); err != nil {
		return nil, nil, err
	}
	accepted, workIDs, sendErr := c.send(ctx, msgs)
	if len(accepted) > 0 {
		if err := j.Mark(ctx, messageIDs(accepted), Sent, workIDs); err != nil {
			return nil, nil, errors.Join(sendErr, err)
		}
	}
	return accepted, sendErr, nil
}

// messageIDs returns the DLQ message ids of msgs.
func messageIDs(msgs []Message) []string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return ids
}

// send sends messages to the work queue, in as many SendMessageBatch
// requests as SQS's limit on a request's size needs, and returns those it
// accepted, with the work queue's message id of each. Entries SQS rejected
// stay on the DLQ (their journal entries are cleared: they surely were not
// sent) and are retried when they become visible again. A request that
// fails ends the send: what earlier requests sent is returned with the
// error.
func (c *copyRun) send(ctx context.Context, msgs []Message) ([]Message, map[string]string, error) {
	accepted, workIDs := []Message(nil), map[string]string{}
	for start := 0; start < len(msgs); {
		end, size := start, 0
		for end < len(msgs) && (end == start || size+messageSize(&msgs[end]) <= config.SQSMessageBytes) {
			size += messageSize(&msgs[end])
			end++
		}
		acc, ids, err := c.sendBatch(ctx, msgs[start:end])
		accepted = append(accepted, acc...)
		maps.Copy(workIDs, ids)
		if err != nil {
			return accepted, workIDs, err
		}
		start = end
	}
	return accepted, workIDs, nil
}

// messageSize is what m counts toward SQS's limits: its body and each
// attribute's name, data type and value.
func messageSize(m *Message) int {
	n := len(m.body)
	for name, a := range m.attributes {
		n += len(name) + len(aws.ToString(a.DataType)) + len(aws.ToString(a.StringValue)) + len(a.BinaryValue)
	}
	return n
}

// sendBatch is one SendMessageBatch request of send.
func (c *copyRun) sendBatch(ctx context.Context, msgs []Message) ([]Message, map[string]string, error) {
	r := c.r
	entries := make([]sqstypes.SendMessageBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		e := sqstypes.SendMessageBatchRequestEntry{
			Id:                aws.String(strconv.Itoa(i)),
			MessageBody:       aws.String(m.body),
			MessageAttributes: m.attributes,
		}
		if r.Queues.FIFO {
			e.MessageGroupId = aws.String(r.Queues.group(&m))
			e.MessageDeduplicationId = aws.String(DeduplicationID(m.ID))
		}
		entries[i] = e
	}
	out, err := r.SQS.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &r.Queues.WorkURL, Entries: entries})
	if err != nil {
		// Unknown outcome: the journal keeps these as Sending.
		return nil, nil, fmt.Errorf("send to work queue %s: %w", r.Queues.WorkName, err)
	}
	workIDs := map[string]string{}
	var accepted []Message
	for _, s := range out.Successful {
		i, err := strconv.Atoi(aws.ToString(s.Id))
		if err != nil || i < 0 || i >= len(msgs) {
			continue
		}
		accepted = append(accepted, msgs[i])
		workIDs[msgs[i].ID] = aws.ToString(s.MessageId)
	}
	var rejected []string
	for _, f := range out.Failed {
		i, err := strconv.Atoi(aws.ToString(f.Id))
		if err != nil || i < 0 || i >= len(msgs) {
			continue
		}
		rejected = append(rejected, msgs[i].ID)
		r.log().Warn("work queue rejected a redriven message; it stays in the dlq",
			"message_id", msgs[i].ID, "code", aws.ToString(f.Code), "sender_fault", f.SenderFault)
	}
	if len(rejected) > 0 {
		if err := r.Journal.Forget(ctx, rejected); err != nil {
			return nil, nil, err
		}
	}
	return accepted, workIDs, nil
}

// group is the FIFO message group m is redriven to (see Redriver).
func (q Queues) group(m *Message) string {
	t := fanout.Target{Output: q.Output, FIFO: q.FIFO, Total: q.Total}
	switch {
	case q.Total:
		return t.Group("")
	case m.Envelope != nil && m.Envelope.DocID != "":
		return t.Group(m.Envelope.DocID)
	case m.GroupID != "":
		return m.GroupID
	}
	return "unknown"
}

// delete removes messages from the DLQ and returns the ids deleted.
func (c *copyRun) delete(ctx context.Context, msgs []Message) ([]string, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	r := c.r
	entries := make([]sqstypes.DeleteMessageBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		entries[i] = sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(m.receiptHandle)}
	}
	out, err := r.SQS.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &r.Queues.DLQURL, Entries: entries})
	if err != nil {
		// The journal says Sent: a later receive deletes them without sending.
		return nil, fmt.Errorf("delete from dlq: %w", err)
	}
	var deleted []string
	for _, s := range out.Successful {
		if i, err := strconv.Atoi(aws.ToString(s.Id)); err == nil && i >= 0 && i < len(msgs) {
			deleted = append(deleted, msgs[i].ID)
		}
	}
	for _, f := range out.Failed {
		r.log().Warn("delete from dlq failed; it will be deleted when received again", "code", aws.ToString(f.Code))
	}
	return deleted, nil
}

// DeduplicationID is the FIFO deduplication id of a redriven message: a
// function of the DLQ message id alone, so that sending the same DLQ message
// again (a resumed redrive) is dropped by SQS within its 5-minute window,
// while a change that failed again (a new DLQ message) is not.
func DeduplicationID(dlqMessageID string) string {
	sum := sha256.Sum256([]byte("changes-worker/redrive\x00" + dlqMessageID))
	return hex.EncodeToString(sum[:])
}

// pacer spaces sends so that no more than rate messages per second go out.
// A zero rate does not wait. Safe for concurrent use.
type pacer struct {
	rate float64
	mu   sync.Mutex
	next time.Time
}

func (p *pacer) wait(ctx context.Context, n int) error {
	if p.rate <= 0 {
		return nil
	}
	p.mu.Lock()
	now := time.Now()
	if p.next.Before(now) {
		p.next = now
	}
	at := p.next
	p.next = p.next.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))
	p.mu.Unlock()
	if d := time.Until(at); d > 0 {
		return clock.Sleep(ctx, d)
	}
	return nil
}
