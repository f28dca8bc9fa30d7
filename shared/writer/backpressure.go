package writer

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"golang.org/x/sync/errgroup"

	"github.com/changes-worker/changes-worker/shared/backpressure"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/metrics"
)

// AttrDeferrals is the message attribute that counts how many times a
// message of a standard queue was sent back to it because its output was
// down or asked us to slow down. Those sends give it a fresh receive count,
// so holding never moves a message to the DLQ. The room it takes of a
// message is kept free by config.HeldCounterBytes.
const AttrDeferrals = "cw-deferrals"

const (
	// maxDelaySeconds is the longest per-message delay SQS accepts.
	maxDelaySeconds = 900
	// maxAttributes is how many message attributes SQS accepts on a message.
	maxAttributes = 10
	// batchLimit is how many messages SQS takes in one batch request.
	batchLimit = 10
)

// tracker returns the backpressure tracker of a route, one per process.
func (h *Handler) tracker(r config.Route) *backpressure.Tracker {
	key := outputKey(r.Job.ID, r.Output.ID)
	if t, ok := h.trackers.Load(key); ok {
		return t.(*backpressure.Tracker)
	}
	b := r.Output.Backpressure
	t := backpressure.New(backpressure.Settings{Threshold: b.Threshold, BaselineRequests: b.BaselineRequests, Window: b.Window, MinIncrease: b.MinIncrease.D()}, h.Now)
	kept, _ := h.trackers.LoadOrStore(key, t)
	return kept.(*backpressure.Tracker)
}

// Backpressure returns the advice of the tracker of job/output: the local
// runtime lowers its receivers by it. A route never handled is inactive.
func (h *Handler) Backpressure(job, output string) backpressure.State {
	t, ok := h.trackers.Load(outputKey(job, output))
	if !ok {
		return backpressure.State{}
	}
	return t.(*backpressure.Tracker).State()
}

// ReceiverLimit returns how many of max receivers of job/output should run
// now: all of them unless the output is struggling.
func (h *Handler) ReceiverLimit(job, output string, max int) int {
	t, ok := h.trackers.Load(outputKey(job, output))
	if !ok {
		return max
	}
	return t.(*backpressure.Tracker).Limit(max)
}

// noteSlow logs when an output becomes slow, and when it no longer is,
// rather than at every batch while it is: a writer process handles many
// batches a second.
func (h *Handler) noteSlow(ctx context.Context, log *slog.Logger, r config.Route, st backpressure.State) {
	was, _ := h.slow.Swap(outputKey(r.Job.ID, r.Output.ID), st.Active)
	switch wasSlow, _ := was.(bool); {
	case st.Active && !wasSlow:
		log.InfoContext(ctx, "output is slow; lowering parallelism", "ratio", st.Ratio, "baseline_ms", st.Baseline.Milliseconds())
	case !st.Active && wasSlow:
		log.InfoContext(ctx, "output is no longer slow", "ratio", st.Ratio, "baseline_ms", st.Baseline.Milliseconds())
	}
}

// isBackpressure says whether a failure is the output asking us to slow
// down: its own signal, or a timeout while the output is known to be slow.
func isBackpressure(e *deliver.Error, active bool) bool {
	if e == nil || e.Class != deliver.Transient {
		return false
	}
	return e.Backpressure || (active && (e.Reason == "timeout" || e.Reason == "backpressure"))
}

