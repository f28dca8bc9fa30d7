package poll

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/metrics"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

// invocation is the state of one Run. Its methods run on Run's goroutine,
// with three exceptions: the checkpoint write left in flight while the next
// batch is read (see checkpoint), which every other lease write and every
// send waits for first (settle); the fences of the chunks queued in the
// background (see startSend), which run under mu; and the heartbeat, which
// renews the lease under mu (see heartbeat). Run's goroutine holds mu from
// the first batch to the last, and lets go of it only while it waits (for a
// read with its bodies and attachments, for a chunk in flight, for a
// backoff), so that a fence or a renewal never runs beside its own work.
type invocation struct {
	mu sync.Mutex

	p     *Poller
	log   *slog.Logger
	owner string
	sess  *lease.Session
	lease *lease.Lease // held, from the session
	end   time.Time    // the budget: the deadline minus a margin
	res   Result

	ledger     ledger        // the checkpoint: written, queued, in flight
	counter    int64         // observation order within this generation
	backoff    time.Duration // after the source's last failure
	lastErr    error         // the source's last failure, reported if the budget ends on it
	slowest    time.Duration // the longest chunk so far, to plan the budget
	caughtUpAt time.Time
	started    time.Time // when the invocation began, for its idle stay
	changedAt  time.Time // when the last batch with changes was read
	atTail     bool      // the last batch left the feed with nothing more to read
	standby    bool      // "standing by" was logged
	marked     bool      // this invocation has marked the job item as a standby
	duplicate  string    // why another invocation runs for this one's event, when it does
	stopWait   context.CancelFunc
	reportedAt time.Time // when report last wrote the metrics
	stopped    error     // the renewal that failed while Run's goroutine waited (see heartbeat)

	str streaming // the streaming feed, when the job reads one

	seen misreads // malformed rows and unreadable pages met, to quarantine
	held error    // the malformed row the last batch was cut before, or nil

	targets     []fanout.Target // the poller's, with the job's replay epoch
	ahead       *readAhead      // the pages read ahead, or nil
	sends       []*sending      // the chunks in flight, oldest first
	sendCtx     context.Context // the sends', cancelled to abandon them
	cancelSends context.CancelFunc
	depth       int          // chunks in flight at most
	fifo        bool         // an output keeps each document's order
	inflight    chan written // the checkpoint write in flight, or nil
}

// written is the outcome of a checkpoint write made in the background: the
// write works on a copy of the lease, merged back by settle, so that the
// fence can read the lease meanwhile.
type written struct {
	err   error
	lease lease.Lease
}

func (v *invocation) now() time.Time { return v.p.Clock.Now() }

// acquire takes the lease, or stands by watching the job item until the
// lease is released or expires. A standby whose budget ends, or whose
// context does, leaves v.lease nil and returns nil.
func (v *invocation) acquire(ctx context.Context) error {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	v.stopWait = stop
	err := v.sess.Wait(wctx, v.end)
	switch {
	case err == nil:
		v.lease = v.sess.Lease()
		return nil
	case v.duplicate != "":
		v.log.InfoContext(ctx, "another invocation runs for this event; ending", "seen", v.duplicate)
		return nil
	case errors.Is(err, lease.ErrLeaseHeld):
		return nil // stood by for the whole budget
	case wctx.Err() != nil && err == wctx.Err():
		return nil // stopped while standing by (a failed write comes back wrapped)
	}
	v.p.count(metrics.PollerErrors, 1)
	return err
}

// An asynchronous event can reach the poller twice with the same request id,
// its owner id: AWS documents that an event may be delivered more than once,
// and LocalStack invokes an event again when its invocation outlasts its
// client's read timeout. Two invocations under one owner id cannot share the
// lease (it is held by owner and generation), but the second would stand by
// for its whole budget, two schedule periods, for nothing. So an invocation
// that, before it marks the job item itself, finds its own owner id there,
// holding the lease or marked as a standby within the last marking interval,
// ends at once. It looks for the first markDelay of its watch and marks the
// item only after it, so that it never mistakes its own mark for another's.

// markDelay is how long a standby watches the job item before it marks it:
// long enough to see the marks of every other standby at least once.
func (v *invocation) markDelay() time.Duration {
	return min(v.p.Job.Lease.TTL.D(), 10*time.Second)
}

// announce marks the job item with this standby once it has watched it for
// markDelay (the session asks every third of a TTL).
func (v *invocation) announce(ctx context.Context, job, owner string) error {
	if v.now().Sub(v.started) < v.markDelay() {
		return nil
	}
	v.marked = true
	return v.p.Leases.MarkStandby(ctx, job, owner)
}

