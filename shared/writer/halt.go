package writer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/docid"
	"github.com/changes-worker/changes-worker/shared/metrics"
	"github.com/changes-worker/changes-worker/shared/statetable/halt"
)

// On an output with on_failure halt, a change that cannot be delivered (a
// permanent failure, or a transient one on its max_receive_count-th receive)
// does not go to the DLQ: the writer records the halt (package halt), returns
// the change and everything after it in its group as failed, and keeps the
// change in flight, so that SQS hands out nothing else of the group. Each
// later receive of the change tries it again, after a delay that grows from
// haltFirstDelay to haltMaxDelay: a success clears the halt and the group
// moves on. The operator shortens the wait (changesctl halt retry makes the
// change visible at once) or skips the change (changesctl halt skip: the next
// receive moves it to the DLQ with its reason, and the group moves on).
// A halt record stands until its change was delivered or skipped and the
// record deleted: the change leaves the queue only after that. An output
// that asks to slow down does not halt it (see disposeHalted).

const (
	haltFirstDelay = 30 * time.Second
	// haltMaxDelay keeps the halted change's receives, at most about one an
	// hour, below the queue's redrive maxReceiveCount (1000) for longer than
	// SQS keeps a message (14 days).
	haltMaxDelay = time.Hour
	// heldDelay is how long a change stays in flight when it was held back
	// without an earlier change of its group in flight to block the group
	// (the halt record names a change this batch does not start with, or
	// it could not be read), so that it does not come straight back.
	// Changes held behind a change of the same batch go back at once: the
	// failed change stays in flight and blocks its group, and when it comes
	// back they follow it in order. Kept in flight instead, they could
	// outlast it, and an SQS that hands out the visible changes of a group
	// around one in flight (LocalStack does) would deliver them out of order.
	heldDelay = 10 * time.Second
	// requestDelay: an operator's request (retry or skip) arrived while the
	// change was being tried; it is served on the next receive, soon.
	requestDelay = time.Second
	// clearTries is how many times the writer tries to clear a halt record
	// within a batch, clearBackoff the wait before the second try (doubled
	// for each later one), and unclearedDelay how long a change whose record
	// could not be cleared stays in flight before it is tried again.
	clearTries     = 3
	clearBackoff   = 200 * time.Millisecond
	unclearedDelay = 5 * time.Second
	// checkEvery is how often a writer process asks whether a halting
	// output it found no halt of is halted (halt.Store.Check), so that the
	// output's OutputHalted follows halts cleared elsewhere (changesctl halt
	// clear, another instance) and other groups' halts.
	checkEvery = time.Minute
)

// haltDelay is the visibility of a halted change after its n-th failed
// attempt since the halt.
func haltDelay(n int) time.Duration {
	d := haltFirstDelay
	for i := 1; i < n && d < haltMaxDelay; i++ {
		d *= 2
	}
	return min(d, haltMaxDelay)
}

// readHalts reads, on a halting output, the halt record of every group of
// the batch. A group that stops at a change not at the head of its part of
// the batch (the change is in flight elsewhere, or was removed) has all its
// messages held back; the halted change itself is marked, to be skipped
// when the operator asked so or tried again otherwise.
func (b *batch) readHalts(ctx context.Context) {
	if !b.route.Output.Halts() {
		return
	}
	seen := map[string]bool{}
	for _, it := range b.items {
		if seen[it.group] {
			continue
		}
		seen[it.group] = true
		var st *halt.State
		var err error
		if b.h.Halts == nil {
			err = fmt.Errorf("no halt store configured")
		} else {
			st, err = b.h.Halts.Get(ctx, b.route.Job.ID, b.route.Output.ID, b.h.ids().Key(it.group))
		}
		if err != nil {
			// Without the halt state nothing of the group may be applied.
			for _, other := range b.items {
				if other.group == it.group && other.err == nil {
					other.err = deliver.TransientError("halt_state", err)
					other.held = true
				}
			}
			continue
		}
		if st == nil {
			continue
		}
		if it.rec.MessageId != st.MessageID {
			for _, other := range b.items {
				if other.group == it.group {
					other.err = deliver.TransientError("halted", fmt.Errorf("group %s is halted at message %s (doc %s)", b.h.ids().Key(it.group), st.MessageID, st.DocID))
					other.held = true
				}
			}
			continue
		}
		it.halted = st
		if st.Action == halt.Skip {
			it.skip = true
			it.err = &deliver.Error{Class: deliver.Permanent, Reason: st.Reason, HTTPStatus: st.HTTPStatus, SQLState: st.SQLState,
				Err: fmt.Errorf("halted the output since %s, skipped by the operator: %s", st.Since.UTC().Format(time.RFC3339), st.Error)}
		}
	}
}

