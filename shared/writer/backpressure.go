package writer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

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
// its deferrals counted in AttrDeferrals) and reports it handled. It
// returns whether the message is to be reported failed.
func (b *batch) deferMessage(ctx context.Context, it *item, attempts int, delay time.Duration) (retry bool, err error) {
	if b.route.Output.FIFO() {
		b.holdInFlight(it, delay)
		return true, nil
	}
	q, err := b.h.queueURL(ctx, b.h.Config.QueueName(b.route.Job, b.route.Output))
	if err != nil {
		return true, err
	}
	secs := int32(delay / time.Second)
	if attempts < b.route.Output.MaxReceiveCount-1 {
		if it.rec.ReceiptHandle == "" {
			return true, nil
		}
		_, err := b.h.SQS.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
			QueueUrl: &q, ReceiptHandle: &it.rec.ReceiptHandle, VisibilityTimeout: secs,
		})
		if err != nil {
			return true, fmt.Errorf("extend visibility: %w", err)
		}
		return true, nil
	}
	n, _ := strconv.Atoi(aws.ToString(it.rec.MessageAttributes[AttrDeferrals].StringValue))
	attrs := copyAttributes(it.rec.MessageAttributes)
	if _, ok := attrs[AttrDeferrals]; ok || len(attrs) < maxAttributes {
		// A message redriven from the DLQ can carry ten failure attributes
		// already, SQS's limit: it goes back without the counter.
		attrs[AttrDeferrals] = sqstypes.MessageAttributeValue{DataType: aws.String("Number"), StringValue: aws.String(strconv.Itoa(n + 1))}
	}
	in := it.resend(b.route, q, attrs, it.rec.MessageId+"-d"+strconv.Itoa(n+1))
	in.DelaySeconds = min(secs, maxDelaySeconds)
	if _, err := b.h.SQS.SendMessage(ctx, in); err != nil {
		return true, fmt.Errorf("send back to queue: %w", err)
	}
	return false, nil
}

// holdBack holds a message back for it.delay without counting it toward
// the DLQ (deferMessage), counting it in the batch's counters and metrics
// by why it is held. It returns whether the message is to be reported failed.
func (b *batch) holdBack(ctx context.Context, lg *slog.Logger, it *item, attempts int) bool {
	retry, err := b.deferMessage(ctx, it, attempts, it.delay)
	if err != nil {
		lg.WarnContext(ctx, "hold back", "error", err)
	}
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