// duplicateOf says why holder shows another invocation with this one's owner
// id, or "" when it does not.
func (v *invocation) duplicateOf(holder *lease.State) string {
	if v.marked || holder == nil {
		return ""
	}
	now := v.now()
	if holder.Owner == v.owner && holder.Held(now) {
		return "holder"
	}
	// A standby marks every third of a TTL, at its next look.
	recent := v.p.Job.Lease.TTL.D()/3 + 2*v.sess.Interval
	if holder.Standby == v.owner && now.Sub(holder.StandbySeenAt) < recent {
		return "standby"
	}
	return ""
}

// standingBy runs on every round of the standby's watch.
func (v *invocation) standingBy(ctx context.Context, holder *lease.State) {
	if why := v.duplicateOf(holder); why != "" {
		v.duplicate = why
		v.stopWait()
		return
	}
	if !v.standby {
		v.log.InfoContext(ctx, "standing by", "holder", holder.Owner, "generation", holder.Generation)
		v.standby = true
	}
	v.p.Metrics.AddHighRes(metrics.Role, 0, metrics.None)
	if holder.Exists && !holder.HeartbeatAt.IsZero() {
		v.p.Metrics.AddHighRes(metrics.HeartbeatAgeSeconds, v.now().Sub(holder.HeartbeatAt).Seconds(), metrics.Seconds)
	}
}

// start records the takeover.
func (v *invocation) start(ctx context.Context) {
	l := v.lease
	v.res = Result{Role: "active", Generation: l.Generation, Takeover: l.Kind, Checkpoint: l.Checkpoint}
	v.ledger, v.caughtUpAt = newLedger(l.Checkpoint, l.Previous.CheckpointAt), v.now()
	// Changes queued again after an operator set the checkpoint back are
	// not repeats to a FIFO queue's deduplication.
	v.targets = make([]fanout.Target, len(v.p.Targets))
	for i, t := range v.p.Targets {
		t.Epoch = l.Previous.ReplayEpoch
		v.targets[i] = t
	}
	v.log = v.log.With("generation", l.Generation)
	v.log.InfoContext(ctx, "lease acquired", "takeover", l.Kind, "previous_owner", l.Previous.Owner, "checkpoint", string(l.Checkpoint))
	v.p.count(metrics.LeaseAcquired, 1)
	switch l.Kind {
	case lease.Failover:
		v.p.count(metrics.Failovers, 1)
		if v.p.OnFailover != nil {
			v.p.OnFailover(ctx)
		}
	case lease.Handoff:
		v.p.count(metrics.Handoffs, 1)
	}
	v.p.Metrics.AddHighRes(metrics.Role, 1, metrics.None)
}

// finish ends an active invocation: a lost lease is left alone (someone
// else holds it), otherwise the lease is released.
func (v *invocation) finish(ctx context.Context, err error) (Result, error) {
	if errors.Is(err, lease.ErrLeaseLost) {
		v.log.WarnContext(ctx, "lease lost; stopping", "error", err)
		v.p.count(metrics.LeaseLost, 1)
		v.res.Role = "fenced"
		return v.res, nil
	}
	// Released first: the standby takes over as the release lands.
	if rerr := v.sess.Release(ctx); rerr != nil {
		v.log.WarnContext(ctx, "release lease", "error", rerr)
	} else {
		v.log.InfoContext(ctx, "lease released", "checkpoint", string(v.res.Checkpoint))
	}
	if n, ok := v.p.Leases.(notes); ok && int64(v.res.Read) > v.p.largest.Load() {
		// Like the release, the note outlives a cancelled invocation (a
		// local run stopping once idle), for a short while.
		nctx, cancel := lease.TailContext(ctx, noteTimeout)
		nerr := n.NoteLargestBatch(nctx, v.p.Job.ID, int64(v.res.Read))
		cancel()
		if nerr != nil {
			v.log.WarnContext(ctx, "record largest batch", "error", nerr)
		} else {
			v.p.largest.Store(int64(v.res.Read))
		}
	}
	return v.res, err
}

// errEnded ends an invocation with nothing to report: the budget is spent,
// the feed rests, or the context ended, and what was queued before is
// recorded. It is the one way a step of the loop stops the invocation
// without an error of its own: every step returns an error, nil to go on
// and anything else to stop, and loop returns nil for errEnded.
var errEnded = errors.New("invocation ended")

// ended is err, or errEnded when err is nil: a step that stops the
// invocation after a call that may have failed.
func ended(err error) error {
	if err != nil {
		return err
	}
	return errEnded
}

