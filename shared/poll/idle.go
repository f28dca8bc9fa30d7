package poll

import (
	"context"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/metrics"
)

// An invocation of a job with idle sleep (config.IdleSleep) ends once the
// feed has been idle for the job's IdleStay, counted from its start, and
// leaves the rest to the next schedule tick. Everything else is as with
// idle watch: the lease, the fence before every request, the checkpoint
// after what SQS accepted, the release as it ends, a standby beside a busy
// invocation. A busy feed never ends an invocation early.

// rests reports whether the invocation ends after batch because the feed is
// idle: the job sleeps while idle, the batch brought nothing new and left
// the source with nothing pending, nothing is in flight or held back, no
// change came for a whole long poll (a read cut short for a checkpoint due
// comes back empty under a trickle too), and the invocation has read the
// feed for the job's idle stay. Once the budget has no room for another
// batch (fits), the invocation ends with it, at the moment it announced
// (see lastLook), not earlier.
func (v *invocation) rests(b *feed.Batch) bool {
	now := v.now()
	if len(b.Rows) > 0 {
		v.changedAt = now
	}
	return v.p.Job.Idle == config.IdleSleep && v.fits() && len(b.Rows) == 0 && b.CaughtUp() &&
		v.held == nil && len(v.sends) == 0 && v.ahead == nil &&
		now.Sub(v.changedAt) >= v.readTimeout() && !now.Before(v.started.Add(v.p.Job.IdleStay()))
}

// untilStay bounds a wait of w so that it ends as the idle stay does: an
// idle feed then ends the invocation with its stay rather than up to a long
// poll after it.
func (v *invocation) untilStay(w time.Duration) time.Duration {
	if v.p.Job.Idle != config.IdleSleep {
		return w
	}
	if left := v.started.Add(v.p.Job.IdleStay()).Sub(v.now()); left > 0 {
		return min(w, max(left, 10*time.Millisecond))
	}
	return w
}

// quiet reports whether the invocation publishes only that it holds the
// lease: the job sleeps while idle and the invocation has read nothing.
// Each metric is billed for every month it receives data, so an idle job
// that sleeps keeps one (Role, which its lease-holder alarm needs) beside
// the counts of what went wrong, which only failures produce.
func (v *invocation) quiet() bool {
	return v.p.Job.Idle == config.IdleSleep && v.res.Read == 0
}

// routine are the metrics every invocation records while it reads an idle
// feed; a quiet invocation drops them before it flushes. In a process that
// runs several invocations at once (changesctl run), what a busy one
// recorded since its last batch's flush goes too.
var routine = []string{
	metrics.ChangesRead, metrics.LargestBatch, metrics.PendingChanges, metrics.LagSeconds,
	metrics.CheckpointAgeSeconds, metrics.LeaseAcquired, metrics.LeaseRenewed, metrics.Handoffs,
	metrics.SourceRequests, metrics.SourceRequestTime,
}

// flush writes the metrics recorded, without the routine ones when the
// invocation is quiet.
func (v *invocation) flush(ctx context.Context) {
	if v.quiet() {
		v.p.Metrics.Discard(routine...)
	}
	if err := v.p.Metrics.Flush(); err != nil {
		v.log.WarnContext(ctx, "flush metrics", "error", err)
	}
}
