package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/changes-worker/changes-worker/shared/clock"
)

// Keeper is the part of the store a Session calls.
type Keeper interface {
	Get(ctx context.Context, job string) (*State, error)
	Acquire(ctx context.Context, job, owner, host string, ttl time.Duration) (*Lease, *State, error)
	ForceTake(ctx context.Context, job, owner, host string, ttl time.Duration) (*Lease, error)
	Renew(ctx context.Context, l *Lease, pending int64) error
	Release(ctx context.Context, l *Lease) error
}

var _ Keeper = (*Store)(nil)

// announcer is a Keeper that records, with the takeover, when the holder
// will release the lease (*Store does).
type announcer interface {
	AcquireUntil(ctx context.Context, job, owner, host string, ttl time.Duration, releaseAt time.Time) (*Lease, *State, error)
}

var _ announcer = (*Store)(nil)

// A holder that announced when it will release its lease (State.ReleaseAt)
// is looked at every handoffLook from that moment, for handoffWatch, so that
// the standby takes over within tens of milliseconds of the release rather
// than at its next regular look: about two reads more per handoff, as the
// release follows the announced moment by a write or two. A holder that
// does not release within handoffWatch (it has a batch to queue, or it
// crashed) is looked at every Interval again, until its lease expires.
const (
	handoffLook  = 20 * time.Millisecond
	handoffWatch = time.Second
)

// TailReserve is what the writes an invocation makes as it ends leave free
// before its deadline (TailContext): the time to return its result.
const TailReserve = 500 * time.Millisecond

// TailContext is the context of a write made as an invocation ends (its last
// checkpoint, the release of its lease, a note): the write outlives a
// cancelled ctx for up to d, as what it records should be recorded, but
// never runs past ctx's deadline less TailReserve. A function still writing
// at its timeout is stopped and counted as failed, and an asynchronous event
// is then delivered again; an unwritten checkpoint only replays changes, and
// an unreleased lease expires.
func TailContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	deadline, ok := ctx.Deadline()
	if !ok {
		return tctx, cancel
	}
	dctx, dcancel := context.WithDeadline(tctx, deadline.Add(-TailReserve))
	return dctx, func() { dcancel(); cancel() }
}

// ErrFenced is returned by Session.Fence when the lease could have expired
// by the local clock and renewing it failed; the error wraps the renewal's
// (ErrLeaseLost when the renewal was refused).
var ErrFenced = errors.New("lease may have expired: not sending")

// errNoLease is returned by the methods that need a held lease when the
// session holds none.
var errNoLease = errors.New("no lease held")

// HeldError is ErrLeaseHeld with the holder's state, as last read.
type HeldError struct {
	Holder *State
}

func (e *HeldError) Error() string {
	if e.Holder == nil {
		return ErrLeaseHeld.Error()
	}
	return fmt.Sprintf("%s (%s, generation %d)", ErrLeaseHeld, e.Holder.Owner, e.Holder.Generation)
}

// Unwrap makes errors.Is(err, ErrLeaseHeld) hold.
func (e *HeldError) Unwrap() error { return ErrLeaseHeld }