// loop reads, queues and checkpoints batches until the budget is spent
// (nil, or the source's last failure), the lease is lost (ErrLeaseLost) or
// something fails for good.
//
// The pipeline overlaps what has no side effects with what does: the pages
// after the current one are read while it is queued (readAhead), merged
// into one batch when they have arrived by then, and a batch's closing
// checkpoint is written while the next batch is queued. The rules hold:
// batches are queued one after another, in feed order, so a document's
// changes reach a FIFO queue in order; a checkpoint names only pages queued
// whole (ledger), and is written only after the one before it (settle); the
// fence is still asked before every request. In a streaming mode, once
// caught up, batches come from one stream instead of pages (see streaming),
// with nothing read ahead.
func (v *invocation) loop(parent context.Context) error {
	work, cut := workContext(parent)
	defer cut()
	ctx, stop := context.WithCancel(work)
	beating := v.heartbeat(ctx, stop)
	err := v.rounds(ctx, work, stop)
	cut() // the work is over: the cause stays errCut only if it was cut
	<-beating
	cutShort := errors.Is(context.Cause(work), errCut) && parent.Err() == nil
	if cutShort {
		v.log.WarnContext(parent, "work cut short before the deadline; what was not queued is read again from the checkpoint",
			"checkpoint", string(v.ledger.checkpoint()))
	}
	switch {
	case v.stopped != nil:
		return v.stopped
	case errors.Is(err, errEnded), cutShort:
		return nil
	}
	return err
}

// workReserve is what an invocation's work (reads, sends) leaves free
// before its deadline, however long a step that started within the budget
// takes: the writes it makes as it ends have half a second before
// lease.TailReserve.
const workReserve = lease.TailReserve + 500*time.Millisecond

// errCut is the cause of a work context cut short before its deadline.
var errCut = errors.New("cut short before the deadline")

// workContext is parent, cancelled with errCut workReserve before its
// deadline. A step still under way then (a read, a send to SQS that a
// loaded host or service slowed far past the slowest batch so far) ends
// there: its changes are read again by the next holder, since the
// checkpoint names only what was queued. Cancelled rather than given an
// earlier deadline, so that the writes as the invocation ends
// (lease.TailContext) keep the function's deadline as their bound.
func workContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	deadline, ok := parent.Deadline()
	if !ok {
		return ctx, func() { cancel(nil) }
	}
	t := time.AfterFunc(time.Until(deadline.Add(-workReserve)), func() { cancel(errCut) })
	return ctx, func() { t.Stop(); cancel(nil) }
}

// rounds holds the invocation and runs rounds until one stops it, then
// winds the pipeline down; stop ends the heartbeat. The sends are made
// under parent: a request already on its way to SQS cannot be called back,
// so the heartbeat's stop leaves the sends in flight alone, and their next
// fence refuses.
func (v *invocation) rounds(ctx, parent context.Context, stop context.CancelFunc) error {
	// Deferred calls run last first: the chunks still in flight are
	// abandoned, the checkpoint write in flight is settled, then the
	// reader stopped, the stream closed, and the heartbeat stopped
	// before it may renew again.
	v.mu.Lock()
	defer v.mu.Unlock()
	defer stop()
	defer v.closeStream(ctx)
	defer func() { v.ahead.stop() }()
	defer func() { _ = v.settle() }()
	v.sendCtx, v.cancelSends = context.WithCancel(parent)
	defer v.cancelSends()
	defer v.abandonSends()
	v.planSends()
	for {
		if err := v.round(ctx); err != nil {
			return err
		}
	}
}

// planSends sets how many chunks may be in flight, and whether an output
// keeps each document's order.
func (v *invocation) planSends() {
	v.depth = v.p.SendDepth
	if v.depth <= 0 {
		v.depth = DefaultSendDepth
	}
	for _, t := range v.p.Targets {
		v.fifo = v.fifo || t.FIFO
		if t.Total {
			v.depth = 1 // one message group: the whole feed in order
		}
	}
}

// round reads the next batch, queues it and checkpoints what is due. A
// non-nil error stops the invocation (errEnded: with nothing to report).
func (v *invocation) round(ctx context.Context) error {
	v.p.Metrics.AddHighRes(metrics.Role, 1, metrics.None)
	// Start another batch only if the slowest one so far would still
	// fit, or, at the tail of the feed, wait on it to the end of the
	// budget (lastLook). Checked before the heartbeat: past the budget
	// the context may be done, and the lease is about to be released
	// anyway.
	if !v.fits() && !v.lastLook() {
		if err := v.saveQueued(ctx); err != nil {
			return err
		}
		return ended(v.lastErr)
	}
	if err := v.keepAlive(ctx); err != nil {
		return err
	}
	streamed := v.streams()
	if err := v.awaitPage(ctx); err != nil {
		return err
	}
	batch, rerr := v.next(ctx, streamed)
	if rerr != nil {
		return v.readFailed(ctx, rerr, streamed)
	}
	if streamed {
		v.cutStream(ctx, batch)
	} else {
		v.paged(batch)
	}
	v.received(ctx, batch)
	v.atTail = v.held == nil && !v.more(batch)
	v.readOn(ctx, batch, streamed)
	if err := v.queue(ctx, batch); err != nil {
		return err
	}
	if err := v.checkpointDue(ctx); err != nil {
		return err
	}
	v.report(ctx, batch)
	if v.rests(batch) {
		v.log.InfoContext(ctx, "feed idle; the next tick reads on", "checkpoint", string(v.ledger.checkpoint()))
		return ended(v.saveQueued(ctx))
	}
	if v.held != nil {
		return v.holdBack(ctx)
	}
	return nil
}