// deferMessage holds a message back for delay without counting it toward the DLQ.
// On a FIFO queue it keeps the message in flight, at the head of its group
// (holdInFlight), whatever its receive count: a resend would go behind the
// later changes of its group, and the writer pauses the output's intake
// rather than let the receives grow (see Intake). On a standard queue, well
// before its last receive it only extends the message's visibility (the
// receive already counted); from the receive before the last on, it sends
// the message back to its queue as a new message (a fresh receive count,
// its deferrals counted in AttrDeferrals) and reports it handled. The
// requests are made for the whole batch once it is disposed of
// (flushHolds), ten messages to a request, and a message SQS did not take
// back is retried instead. It returns whether the message is to be
// reported failed.
func (b *batch) deferMessage(it *item, attempts int, delay time.Duration) (retry bool) {
	if b.route.Output.FIFO() {
		b.holdInFlight(it, delay)
		return true
	}
	secs := int32(delay / time.Second)
	if attempts < b.route.Output.MaxReceiveCount-1 {
		if it.rec.ReceiptHandle != "" {
			b.extensions = append(b.extensions, visibility{it: it, delay: delay})
		}
		return true
	}
	n, _ := strconv.Atoi(aws.ToString(it.rec.MessageAttributes[AttrDeferrals].StringValue))
	attrs := copyAttributes(it.rec.MessageAttributes)
	if _, ok := attrs[AttrDeferrals]; ok || len(attrs) < maxAttributes {
		// A message redriven from the DLQ can carry ten failure attributes
		// already, SQS's limit: it goes back without the counter.
		attrs[AttrDeferrals] = sqstypes.MessageAttributeValue{DataType: aws.String("Number"), StringValue: aws.String(strconv.Itoa(n + 1))}
	}
	b.sendBacks = append(b.sendBacks, sendBack{it: it, entry: sqstypes.SendMessageBatchRequestEntry{
		MessageBody: aws.String(it.rec.Body), MessageAttributes: attrs, DelaySeconds: min(secs, maxDelaySeconds),
	}})
	return false
}

// sendBack is a held message of a standard queue to send back to it.
type sendBack struct {
	it    *item
	entry sqstypes.SendMessageBatchRequestEntry
}

// size is what the entry counts toward SQS's bound on a request's
// messages: its body and its attributes.
func (s sendBack) size() int {
	n := len(aws.ToString(s.entry.MessageBody))
	for k, v := range s.entry.MessageAttributes {
		n += len(k) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue)) + len(v.BinaryValue)
	}
	return n
}

// holdRequests is how many of a batch's hold requests run at once.
const holdRequests = 4

// flushHolds makes the requests deferMessage collected for a standard
// queue: visibility extensions (best effort: a message whose extension
// fails comes back after the visibility it was received with) and
// send-backs, ten to a request and within SQS's bound on a request's
// messages, holdRequests at a time. A message SQS did not take back is
// reported failed, to be received again.
func (b *batch) flushHolds(ctx context.Context) {
	if len(b.extensions) == 0 && len(b.sendBacks) == 0 {
		return
	}
	var mu sync.Mutex
	retry := func(its ...*item) {
		mu.Lock()
		defer mu.Unlock()
		for _, it := range its {
			b.failed = append(b.failed, it.rec.MessageId)
		}
	}
	q, err := b.h.queueURL(ctx, b.h.Config.QueueName(b.route.Job, b.route.Output))
	if err != nil {
		b.log.WarnContext(ctx, "hold back", "error", err)
		for _, s := range b.sendBacks {
			retry(s.it)
		}
		return
	}
	var g errgroup.Group
	g.SetLimit(holdRequests)
	for chunk := range slices.Chunk(b.extensions, batchLimit) {
		g.Go(func() error {
			entries := make([]sqstypes.ChangeMessageVisibilityBatchRequestEntry, len(chunk))
			for i, v := range chunk {
				entries[i] = sqstypes.ChangeMessageVisibilityBatchRequestEntry{
					Id: aws.String(strconv.Itoa(i)), ReceiptHandle: &v.it.rec.ReceiptHandle, VisibilityTimeout: int32(v.delay / time.Second),
				}
			}
			out, err := b.h.SQS.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: &q, Entries: entries})
			if err != nil {
				b.log.WarnContext(ctx, "hold back: extend visibility", "messages", len(chunk), "error", err)
				return nil
			}
			for _, f := range out.Failed {
				if i, err := strconv.Atoi(aws.ToString(f.Id)); err == nil && i < len(chunk) {
					b.log.WarnContext(ctx, "hold back: extend visibility", "message_id", chunk[i].it.rec.MessageId, "error", aws.ToString(f.Code)+": "+aws.ToString(f.Message))
				}
			}
			return nil
		})
	}
	for _, chunk := range sendBackChunks(b.sendBacks) {
		g.Go(func() error {
			entries := make([]sqstypes.SendMessageBatchRequestEntry, len(chunk))
			for i, s := range chunk {
				entries[i] = s.entry
				entries[i].Id = aws.String(strconv.Itoa(i))
			}
			out, err := b.h.SQS.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &q, Entries: entries})
			if err != nil {
				b.log.WarnContext(ctx, "hold back: send back to queue; the messages are received again", "messages", len(chunk), "error", err)
				for _, s := range chunk {
					retry(s.it)
				}
				return nil
			}
			for _, f := range out.Failed {
				if i, err := strconv.Atoi(aws.ToString(f.Id)); err == nil && i < len(chunk) {
					b.log.WarnContext(ctx, "hold back: send back to queue; the message is received again", "message_id", chunk[i].it.rec.MessageId, "error", aws.ToString(f.Code)+": "+aws.ToString(f.Message))
					retry(chunk[i].it)
				}
			}
			return nil
		})
	}
	_ = g.Wait()
}