// haltSeen is what disposing of one change of a halting output found of
// its group's halt record.
type haltSeen int

const (
	haltNone     haltSeen = iota
	haltRecorded          // the batch recorded a halt
	haltStanding          // a record it read or could not clear still stands
	haltCleared           // it cleared a record
)

// disposeHalting disposes of the changes of a halting output, recording
// and clearing halts, and sets OutputHalted: 1 while a record of the batch
// stands; otherwise, when the batch cleared a record and once per
// checkEvery, what halt.Store.Check finds of the whole output: 1 while any
// group of it is halted, 0 once when none is any more (the alarm clears
// whichever instance finds it so), nothing for an output that did not halt.
func (b *batch) disposeHalting(ctx context.Context) {
	seen := map[haltSeen]bool{}
	for _, it := range b.items {
		retry, hs := b.disposeHalted(ctx, it)
		if retry {
			b.failed = append(b.failed, it.rec.MessageId)
		}
		seen[hs] = true
	}
	check := b.h.check(b.route)
	switch {
	case seen[haltRecorded] || seen[haltStanding]:
		b.rec.Add(metrics.OutputHalted, 1, metrics.Count)
	case seen[haltCleared] || check.due(b.h.Now.Now(), checkEvery):
		b.reportHalts(ctx, check)
	}
}

// reportHalts sets OutputHalted from what halt.Store.Check finds of the
// output. A failed check is made again at the next batch.
func (b *batch) reportHalts(ctx context.Context, check *periodic) {
	if b.h.Halts == nil {
		return
	}
	status, err := b.h.Halts.Check(ctx, b.route.Job.ID, b.route.Output.ID)
	if err != nil {
		check.again()
		b.log.WarnContext(ctx, "check halts", "error", err)
		return
	}
	switch status {
	case halt.Halted:
		b.rec.Add(metrics.OutputHalted, 1, metrics.Count)
	case halt.Resumed:
		b.rec.Add(metrics.OutputHalted, 0, metrics.Count)
		b.log.InfoContext(ctx, "output no longer halted")
	}
}

// check returns the halt check of a route, one per process.
func (h *Handler) check(r config.Route) *periodic {
	key := outputKey(r.Job.ID, r.Output.ID)
	if p, ok := h.checks.Load(key); ok {
		return p.(*periodic)
	}
	kept, _ := h.checks.LoadOrStore(key, &periodic{})
	return kept.(*periodic)
}

// periodic is a task a process does at most once per period. Safe for
// concurrent use.
type periodic struct {
	mu   sync.Mutex
	last time.Time // zero: due
}

// due reports whether the task is due at now, every apart; when it is, it
// counts as done at now.
func (p *periodic) due(now time.Time, every time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.last.IsZero() && now.Sub(p.last) < every {
		return false
	}
	p.last = now
	return true
}

// again makes the task due at once: it failed.
func (p *periodic) again() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = time.Time{}
}