// awaitPage records the chunks in flight as they finish until the next
// page read ahead is here, rather than leave them unrecorded for as long
// as the read takes (a long poll, past the end of the feed).
func (v *invocation) awaitPage(ctx context.Context) error {
	for len(v.sends) > 0 && !v.ahead.ready() {
		var arrived bool
		done := v.sends[0].done
		v.unlocked(func() { arrived = v.ahead.await(ctx, done) })
		if arrived {
			return nil
		}
		if err := v.completeOldest(ctx); err != nil {
			return err
		}
	}
	return nil
}

// next takes the next batch (see take), with the invocation unlocked, and
// screens its rows (held is the row it was cut before, or nil).
func (v *invocation) next(ctx context.Context, streamed bool) (*feed.Batch, error) {
	var batch *feed.Batch
	var err error
	v.unlocked(func() { batch, err = v.take(ctx, streamed) })
	v.held = nil
	if err != nil {
		return nil, err
	}
	v.held = v.screen(ctx, batch)
	return batch, nil
}

// take reads the next batch: from the stream when streamed, else what was
// read ahead from where the last batch ended, else a page read now.
func (v *invocation) take(ctx context.Context, streamed bool) (*feed.Batch, error) {
	if streamed {
		v.stopReading()
		return v.readStream(ctx)
	}
	from := v.ledger.next()
	if v.ahead != nil {
		if b, ok, err := v.ahead.take(ctx, from, v.mergeRows(), v.chunkBytes()); ok {
			return b, err
		}
		v.stopReading()
	}
	return v.read(ctx, from)
}

// readOn keeps the feed read ahead of the batch being queued while the
// source has more: the reader goes on from where it is, or starts after
// batch. A batch cut short stops it, the next read starting at the cut.
func (v *invocation) readOn(ctx context.Context, batch *feed.Batch, streamed bool) {
	switch {
	case streamed:
	case v.held != nil || !v.more(batch):
		v.stopReading()
	case v.ahead == nil:
		v.ahead = v.readAhead(ctx, nextSince(batch), v.readTimeout())
	}
}

// stopReading stops the reader, if any.
func (v *invocation) stopReading() {
	v.ahead.stop()
	v.ahead = nil
}

// readFailed handles a failed read, after recording what was queued
// before. A non-nil error stops the invocation.
func (v *invocation) readFailed(ctx context.Context, err error, streamed bool) error {
	if serr := v.saveQueued(ctx); serr != nil {
		return serr
	}
	if streamed {
		return v.streamFailed(ctx, err)
	}
	return v.sourceFailed(ctx, err)
}

// holdBack waits before the malformed row the last batch was cut before is
// read again (see Poller.screen), as after a source failure. When the
// budget or the context ends first, it stops the invocation with what was
// queued recorded.
func (v *invocation) holdBack(ctx context.Context) error {
	v.p.count(metrics.PollerErrors, 1)
	v.lastErr = v.held
	v.backoff = nextBackoff(v.backoff)
	v.log.WarnContext(ctx, "malformed feed row; reading it again", "error", v.held, "backoff", v.backoff.String(), "checkpoint", string(v.ledger.checkpoint()))
	if v.now().Add(v.backoff).After(v.end) || v.sleep(ctx, v.backoff) != nil {
		return ended(v.saveQueued(ctx))
	}
	return nil
}

// sleep waits for d, or until ctx ends, with the invocation unlocked so
// that the heartbeat runs meanwhile.
func (v *invocation) sleep(ctx context.Context, d time.Duration) (err error) {
	v.unlocked(func() { err = clock.Sleep(ctx, d) })
	return err
}

// heartbeat keeps the lease alive while Run's goroutine waits with the
// invocation unlocked (a read with its bodies and attachments, a chunk in
// flight, a backoff), however long the wait: every HeartbeatInterval it
// takes mu and renews the lease when due (keepAlive), as the loop does
// between batches. A renewal that fails (refused: the lease is lost)
// stops the invocation: the error is kept in v.stopped, which every later
// fence and renewal returns, so no request starts after it, and stop
// cancels what Run's goroutine waits for (a read, a backoff; the requests
// of a chunk in flight finish, see rounds). The channel returned is closed
// once ctx has ended and the heartbeat with it.
func (v *invocation) heartbeat(ctx context.Context, stop context.CancelFunc) <-chan struct{} {
	done := make(chan struct{})
	every := v.p.HeartbeatInterval
	if every <= 0 {
		every = v.p.Job.Lease.TTL.D() / 10
	}
	go func() {
		defer close(done)
		clock.Every(ctx, every, func() bool {
			v.mu.Lock()
			defer v.mu.Unlock()
			if ctx.Err() != nil || v.stopped != nil {
				return false
			}
			if err := v.keepAlive(ctx); err != nil && ctx.Err() == nil {
				v.log.WarnContext(ctx, "lease renewal failed while waiting; stopping", "error", err)
				v.stopped = err
				stop()
			}
			return true
		})
	}()
	return done
}

