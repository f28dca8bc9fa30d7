package writer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/metrics"
	"github.com/changes-worker/changes-worker/shared/statetable/outage"
)

// Outages is the part of the outage store the handler calls (package
// outage): the record changesctl status shows while an output is down, and
// on a FIFO output the one place that says whether its intake is paused
// (Pause, ClaimProbe, ProbeFailed, Resuming, Resumed; see Intake). Clear
// reports whether there was a record to delete; it leaves one whose intake
// is paused or resuming.
type Outages interface {
	Mark(ctx context.Context, st outage.State) error
	Clear(ctx context.Context, job, output string) (bool, error)
	Get(ctx context.Context, job, output string) (*outage.State, error)
	Pause(ctx context.Context, st outage.State) (bool, error)
	ClaimProbe(ctx context.Context, job, output string, now, until time.Time) (*outage.State, error)
	ProbeFailed(ctx context.Context, st outage.State, until time.Time) error
	Resuming(ctx context.Context, job, output string) error
	Resumed(ctx context.Context, job, output string) (bool, error)
}

var _ Outages = (*outage.Store)(nil)

// Secrets is told when an output failed in a way a corrected secret may fix,
// so that the next open of the output reads its secrets again
// (secret.Resolver, which keeps a floor between reads).
type Secrets interface {
	Refresh()
}

// Failure reasons the writer gives to changes it did not try.
const (
	// reasonUnavailable: the output could not be opened (a secret that is
	// not set or cannot be parsed, a pool that cannot be built).
	reasonUnavailable = "sink_unavailable"
	// reasonDown: the output is down and its next try is not due yet.
	reasonDown = "output_down"
	// reasonGroupBlocked: an earlier change of its group in the batch failed.
	reasonGroupBlocked = "group_blocked"
)

// markEvery is how often a writer process writes the outage record of an
// output that stays down, adding the messages it held since; sweepEvery how
// often, while the output takes changes, it deletes a record another
// process may have left (one that ended before it saw the output back, as
// Lambda reclaims idle instances during a long outage), and then reports
// the outage over.
const (
	markEvery  = 5 * time.Second
	sweepEvery = time.Minute
)

// holdKind says why a message is held back without counting toward the DLQ.
type holdKind int

const (
	notHeld holdKind = iota
	// heldForBackpressure: the output asked to slow down.
	heldForBackpressure
	// heldForOutage: the output is down.
	heldForOutage
	// heldForIntake: the output's intake is paused (readIntake).
	heldForIntake
)

// blame is the one decision between "this change fails" and "this output
// fails". A change that fails on its own (a permanent error, or a
// transient one while the output takes other changes) counts toward the DLQ
// (or the halt) as always. When the output fails — no change of the batch
// was applied and every change tried failed with an output failure
// (outputFailure), or the output could not be opened — no change is to
// blame: every change the batch could not deliver for it is held back
// (holdKind heldForOutage) and tried again after the output's retry wait,
// however long the outage lasts, unless it was queued longer than
// outage.max_hold ago. An output that asks to slow down holds the change it
// answered (heldForBackpressure). blame also keeps the output's state: it
// logs, records and reports an outage when it begins and when it ends,
// drops the output's sink so that the next batch opens it again, and has
// the secrets read again.
func (b *batch) blame(ctx context.Context) {
	active := b.tr.State().Active
	now := b.h.Now.Now()
	st := b.h.outputState(b.route)
	applied, failed, outputFailed := false, 0, 0
	var cause *deliver.Error
	for _, it := range b.items {
		switch {
		case it.done:
			applied = true
		case it.err != nil && (it.tried || it.err.Reason == reasonUnavailable || it.err.Reason == reasonDown):
			failed++
			if outputFailure(it.err) {
				outputFailed++
				if cause == nil || cause.Reason == reasonDown {
					cause = it.err
				}
			}
		}
	}
	down := !applied && failed > 0 && outputFailed == failed
	switch {
	case down:
		b.outputDown(ctx, st, cause, now)
	case applied:
		b.outputUp(ctx, st)
	}
	for _, it := range b.items {
		if it.hold == notHeld && isBackpressure(it.err, active) {
			it.hold = heldForBackpressure
			it.delay = holdFor(max(it.err.RetryAfter, b.tr.Delay(receiveCount(it.rec))))
		}
	}
	// A change that waits behind a held one of its group is held with it,
	// for as long: its own receives do not count toward the DLQ either.
	for _, it := range b.items {
		if it.behind != nil && it.behind.hold != notHeld && it.behind.hold != heldForIntake {
			it.hold, it.delay = it.behind.hold, it.behind.delay
		}
	}
}