// disposeHalted disposes of one change of a halting output: it returns
// whether its message is to be retried, and what became of its group's
// halt record.
func (b *batch) disposeHalted(ctx context.Context, it *item) (retry bool, hs haltSeen) {
	docID := ""
	if it.env != nil {
		docID = it.env.DocID
	}
	lg := b.log.With("doc_id", docID, "message_id", it.rec.MessageId, "group", it.group)
	switch {
	case it.uncleared:
		// Delivered, but the record still names it: it stays at the
		// head of its group and is applied again (a no-op) and
		// cleared on its next receive.
		b.setVisibility(ctx, it, unclearedDelay)
		return true, haltStanding
	case it.err == nil:
		if it.done {
			b.n.Delivered++
			b.h.delivered(b.rec, it)
		}
		if it.halted != nil {
			return false, haltCleared
		}
		return false, haltNone
	case it.err.Reason == reasonCutShort:
		// Not tried to the end (cutShort): received again as it is.
		if it.halted != nil {
			return true, haltStanding
		}
		return true, haltNone
	case it.skip:
		return b.skipHalted(ctx, lg, it)
	case it.hold == heldForIntake:
		// Not tried: the output's intake is paused. A halted change keeps
		// its record and its attempts.
		hs := haltNone
		if it.halted != nil {
			hs = haltStanding
		}
		return b.holdBack(ctx, lg, it, receiveCount(it.rec)), hs
	case it.hold != notHeld && it.halted == nil && receiveCount(it.rec) < config.MaxFIFOReceiveCount:
		// Not the change's fault (blame), nor that of the held change it
		// waits behind: it is held back without counting toward the halt,
		// as on any FIFO output, in flight at the head of its group while
		// the writer pauses the output's intake. Where the intake cannot
		// be paused it halts below after config.MaxFIFOReceiveCount
		// receives, far from the 1000 at which SQS dead-letters it.
		return b.holdBack(ctx, lg, it, receiveCount(it.rec)), haltNone
	case it.held:
		delay := time.Duration(0)
		if it.err.Reason == "halted" || it.err.Reason == "halt_state" {
			delay = heldDelay
		}
		b.setVisibility(ctx, it, delay)
		if it.err.Reason == "halted" {
			return true, haltStanding
		}
		return true, haltNone
	}
	return b.haltGroup(ctx, lg, it)
}

// skipHalted moves a halted change the operator skips to the DLQ and
// clears its halt record.
func (b *batch) skipHalted(ctx context.Context, lg *slog.Logger, it *item) (retry bool, hs haltSeen) {
	attempts := receiveCount(it.rec)
	if err := b.toDLQ(ctx, it, attempts); err != nil {
		lg.ErrorContext(ctx, "move skipped change to dlq failed; will retry", "error", err)
		return true, haltNone
	}
	b.rec.Add(metrics.FailedPermanent, 1, metrics.Count)
	lg.WarnContext(ctx, "halted change skipped into the dlq", "reason", it.err.Reason)
	if err := b.clearHalt(ctx, lg, it, "skipped"); err != nil {
		// The DLQ holds it; its next receive sends it there again
		// (deduplicated by its message id) and clears the record.
		b.setVisibility(ctx, it, unclearedDelay)
		return true, haltStanding
	}
	b.n.DeadLettered++
	return false, haltCleared
}

// haltGroup retries a failed change of a halting output while it may, and
// halts its group (recordHalt) once it may not; the change stays in
// flight for the halt's delay.
func (b *batch) haltGroup(ctx context.Context, lg *slog.Logger, it *item) (retry bool, hs haltSeen) {
	attempts := receiveCount(it.rec)
	lg = lg.With("attempts", attempts, "class", it.err.Class, "reason", it.err.Reason)
	if it.err.Class == deliver.Transient && attempts < b.route.Output.MaxReceiveCount && it.halted == nil {
		b.rec.Add(metrics.FailedTransient, 1, metrics.Count)
		lg.WarnContext(ctx, "delivery failed; will retry", "error", it.err.Error())
		b.pace(ctx, it, attempts)
		return true, haltNone
	}
	if it.err.Class == deliver.Transient {
		b.rec.Add(metrics.FailedTransient, 1, metrics.Count)
	} else {
		b.rec.Add(metrics.FailedPermanent, 1, metrics.Count)
	}
	st, err := b.recordHalt(ctx, it)
	if err != nil {
		// Unrecorded, the halt still holds: the change stays in the
		// queue and is tried again like a transient failure.
		lg.ErrorContext(ctx, "record halt failed", "error", err)
		b.pace(ctx, it, attempts)
		return true, haltNone
	}
	delay := haltDelay(st.Attempts)
	if st.Action != halt.None && (it.halted == nil || !st.ActionAt.Equal(it.halted.ActionAt)) {
		delay = requestDelay
	}
	lg.ErrorContext(ctx, "output halted", "error", it.err.Error(), "halted_since", st.Since, "halt_attempts", st.Attempts, "retry_in", delay.String())
	b.setVisibility(ctx, it, delay)
	return true, haltRecorded
}