// keepAlive renews the lease when its heartbeat is due. A checkpoint write
// in flight renews it too: wait for that one first. After the heartbeat
// stopped the invocation, it returns that renewal's error.
func (v *invocation) keepAlive(ctx context.Context) error {
	if v.stopped != nil {
		return v.stopped
	}
	if v.inflight != nil && v.now().Sub(v.lease.RenewedAt) >= v.p.Job.Lease.TTL.D()/3 {
		if err := v.settle(); err != nil {
			return err
		}
	}
	if v.inflight != nil {
		return nil
	}
	return v.sess.KeepAlive(ctx)
}

// fence runs before every SQS request (from the sender's goroutines, one at
// a time, while Run's goroutine waits in Send). The lease it reads is not
// written meanwhile: a checkpoint write in flight works on a copy. When the
// lease needs renewing, that write is waited for first, so lease writes stay
// in order. Once the heartbeat stopped the invocation, it refuses.
func (v *invocation) fence(ctx context.Context) error {
	if v.stopped != nil {
		return fmt.Errorf("%w: %w", lease.ErrFenced, v.stopped)
	}
	if v.inflight != nil {
		// A write that has returned is taken at once: a refused one
		// stops the sends as soon as it is known.
		wait := v.lease.Remaining(v.now()) < v.p.Job.Lease.TTL.D()/2
		if err := v.settleIf(wait); err != nil {
			return err
		}
	}
	return v.sess.Fence(ctx)
}

// more reports whether the page after b is worth reading ahead: b was full
// (Batch.Full: as many rows as asked for, or cut short) or the source says
// more is pending. A page that ends the feed is followed by a long poll,
// read in its turn; a cut page is not the end of the feed, so it neither
// stops the reader nor opens a stream.
func (v *invocation) more(b *feed.Batch) bool {
	if len(b.Rows) == 0 {
		return false
	}
	if b.Pending >= 0 {
		return b.Pending > 0
	}
	return b.Full || len(b.Rows) >= v.p.Job.Feed.Limit
}

// nextSince is where the page after b starts.
func nextSince(b *feed.Batch) json.RawMessage {
	if len(b.LastSeq) > 0 {
		return b.LastSeq
	}
	return b.Rows[len(b.Rows)-1].Seq
}

// fits reports whether the budget still has room for the slowest chunk so
// far.
func (v *invocation) fits() bool {
	return v.end.Sub(v.now()) >= 500*time.Millisecond+v.slowest
}

// The holder hands the lease over as its budget ends, the moment it
// announced as it took the lease (Session.ReleaseAt), so that the standby
// takes over then, and the feed is watched up to that moment: once the
// budget has no room for another batch of the slowest size (fits), an
// invocation at the tail of the feed still waits on it, for a change, until
// the budget ends (lastLook). What such a read brings is what arrived
// meanwhile, a trickle, queued before the release (one chunk at most, see
// queue). A source that ignores the long-poll timeout is cut at the
// feed's slack after it, in the margin kept for the release.

// minLastLook is the shortest wait on the feed worth a read.
const minLastLook = 10 * time.Millisecond

// lastLook reports whether the invocation, though the budget has no room
// for another batch of the slowest size, waits on the feed until the budget
// ends: the last batch left the feed with nothing more to read, nothing is
// read ahead, in flight or held back by a failure, and the wait is worth a
// read.
func (v *invocation) lastLook() bool {
	return v.atTail && v.lastErr == nil && v.held == nil && v.ahead == nil && len(v.sends) == 0 &&
		v.end.Sub(v.now()) >= minLastLook
}

// read reads the next batch from the checkpoint, with the bodies. It
// long-polls no longer than the heartbeat interval (minus the time the
// client allows a source past its timeout), so renewals keep their pace,
// and never past the budget.
func (v *invocation) read(ctx context.Context, since json.RawMessage) (*feed.Batch, error) {
	return v.fetch(ctx, since, v.waitTimeout())
}

// readTimeout is the long-poll timeout of a read starting now: the last
// look (see lastLook) waits to the end of the budget; the reads before it
// end the feed's slack before, so that a source that ignores the timeout
// does not keep them past it either.
func (v *invocation) readTimeout() time.Duration {
	ttl := v.p.Job.Lease.TTL.D()
	remaining := v.end.Sub(v.now())
	if !v.fits() {
		return max(min(v.p.Job.Feed.Timeout.D(), ttl/3-feed.DefaultSlack, remaining), time.Millisecond)
	}
	return max(min(v.p.Job.Feed.Timeout.D(), ttl/3-feed.DefaultSlack, remaining-feed.DefaultSlack), 250*time.Millisecond)
}