// outputFailure says whether a failure is of the kind that stops the output
// as a whole rather than one change: it cannot be reached (connection
// refused or reset, DNS, TLS), refuses our credentials, cannot be opened, is
// shutting down or full (PostgreSQL), or answers 502, 503 or 504 (HTTP) or
// 5xx (S3). Whether it failed for the batch is blame's decision.
func outputFailure(e *deliver.Error) bool {
	if e == nil {
		return false
	}
	if deliver.AuthFailure(e) {
		return true
	}
	switch e.Reason {
	case "connection", reasonUnavailable, reasonDown:
		return true
	case "http_status":
		return e.HTTPStatus == 502 || e.HTTPStatus == 503 || e.HTTPStatus == 504
	case "s3_status":
		return e.HTTPStatus >= 500
	case "sql_error":
		// 08: connection exception; 57P01-57P03: the server is shutting
		// down or not accepting connections yet; 53300: too many
		// connections.
		return strings.HasPrefix(e.SQLState, "08") || e.SQLState == "57P01" || e.SQLState == "57P02" ||
			e.SQLState == "57P03" || e.SQLState == "53300"
	}
	return false
}

// outputDown holds back every message the batch could not deliver because
// the output is down.
func (b *batch) outputDown(ctx context.Context, st *outputState, cause *deliver.Error, now time.Time) {
	o := b.route.Output.Outage
	var wait time.Duration
	if cause.Reason == reasonDown {
		wait = st.untilNext(now)
	} else {
		var first bool
		wait, first = st.failed(now, cause, o.Retry.D(), o.MaxRetry.D())
		if first {
			b.log.ErrorContext(ctx, "output is down; holding its messages", "error", cause.Error(), "retry_in", wait.String())
		} else {
			b.log.WarnContext(ctx, "output still down", "error", cause.Error(), "down_for", now.Sub(st.sinceTime()).Round(time.Second).String(), "retry_in", wait.String())
		}
		// Opened again on the next try, with its secrets read again: a
		// corrected DSN or password takes effect on this warm instance.
		b.h.forgetSink(b.route)
	}
	held := 0
	// One wait for the batch: the changes of a group come back together.
	delay := jitter(wait)
	for _, it := range b.items {
		if it.err == nil || it.done || !(outputFailure(it.err) || it.err.Reason == reasonGroupBlocked) {
			continue
		}
		if o.MaxHold > 0 && it.env != nil && !it.env.EnqueuedAt.IsZero() && now.Sub(it.env.EnqueuedAt) > o.MaxHold.D() {
			continue
		}
		it.hold = heldForOutage
		it.delay = holdFor(max(it.err.RetryAfter, delay))
		held++
	}
	b.rec.Add(metrics.OutputDown, 1, metrics.None)
	b.rec.Add(metrics.MessagesHeld, float64(held), metrics.Count)
	if mark, ok := st.hold(now, held); ok && b.h.Outages != nil {
		mark.Job, mark.Output = b.route.Job.ID, b.route.Output.ID
		if err := b.h.Outages.Mark(ctx, mark); err != nil {
			st.unmark(mark.Held)
			b.log.WarnContext(ctx, "record outage", "error", err)
		}
	}
}

// outputUp ends the output's outage: the one this process saw, or one whose
// record another process left (sweep). Either way OutputDown goes to 0, so
// the alarm clears whichever instance sees the output back; a process that
// finds no record reports nothing.
func (b *batch) outputUp(ctx context.Context, st *outputState) {
	since, held, marked, ok := st.recovered(b.h.Now.Now())
	if !ok {
		b.sweep(ctx, st)
		return
	}
	b.rec.Add(metrics.OutputDown, 0, metrics.None)
	b.log.InfoContext(ctx, "output is up again", "down_for", b.h.Now.Since(since).Round(time.Second).String(), "messages_held", held)
	if marked && b.h.Outages != nil {
		if _, err := b.h.Outages.Clear(ctx, b.route.Job.ID, b.route.Output.ID); err != nil {
			b.log.WarnContext(ctx, "clear outage record", "error", err)
		}
	}
}