// Session holds one job's lease for one owner, the one way every process
// that acts on a job (the poller, and the operator tools that must keep it
// still) takes, keeps and gives up the lease:
//
//   - take it at once when it is free (Acquire), by force (Force), or stand
//     by until its holder releases it or lets it expire (Wait);
//   - keep it alive: renew it every third of the TTL (KeepAlive);
//   - fence every action under it (Fence): never act when the lease could
//     have expired by the local clock plus a safety margin, renew first or
//     stop;
//   - release it (Release), so that the next holder takes over at once.
//
// Every write is conditioned on the lease's owner and generation (the
// fencing token). A refused write comes back as ErrLeaseLost: another
// holder took over, and the session's owner must stop at once.
//
// A Session holds at most one lease and is not safe for concurrent use.
type Session struct {
	store            Keeper
	job, owner, host string
	ttl              time.Duration

	// Clock decides when the lease could have expired. Zero: the system clock.
	Clock clock.Clock
	// Interval is how often Wait reads the job item while the lease is held.
	Interval time.Duration
	// ReleaseAt, when set, is when the session's owner will release the
	// lease it takes: Acquire writes it on the job item (when the store
	// can), and a standby's Wait looks for the release from then on.
	ReleaseAt time.Time
	// Announce, when set, is called by Wait every third of a TTL to record
	// on the job item that this owner stands by (Store.MarkStandby).
	Announce func(ctx context.Context, job, owner string) error
	// Watching, when set, is called on every round of Wait with the
	// holder's state as last read.
	Watching func(holder *State)
	// Renewed, when set, is called after every renewal.
	Renewed func()
	// Pending is written with every renewal: the changes the source still
	// has to send, or -1 when unknown.
	Pending int64
	// ReleaseTimeout bounds Release.
	ReleaseTimeout time.Duration
	// Log receives the read errors Wait rides out. Default: discarded.
	Log *slog.Logger

	lease     *Lease
	announced time.Time // when Announce last ran
}

// NewSession returns a session of owner (unique per process or invocation,
// running on host) for job's lease with the given TTL. Defaults: Interval
// one second, Pending unknown, ReleaseTimeout five seconds.
func NewSession(store Keeper, job, owner, host string, ttl time.Duration) *Session {
	return &Session{
		store: store, job: job, owner: owner, host: host, ttl: ttl,
		Interval: time.Second, Pending: -1, ReleaseTimeout: 5 * time.Second,
	}
}

// Lease returns the held lease, or nil.
func (s *Session) Lease() *Lease { return s.lease }

// Acquire takes the lease if it is free: no holder, released, or expired.
// When another owner holds it, it returns a *HeldError.
func (s *Session) Acquire(ctx context.Context) error {
	var l *Lease
	var st *State
	var err error
	if a, ok := s.store.(announcer); ok && !s.ReleaseAt.IsZero() {
		l, st, err = a.AcquireUntil(ctx, s.job, s.owner, s.host, s.ttl, s.ReleaseAt)
	} else {
		l, st, err = s.store.Acquire(ctx, s.job, s.owner, s.host, s.ttl)
	}
	if errors.Is(err, ErrLeaseHeld) {
		return &HeldError{Holder: st}
	}
	if err != nil {
		return err
	}
	s.lease = l
	return nil
}

// Force takes the lease whatever its state. The generation is incremented,
// so a running holder is fenced out at its next write.
func (s *Session) Force(ctx context.Context) error {
	l, err := s.store.ForceTake(ctx, s.job, s.owner, s.host, s.ttl)
	if err != nil {
		return err
	}
	s.lease = l
	return nil
}

// Wait takes the lease, standing by while another owner holds it: it reads
// the job item every Interval and tries again as soon as the lease was
// released or expired by the session's clock. It gives up when the next
// look would come at or after until, with a *HeldError, and when ctx ends,
// with ctx.Err(). Failed reads are logged and the watch goes on; any other
// failure to acquire is returned.
func (s *Session) Wait(ctx context.Context, until time.Time) error {
	for {
		err := s.Acquire(ctx)
		var held *HeldError
		if !errors.As(err, &held) {
			return err
		}
		if err := s.watch(ctx, held.Holder, until); err != nil {
			return err
		}
	}
}

// watch reads the job item until the lease looks free (nil), until is
// reached (*HeldError) or ctx ends.
func (s *Session) watch(ctx context.Context, holder *State, until time.Time) error {
	for {
		if s.Watching != nil && holder != nil {
			s.Watching(holder)
		}
		s.announce(ctx)
		wait := s.nextLook(holder)
		if !s.Clock.Now().Add(wait).Before(until) {
			return &HeldError{Holder: holder}
		}
		if err := clock.Sleep(ctx, wait); err != nil {
			return err
		}
		st, err := s.store.Get(ctx, s.job)
		if err != nil {
			s.log().Warn("standby read", "error", err)
			continue
		}
		holder = st
		// A look that came back at or past until leaves the lease to
		// the next invocation: a holder taking it now would have no
		// time to read before its release.
		if now := s.Clock.Now(); !now.Before(until) {
			return &HeldError{Holder: holder}
		}
		if !st.Held(s.Clock.Now()) {
			return nil
		}
	}
}