// waitTimeout is how long a read (a long poll, or a wait on the stream)
// waits for a change: the long-poll timeout, or less when a checkpoint held
// back falls due sooner, or when a sleeping job's idle stay ends sooner
// (untilStay).
func (v *invocation) waitTimeout() time.Duration {
	w := v.readTimeout()
	if due, ok := v.ledger.dueIn(v.now()); ok {
		w = min(w, max(due, 10*time.Millisecond))
	}
	return v.untilStay(w)
}

// screen decides on the batch's rows that name no document (see
// Poller.screen), which may cut the batch; it returns the error of the row
// it was cut before, or nil.
func (v *invocation) screen(ctx context.Context, b *feed.Batch) error {
	if v.seen == nil {
		v.seen = misreads{}
	}
	return v.p.screen(ctx, v.ledger.next(), b, v.seen, v.log)
}

// fetch reads the page from since with its bodies; its rows that name no
// document are left for screen. It touches no state of the invocation, so
// it may run beside it.
func (v *invocation) fetch(ctx context.Context, since json.RawMessage, timeout time.Duration) (*feed.Batch, error) {
	batch, err := v.p.Feed.Changes(ctx, since, timeout)
	if err == nil && len(batch.Rows) > 0 {
		err = v.p.Feed.FetchBatch(ctx, batch)
	}
	return batch, err
}

// sourceFailed handles a failed read: the checkpoint stays where it is; a
// transient failure is retried after a backoff while the budget allows.
// A non-nil error stops the invocation.
func (v *invocation) sourceFailed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return errEnded
	}
	v.p.count(metrics.PollerErrors, 1)
	if v.seen == nil {
		v.seen = misreads{}
	}
	v.p.pageFailed(ctx, v.ledger.position(), err, v.seen, v.log)
	var se *feed.StatusError
	if n, ok := v.p.Leases.(notes); ok && errors.As(err, &se) && (se.Status == 401 || se.Status == 403) {
		v.log.ErrorContext(ctx, "source refused our credentials", "status", se.Status)
		if err := n.NoteSourceAuthFailure(ctx, v.p.Job.ID, v.now()); err != nil {
			v.log.WarnContext(ctx, "record source auth failure", "error", err)
		}
	}
	if !feed.Transient(err) {
		v.log.ErrorContext(ctx, "source failed; checkpoint unchanged", "error", err, "checkpoint", string(v.ledger.checkpoint()))
		return err
	}
	v.lastErr = err
	v.backoff = nextBackoff(v.backoff)
	v.log.WarnContext(ctx, "source unavailable; retrying", "error", err, "backoff", v.backoff.String(), "checkpoint", string(v.ledger.checkpoint()))
	if v.now().Add(v.backoff).After(v.end) {
		return err
	}
	if v.sleep(ctx, v.backoff) != nil {
		return errEnded
	}
	return nil
}

// received records a batch read.
func (v *invocation) received(ctx context.Context, b *feed.Batch) {
	if v.held == nil {
		v.backoff, v.lastErr = 0, nil
	}
	if b.Cut != "" {
		v.log.InfoContext(ctx, "page cut short", "reason", b.Cut, "rows", len(b.Rows), "checkpoint", string(v.ledger.checkpoint()))
	}
	v.sess.Pending = b.Pending
	v.p.count(metrics.ChangesRead, float64(len(b.Rows)))
	before := v.res.Read
	v.res.Read += len(b.Rows)
	// Flood detection counts what one invocation read: the changes the
	// source had waiting for this tick.
	v.p.Metrics.Add(metrics.LargestBatch, float64(v.res.Read), metrics.Count)
	if thr := v.p.Job.Feed.FloodThreshold; thr > 0 && before <= thr && v.res.Read > thr {
		v.p.count(metrics.FloodBatches, 1)
		v.log.WarnContext(ctx, "flood detected: more changes in one invocation than the threshold", "changes", v.res.Read, "threshold", thr, "pending", b.Pending)
	}
	if b.Pending >= 0 {
		v.p.Metrics.Add(metrics.PendingChanges, float64(b.Pending), metrics.Count)
	}
}