// sendBackChunks splits send-backs into requests of at most batchLimit
// messages and config.SQSMessageBytes of them.
func sendBackChunks(all []sendBack) [][]sendBack {
	var out [][]sendBack
	first, size := 0, 0
	for k, s := range all {
		n := s.size()
		if k > first && (k-first == batchLimit || size+n > config.SQSMessageBytes) {
			out = append(out, all[first:k])
			first, size = k, 0
		}
		size += n
	}
	if first < len(all) {
		out = append(out, all[first:])
	}
	return out
}

// holdBack holds a message back for it.delay without counting it toward
// the DLQ (deferMessage), counting it in the batch's counters and metrics
// by why it is held. It returns whether the message is to be reported failed.
func (b *batch) holdBack(ctx context.Context, lg *slog.Logger, it *item, attempts int) bool {
	retry := b.deferMessage(it, attempts, it.delay)
	switch it.hold {
	case heldForBackpressure:
		b.n.Deferred++
		b.rec.Add(metrics.BackpressureDelays, 1, metrics.Count)
		b.rec.Add(metrics.BackpressureDelaySeconds, it.delay.Seconds(), metrics.Seconds)
		lg.InfoContext(ctx, "output asked to slow down; message held back", "delay_s", it.delay.Seconds(), "sent_back", !retry)
	case heldForOutage:
		b.n.Held++
		lg.DebugContext(ctx, "output is down; message held back", "delay_s", it.delay.Seconds(), "sent_back", !retry)
	case heldForIntake:
		b.n.Held++
		lg.DebugContext(ctx, "output intake paused; message held back", "delay_s", it.delay.Seconds())
	}
	return retry
}

// holdFor rounds a hold-back delay up to whole seconds, the unit SQS takes:
// at least 1 s, at most the 12 h a visibility timeout can last.
func holdFor(d time.Duration) time.Duration {
	return min(max(time.Second, (d+time.Second-1).Truncate(time.Second)), 12*time.Hour)
}

// copyAttributes converts the event's message attributes back to their SQS
// form for a resend.
func copyAttributes(in map[string]events.SQSMessageAttribute) map[string]sqstypes.MessageAttributeValue {
	out := make(map[string]sqstypes.MessageAttributeValue, len(in)+1)
	for k, v := range in {
		if v.DataType == "" {
			continue
		}
		out[k] = sqstypes.MessageAttributeValue{DataType: aws.String(v.DataType), StringValue: v.StringValue, BinaryValue: v.BinaryValue}
	}
	return out
}

// backpressureMetrics records the state of the output's tracker after a batch.
func backpressureMetrics(rec *metrics.Recorder, st backpressure.State) {
	active := 0.0
	if st.Active {
		active = 1
	}
	rec.Add(metrics.BackpressureActive, active, metrics.None)
}

// meter is the pacer the writer hands its sinks: the output's tracker, and
// the request metrics of the batch.
type meter struct {
	*backpressure.Tracker
	rec *metrics.Recorder
}

func (m meter) Observe(d time.Duration, err error) {
	m.Tracker.Observe(d, err)
	m.rec.Add(metrics.OutputRequests, 1, metrics.Count)
	m.rec.Add(metrics.OutputRequestTime, float64(d.Microseconds())/1000, metrics.Milliseconds)
	if deliver.AuthFailure(err) {
		m.rec.Add(metrics.OutputAuthFailures, 1, metrics.Count)
	}
}

var errPaused = errors.New("the output asked to slow down; not sent while the pause lasts")