// nextLook is how long the watch waits before it reads the job item again:
// Interval, or less when the holder's lease, as last read, expires sooner,
// so that a crashed holder is replaced as its lease expires rather than up
// to an Interval later; and, when the holder announced when it will
// release the lease, until that moment, then handoffLook for handoffWatch.
func (s *Session) nextLook(holder *State) time.Duration {
	now := s.Clock.Now()
	if holder == nil || !holder.Held(now) {
		return s.Interval
	}
	wait := min(s.Interval, holder.ExpiresAt.Sub(now))
	if at := holder.ReleaseAt; !at.IsZero() {
		switch {
		case now.Before(at):
			wait = min(wait, at.Sub(now))
		case now.Before(at.Add(handoffWatch)):
			wait = min(wait, handoffLook)
		}
	}
	return max(wait, time.Millisecond)
}

// announce records that this owner stands by, every third of a TTL.
func (s *Session) announce(ctx context.Context) {
	if s.Announce == nil || s.Clock.Since(s.announced) < s.ttl/3 {
		return
	}
	if err := s.Announce(ctx, s.job, s.owner); err != nil {
		s.log().Warn("mark standby", "error", err)
	}
	s.announced = s.Clock.Now()
}

// KeepAlive renews the lease when a third of the TTL has passed since its
// last successful write (the heartbeat). It returns ErrLeaseLost when the
// renewal is refused.
func (s *Session) KeepAlive(ctx context.Context) error {
	if s.lease == nil {
		return fmt.Errorf("renew lease %s: %w", s.job, errNoLease)
	}
	if s.Clock.Since(s.lease.RenewedAt) < s.ttl/3 {
		return nil
	}
	return s.Renew(ctx)
}

// Renew extends the lease now. It returns ErrLeaseLost when refused.
func (s *Session) Renew(ctx context.Context) error {
	if s.lease == nil {
		return fmt.Errorf("renew lease %s: %w", s.job, errNoLease)
	}
	if err := s.store.Renew(ctx, s.lease, s.Pending); err != nil {
		return err
	}
	if s.Renewed != nil {
		s.Renewed()
	}
	return nil
}

// Fence is asked before every action under the lease (every SQS request,
// retries included). When less than half the TTL remains by the session's
// clock (the margin covers clock skew between hosts and the time the action
// itself takes), it renews the lease first, and returns ErrFenced when it
// cannot. Renewing in place, rather than failing, lets an action that takes
// longer than half a TTL complete instead of being started over.
func (s *Session) Fence(ctx context.Context) error {
	if s.lease == nil {
		return fmt.Errorf("%w: %w", ErrFenced, errNoLease)
	}
	if s.lease.Remaining(s.Clock.Now()) >= s.ttl/2 {
		return nil
	}
	if err := s.Renew(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrFenced, err)
	}
	return nil
}

// Release ends the lease so the next holder takes over without waiting for
// it to expire. It runs on a context of its own (TailContext), bounded by
// ReleaseTimeout and ctx's deadline, because the caller's may be done. It
// returns ErrLeaseLost when the lease was already taken. The session holds
// nothing afterwards.
func (s *Session) Release(ctx context.Context) error {
	if s.lease == nil {
		return nil
	}
	rctx, cancel := TailContext(ctx, s.ReleaseTimeout)
	defer cancel()
	err := s.store.Release(rctx, s.lease)
	s.lease = nil
	return err
}

func (s *Session) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.New(slog.DiscardHandler)
}