// queue queues the batch in chunks of rows: every row's seq is a valid
// place to resume, so a slow output or the end of the budget costs at most
// one chunk, never the whole batch. While the feed is read ahead (catching
// up), the last chunks may still be in flight when it returns; they are
// recorded, in order, as later chunks start (startSend). A non-nil error
// stops the invocation.
func (v *invocation) queue(ctx context.Context, b *feed.Batch) error {
	for start, end := 0, 0; start < len(b.Rows); start = end {
		end = v.chunkEnd(b.Rows, start)
		s := v.newSending(b, start, end)
		if err := v.makeRoom(ctx, s); err != nil {
			return err
		}
		if start > 0 && !v.fits() {
			return ended(v.saveQueued(ctx))
		}
		if err := v.startSend(ctx, s); err != nil {
			return err
		}
	}
	if v.ahead == nil {
		// Nothing read ahead: caught up, cut short or streamed. What the
		// next batch starts from must be queued.
		if err := v.drain(ctx); err != nil {
			return err
		}
	}
	if len(b.Rows) == 0 && len(b.LastSeq) > 0 && string(b.LastSeq) != string(v.ledger.position()) {
		// Nothing to queue, but the feed moved (filtered or local docs):
		// recorded when due (checkpointDue).
		v.ledger.reached(mark{seq: b.LastSeq, left: b.Pending})
	}
	return nil
}

// chunkEnd is where the chunk that starts at rows[start] ends: after
// ChunkRows rows, or after the row that brings its bodies to ChunkBytes,
// which bounds what one Send holds encoded (each body once, and again per
// output).
func (v *invocation) chunkEnd(rows []feed.Row, start int) int {
	n, budget := v.chunkRows(), v.chunkBytes()
	end, size := start, 0
	for end < len(rows) && end-start < n && size < budget {
		size += len(rows[end].Doc)
		end++
	}
	return end
}

func (v *invocation) chunkRows() int {
	if v.p.ChunkRows > 0 {
		return v.p.ChunkRows
	}
	return DefaultChunkRows
}

// mergeRows is how many rows a batch merged from pages read ahead may hold:
// a page's (the feed limit) with one chunk in flight, so that a failover
// replays at most one batch; a chunk's with more.
func (v *invocation) mergeRows() int {
	if v.depth > 1 {
		return v.chunkRows()
	}
	return min(v.chunkRows(), v.p.Job.Feed.Limit)
}

func (v *invocation) chunkBytes() int {
	if v.p.ChunkBytes > 0 {
		return v.p.ChunkBytes
	}
	return DefaultChunkBytes
}

// sendFailed ends the invocation after a failed send: the checkpoint stays
// before the chunk (the next holder sends it again), after recording what
// earlier chunks queued. It returns the error the invocation stops with,
// errEnded when the failure was the invocation's context ending.
func (v *invocation) sendFailed(ctx context.Context, err error) error {
	if errors.Is(err, lease.ErrLeaseLost) {
		return err // refused by the fence's renewal
	}
	if ctx.Err() != nil {
		v.log.WarnContext(ctx, "deadline reached while queueing", "checkpoint", string(v.ledger.checkpoint()))
		return ended(v.saveQueued(ctx))
	}
	v.p.count(metrics.PollerErrors, 1)
	v.log.ErrorContext(ctx, "queue changes; checkpoint stays before them", "error", err, "checkpoint", string(v.ledger.checkpoint()))
	if serr := v.saveQueued(ctx); serr != nil {
		return serr
	}
	return fmt.Errorf("queue changes: %w", err)
}

// queued records that SQS accepted the chunk s. Its end (the batch's
// last_seq after the final chunk) is a safe place to resume once every
// chunk before it is accepted too (ledger). The final chunk's checkpoint is
// written while the next batch is read; within a batch, a chunk is
// checkpointed only when checkpointEvery has passed since the last
// checkpoint, so a failover replays at most about a second of sends or one
// batch.
func (v *invocation) queued(ctx context.Context, s *sending) error {
	if !v.ledger.ack(s.entry) {
		return nil
	}
	last := s.end == len(s.b.Rows)
	switch {
	case last && !v.more(s.b) && v.ledger.recent(v.now()):
		// A batch that ends the feed, from a long poll or a stream,
		// comes as soon as a change does: under a trickle its
		// checkpoint is spaced like chunks' (see checkpointDue). A full
		// batch's is written, so a failover replays at most about a
		// second of changes, and less than a batch. The write before
		// is still waited for, so a refusal stops the sends here as it
		// would have.
		return v.settle()
	case last:
		return v.checkpoint(ctx, true)
	case !v.ledger.recent(v.now()):
		return v.checkpoint(ctx, false)
	}
	return nil
}

// checkpoint writes the position queued and held back (see ledger) as the
// checkpoint, renewing the lease. Reads have no side effects, so only the
// order of writes matters: an async write is left in flight while the next
// batch is read, and the next lease write or send waits for it first. With
// nothing held back, it only settles.
func (v *invocation) checkpoint(ctx context.Context, async bool) error {
	if err := v.settle(); err != nil {
		return err
	}
	m, ok := v.ledger.take(v.now())
	if !ok {
		return nil
	}
	v.res.Checkpoint = m.seq
	if async {
		v.inflight = v.writeAsync(ctx, m)
		return nil
	}
	if err := v.p.Leases.Checkpoint(ctx, v.lease, m.seq, m.left); err != nil {
		return err
	}
	v.p.count(metrics.Checkpoints, 1)
	return nil
}