// sweep deletes, once per sweepEvery, an outage record another process
// left, and reports that outage over.
func (b *batch) sweep(ctx context.Context, st *outputState) {
	if b.h.Outages == nil || !st.sweepDue(b.h.Now.Now()) {
		return
	}
	cleared, err := b.h.Outages.Clear(ctx, b.route.Job.ID, b.route.Output.ID)
	if err != nil {
		b.log.WarnContext(ctx, "clear outage record", "error", err)
		return
	}
	if cleared {
		b.rec.Add(metrics.OutputDown, 0, metrics.None)
		b.log.InfoContext(ctx, "output is up again; cleared the outage record another writer left")
	}
}

// outputState is what a writer process knows of one output's outage. Safe
// for concurrent use.
type outputState struct {
	mu       sync.Mutex
	since    time.Time // zero: the output is up
	next     time.Time // the output is not tried before
	tries    int       // failed tries since since
	cause    string
	held     int64 // messages held since since
	unmarked int64 // of which not yet added to the record
	markedAt time.Time
	sweptAt  time.Time
}

// sweepDue reports whether the output's record is to be deleted now, the
// output being up: once per sweepEvery.
func (s *outputState) sweepDue(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.sweptAt.IsZero() && now.Sub(s.sweptAt) < sweepEvery {
		return false
	}
	s.sweptAt = now
	return true
}

// outputState returns the outage state of a route, one per process.
func (h *Handler) outputState(r config.Route) *outputState {
	key := outputKey(r.Job.ID, r.Output.ID)
	if s, ok := h.outages.Load(key); ok {
		return s.(*outputState)
	}
	kept, _ := h.outages.LoadOrStore(key, &outputState{})
	return kept.(*outputState)
}

// waiting returns how long the output is still not to be tried, and why;
// zero when it is up or its next try is due.
func (s *outputState) waiting(now time.Time) (time.Duration, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.since.IsZero() || !now.Before(s.next) {
		return 0, ""
	}
	return s.next.Sub(now), s.cause
}

func (s *outputState) untilNext(now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.next.Sub(now), 0)
}

func (s *outputState) sinceTime() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.since
}

// failed records a failed try and returns the wait before the next one:
// first after the first failed try, doubled after each later one, at most
// maxWait. first reports that the outage begins.
func (s *outputState) failed(now time.Time, cause *deliver.Error, firstWait, maxWait time.Duration) (wait time.Duration, first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.since.IsZero() {
		s.since, s.tries, s.held, s.unmarked, s.markedAt, first = now, 0, 0, 0, time.Time{}, true
	}
	s.tries++
	wait = firstWait
	for i := 1; i < s.tries && wait < maxWait; i++ {
		wait *= 2
	}
	wait = min(wait, maxWait)
	s.next, s.cause = now.Add(wait), cause.Error()
	return wait, first
}

// hold counts n messages held at now; when the record is due (first, then
// every markEvery), it returns the mark to write.
func (s *outputState) hold(now time.Time, n int) (outage.State, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held += int64(n)
	s.unmarked += int64(n)
	if !s.markedAt.IsZero() && now.Sub(s.markedAt) < markEvery {
		return outage.State{}, false
	}
	m := outage.State{Since: s.since, LastAt: now, LastError: s.cause, Held: s.unmarked}
	s.markedAt, s.unmarked = now, 0
	return m, true
}

// unmark puts back n messages whose mark failed, for the next one.
func (s *outputState) unmark(n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unmarked += n
}

// recovered ends the outage at now: it returns when it began, the messages held,
// whether a record was written, and ok false when the output was up.
func (s *outputState) recovered(now time.Time) (since time.Time, held int64, marked, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.since.IsZero() {
		return time.Time{}, 0, false, false
	}
	since, held, marked = s.since, s.held, !s.markedAt.IsZero()
	s.since, s.next, s.tries, s.cause, s.held, s.unmarked, s.markedAt = time.Time{}, time.Time{}, 0, "", 0, 0, time.Time{}
	if marked {
		s.sweptAt = now
	}
	return since, held, marked, true
}

// jitter spreads a wait over [d, 1.2 d), so that the writers holding an
// output's messages do not all try it again at once.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration(rand.Float64()*0.2*float64(d))
}

// errDown is the failure of a change not tried because the output is down.
func errDown(wait time.Duration, cause string) *deliver.Error {
	return deliver.TransientError(reasonDown, fmt.Errorf("the output is down (%s); not tried for another %s", cause, wait.Round(time.Millisecond)))
}