func (b *batch) recordHalt(ctx context.Context, it *item) (*halt.State, error) {
	if b.h.Halts == nil {
		return nil, fmt.Errorf("record halt: no halt store configured")
	}
	now := b.h.Now.Now().UTC()
	ids := b.h.ids()
	st := halt.State{
		Job: b.route.Job.ID, Output: b.route.Output.ID, Group: ids.Key(it.group), MessageID: it.rec.MessageId,
		ReceiptHandle: it.rec.ReceiptHandle, Class: string(it.err.Class), Reason: it.err.Reason, Error: it.err.Error(),
		HTTPStatus: it.err.HTTPStatus, SQLState: it.err.SQLState, Since: now, LastAt: now,
	}
	if ids == "" || ids == docid.Plain {
		// The body names the document: kept only where ids are shown.
		st.Body = it.rec.Body
	}
	if it.env != nil {
		st.DocID, st.Rev, st.Seq = ids.Show(it.env.DocID), it.env.Rev, string(it.env.Seq)
	}
	return b.h.Halts.Record(ctx, st)
}

// clearDelivered clears the halt of a halted change that was just applied,
// before anything later of its group is: false (the record could not be
// cleared) marks the change uncleared and holds the rest of its group.
func (b *batch) clearDelivered(ctx context.Context, it *item) bool {
	lg := b.log.With("doc_id", it.env.DocID, "message_id", it.rec.MessageId, "group", it.group)
	if err := b.clearHalt(ctx, lg, it, "delivered"); err != nil {
		it.uncleared = true
		return false
	}
	return true
}

// clearHalt removes the halt record of it, trying clearTries times. On
// failure the record stands, still naming it: the caller keeps it in the
// queue so that nothing passes it while the record says the group stops
// there.
func (b *batch) clearHalt(ctx context.Context, lg *slog.Logger, it *item, how string) error {
	var err error
	wait := clearBackoff
	for try := 1; try <= clearTries; try++ {
		if err = b.h.Halts.Clear(ctx, b.route.Job.ID, b.route.Output.ID, b.h.ids().Key(it.group), it.rec.MessageId); err == nil {
			lg.InfoContext(ctx, "halt cleared", "how", how, "halted_since", it.halted.Since)
			return nil
		}
		if try == clearTries || clock.Sleep(ctx, wait) != nil {
			break
		}
		wait *= 2
	}
	lg.ErrorContext(ctx, "clear halt failed; the change stays at the head of its group", "how", how, "error", err)
	return fmt.Errorf("clear halt: %w", err)
}

// setVisibility keeps a message in flight for d. Best effort.
func (b *batch) setVisibility(ctx context.Context, it *item, d time.Duration) {
	if it.rec.ReceiptHandle == "" {
		return
	}
	q, err := b.h.queueURL(ctx, b.h.Config.QueueName(b.route.Job, b.route.Output))
	if err != nil {
		return
	}
	_, _ = b.h.SQS.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: &q, ReceiptHandle: &it.rec.ReceiptHandle, VisibilityTimeout: int32(d.Seconds()),
	})
}