// writeAsync writes a checkpoint in the background. The write outlives a
// cancelled invocation context: what was queued should be recorded, and the
// lease condition still guards it.
func (v *invocation) writeAsync(ctx context.Context, m mark) chan written {
	done := make(chan written, 1)
	cctx, cancel := lease.TailContext(ctx, v.p.Job.Lease.TTL.D()/2)
	l := *v.lease
	go func() {
		defer cancel()
		err := v.p.Leases.Checkpoint(cctx, &l, m.seq, m.left)
		if err == nil {
			v.p.count(metrics.Checkpoints, 1)
		}
		done <- written{err: err, lease: l}
	}()
	return done
}

// settle waits for the checkpoint write in flight, if any, and takes the
// renewal it made.
func (v *invocation) settle() error { return v.settleIf(true) }

// settleIf is settle when wait is set; otherwise it takes the write only if
// it has already returned.
func (v *invocation) settleIf(wait bool) error {
	if v.inflight == nil {
		return nil
	}
	var w written
	if wait {
		w = <-v.inflight
	} else {
		select {
		case w = <-v.inflight:
		default:
			return nil
		}
	}
	v.inflight = nil
	if w.err != nil {
		return w.err
	}
	if w.lease.RenewedAt.After(v.lease.RenewedAt) {
		v.lease.RenewedAt = w.lease.RenewedAt
	}
	v.lease.Checkpoint = w.lease.Checkpoint
	return nil
}

// checkpointDue writes the checkpoint held back from a stream's batches
// once checkpointEvery has passed since the last one: after a batch, and
// after a wait on the stream that nothing ended (streamWait bounds it).
func (v *invocation) checkpointDue(ctx context.Context) error {
	if !v.ledger.due(v.now()) {
		return nil
	}
	return v.checkpoint(ctx, true)
}

// saveQueued checkpoints what was queued but not yet recorded, before the
// invocation stops.
func (v *invocation) saveQueued(ctx context.Context) error {
	if err := v.drain(ctx); err != nil {
		return err
	}
	if !v.ledger.held() {
		return nil
	}
	// Written as in the background, so a cancelled invocation still
	// records it, and waited for.
	if err := v.checkpoint(ctx, true); err != nil {
		return err
	}
	return v.settle()
}

// report publishes where the job stands after a batch. An invocation
// that sleeps while idle and has read nothing publishes only that it holds
// the lease (see quiet).
func (v *invocation) report(ctx context.Context, b *feed.Batch) {
	caughtUp := b.CaughtUp()
	v.res.CaughtUp = caughtUp
	if v.p.OnBatch != nil {
		v.p.OnBatch(caughtUp)
	}
	if caughtUp {
		v.caughtUpAt = v.now()
	}
	if v.quiet() {
		return
	}
	// Lag: how long since the poller last saw the end of the feed.
	v.p.Metrics.Add(metrics.LagSeconds, v.now().Sub(v.caughtUpAt).Seconds(), metrics.Seconds)
	if age, ok := v.ledger.age(v.now()); ok {
		v.p.Metrics.Add(metrics.CheckpointAgeSeconds, age.Seconds(), metrics.Seconds)
	}
	// A batch that read nothing is published with the next that reads
	// something, or with the first of the next minute: a watched idle feed
	// writes one record a minute, not one per long poll, and every
	// minute the lease is held still has its data point (the alarms' periods
	// are whole minutes). Its values are stamped at most a long poll late.
	now := v.now()
	if len(b.Rows) == 0 && !v.reportedAt.IsZero() && now.Truncate(time.Minute).Equal(v.reportedAt.Truncate(time.Minute)) {
		return
	}
	v.reportedAt = now
	if err := v.p.Metrics.Flush(); err != nil {
		v.log.WarnContext(ctx, "flush metrics", "error", err)
	}
}

// envelopes turns feed rows into changes, applying the job's filters and
// numbering them in observation order.
func (v *invocation) envelopes(rows []feed.Row) []*change.Envelope {
	now := v.now().UTC()
	proc := v.p.Job.Processing
	out := make([]*change.Envelope, 0, len(rows))
	for _, r := range rows {
		if (r.Deleted && proc.IgnoreDelete) || (r.Removed && proc.IgnoreRemove) {
			continue
		}
		v.counter++
		e := &change.Envelope{
			V: change.EnvelopeVersion, Job: v.p.Job.ID, DocID: r.ID, Rev: r.Rev, Seq: r.Seq,
			Deleted: r.Deleted, Removed: r.Removed, EnqueuedAt: now,
			Version: change.Version{Generation: v.lease.Generation, Counter: v.counter},
		}
		if !e.Tombstone() {
			e.Doc = r.Doc
		}
		out = append(out, e)
	}
	return out
}
