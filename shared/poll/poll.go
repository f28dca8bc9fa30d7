// Package poll runs one poller invocation for one job: take the job's lease
// (or stand by until it can), then read bounded _changes batches, fetch bodies,
// filter, queue every change to every output, and checkpoint only after SQS
// accepted every entry, until the invocation's time budget is spent.
package poll

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/lease"
	"github.com/changes-worker/changes-worker/shared/metrics"
)

// Feed reads the source.
type Feed interface {
	Changes(ctx context.Context, since json.RawMessage, timeout time.Duration) (*feed.Batch, error)
	FetchBatch(ctx context.Context, b *feed.Batch) error
}

// Leases keeps the job's lease and checkpoint.
type Leases interface {
	Get(ctx context.Context, job string) (*lease.State, error)
	Acquire(ctx context.Context, job, owner, host string, ttl time.Duration) (*lease.Lease, *lease.State, error)
	Checkpoint(ctx context.Context, l *lease.Lease, seq json.RawMessage, pending int64) error
	Renew(ctx context.Context, l *lease.Lease, pending int64) error
	Release(ctx context.Context, l *lease.Lease) error
	MarkStandby(ctx context.Context, job, owner string) error
}

// Sender queues changes.
type Sender interface {
	Send(ctx context.Context, targets []fanout.Target, changes []*change.Envelope, fence fanout.Fence) (fanout.Stats, error)
}

// ErrFenced is returned by the fence when the lease could have expired by now
// and renewing it failed; the error wraps the renewal's.
var ErrFenced = errors.New("lease may have expired: not sending")

// Poller runs invocations of one job. Its fields are set once; Run may be
// called concurrently by several invocations, each with its own owner id.
type Poller struct {
	Job     *config.Job
	Feed    Feed
	Leases  Leases
	Sender  Sender
	Targets []fanout.Target
	// Quarantine records the feed rows the poller skips and the pages it
	// is blocked on (see screen and pageFailed).
	Quarantine Quarantine
	Log        *slog.Logger
	Metrics    *metrics.Recorder
	Now        func() time.Time

	// StandbyInterval is how often a standby reads the job item. Default 1s.
	StandbyInterval time.Duration
	// OnBatch, when set, is called after every poll with whether the job is
	// caught up (the last read returned nothing new); the local runtime's
	// --until-idle uses it.
	OnBatch func(caughtUp bool)
}

// Invocation identifies one run.
type Invocation struct {
	Owner    string // unique per invocation, e.g. the Lambda request id
	Host     string
	Deadline time.Time
}

// Result summarises one invocation.
type Result struct {
	Role       string // "active", "standby" or "fenced"
	Generation int64
	Takeover   lease.Takeover
	Read       int
	Enqueued   int
	Checkpoint json.RawMessage
	CaughtUp   bool
}

func (p *Poller) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// chunkRows is how many feed rows are queued at a time; the checkpoint can
// move after each chunk.
const chunkRows = 100

// budgetMargin is kept free before the deadline to release the lease.
func budgetMargin(total time.Duration) time.Duration {
	m := total / 10
	if m < time.Second {
		m = time.Second
	}
	if m > 5*time.Second {
		m = 5 * time.Second
	}
	return m
}

// Run runs one invocation until the budget (deadline minus a margin) is spent,
// the lease is lost, or the source fails permanently. The checkpoint never
// moves past a change that SQS did not accept.
func (p *Poller) Run(ctx context.Context, inv Invocation) (Result, error) {
	end := inv.Deadline.Add(-budgetMargin(inv.Deadline.Sub(p.now())))
	log := p.Log.With("job", p.Job.ID, "owner", inv.Owner)
	// What an invocation that ends on errors counted (PollerErrors,
	// MalformedPages) is written too, not left for a later batch.
	defer func() {
		if err := p.Metrics.Flush(); err != nil {
			log.Warn("flush metrics", "error", err)
		}
	}()

	l, err := p.acquire(ctx, inv, end, log)
	if err != nil || l == nil {
		return Result{Role: "standby"}, err
	}
	res := Result{Role: "active", Generation: l.Generation, Takeover: l.Kind, Checkpoint: l.Checkpoint}
	log = log.With("generation", l.Generation)
	log.Info("lease acquired", "takeover", l.Kind, "previous_owner", l.Previous.Owner, "checkpoint", string(l.Checkpoint))
	p.count(metrics.LeaseAcquired, 1)
	switch l.Kind {
	case lease.Failover:
		p.count(metrics.Failovers, 1)
	case lease.Handoff:
		p.count(metrics.Handoffs, 1)
	}
	p.Metrics.AddHighRes(metrics.Role, 1, metrics.None)

	err = p.active(ctx, l, end, &res, log)
	if errors.Is(err, lease.ErrLeaseLost) {
		log.Warn("lease lost; stopping", "error", err)
		p.count(metrics.LeaseLost, 1)
		res.Role = "fenced"
		return res, nil
	}
	// Release with a context of its own: the invocation's may be done.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if rerr := p.Leases.Release(rctx, l); rerr != nil {
		log.Warn("release lease", "error", rerr)
	} else {
		log.Info("lease released", "checkpoint", string(res.Checkpoint))
	}
	return res, err
}

// acquire takes the lease, or stands by watching the job item until the lease
// is released or expires, or the budget ends (then it returns nil, nil).
func (p *Poller) acquire(ctx context.Context, inv Invocation, end time.Time, log *slog.Logger) (*lease.Lease, error) {
	interval := p.StandbyInterval
	if interval == 0 {
		interval = time.Second
	}
	ttl := p.Job.Lease.TTL.D()
	announced := false
	for {
		l, st, err := p.Leases.Acquire(ctx, p.Job.ID, inv.Owner, inv.Host, ttl)
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, lease.ErrLeaseHeld) {
			p.count(metrics.PollerErrors, 1)
			return nil, err
		}
		if !announced {
			log.Info("standing by", "holder", st.Owner, "generation", st.Generation)
			announced = true
		}
		// Watch the item until it looks free, then try again. Every third
		// of a TTL, record on the item that a standby is waiting.
		var marked time.Time
		for {
			if p.now().Sub(marked) >= ttl/3 {
				if err := p.Leases.MarkStandby(ctx, p.Job.ID, inv.Owner); err != nil {
					log.Warn("mark standby", "error", err)
				}
				marked = p.now()
			}
			p.Metrics.AddHighRes(metrics.Role, 0, metrics.None)
			if st != nil && st.Exists && !st.HeartbeatAt.IsZero() {
				p.Metrics.AddHighRes(metrics.HeartbeatAgeSeconds, p.now().Sub(st.HeartbeatAt).Seconds(), metrics.Seconds)
			}
			if !p.now().Add(interval).Before(end) {
				return nil, nil
			}
			if err := sleep(ctx, interval); err != nil {
				return nil, nil
			}
			st, err = p.Leases.Get(ctx, p.Job.ID)
			if err != nil {
				log.Warn("standby read", "error", err)
				continue
			}
			if !st.Held(p.now()) {
				break
			}
		}
	}
}

func (p *Poller) active(ctx context.Context, l *lease.Lease, end time.Time, res *Result, log *slog.Logger) error {
	ttl := p.Job.Lease.TTL.D()
	since := l.Checkpoint
	pending := int64(-1)
	backoff := time.Duration(0)
	var counter int64 // observation order within this generation
	checkpointAt := l.Previous.CheckpointAt
	caughtUpAt := p.now()
	var lastErr error         // the source's last failure, reported if the budget ends on it
	var slowest time.Duration // the longest chunk so far, to plan the budget
	seen := misreads{}        // malformed rows and pages met, to quarantine

	// keepAlive renews the lease when a third of the TTL has passed since the
	// last successful write (the heartbeat).
	keepAlive := func() error {
		if p.now().Sub(l.RenewedAt) < ttl/3 {
			return nil
		}
		if err := p.Leases.Renew(ctx, l, pending); err != nil {
			return err
		}
		p.count(metrics.LeaseRenewed, 1)
		return nil
	}
	// fence runs before every SQS request. When less than half the TTL
	// remains by our clock (the margin covers clock skew between instances
	// and the request itself), it renews the lease first, and refuses to send
	// if it cannot. Renewing in place, rather than failing the chunk and
	// starting it over, lets a chunk that takes longer than TTL/2 to queue
	// (slow SQS) complete instead of being sent again and again.
	fence := func() error {
		if l.Remaining(p.now()) >= ttl/2 {
			return nil
		}
		if err := p.Leases.Renew(ctx, l, pending); err != nil {
			return fmt.Errorf("%w: %w", ErrFenced, err)
		}
		p.count(metrics.LeaseRenewed, 1)
		return nil
	}

	// Checkpoints. The write that ends a batch is left in flight while the
	// next batch is read: reads have no side effects, so only the order of
	// writes matters, and every other lease write and every send waits for
	// it first (settle). Within a batch, a chunk is checkpointed only when a
	// second has passed since the last checkpoint, so a failover replays at
	// most about a second of sends or one batch.
	var inflight chan error
	var unsaved json.RawMessage // queued but not yet checkpointed
	var unsavedLeft int64
	settle := func() error {
		if inflight == nil {
			return nil
		}
		err := <-inflight
		inflight = nil
		return err
	}
	defer func() { _ = settle() }()
	checkpoint := func(seq json.RawMessage, left int64, async bool) error {
		if err := settle(); err != nil {
			return err
		}
		checkpointAt, since, res.Checkpoint, unsaved = p.now(), seq, seq, nil
		if !async {
			if err := p.Leases.Checkpoint(ctx, l, seq, left); err != nil {
				return err
			}
			p.count(metrics.Checkpoints, 1)
			return nil
		}
		ch := make(chan error, 1)
		inflight = ch
		// The write outlives a cancelled invocation context: what was
		// queued should be recorded, and the lease condition still guards it.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl/2)
		go func() {
			defer cancel()
			err := p.Leases.Checkpoint(cctx, l, seq, left)
			if err == nil {
				p.count(metrics.Checkpoints, 1)
			}
			ch <- err
		}()
		return nil
	}
	// saveQueued checkpoints what was queued but not yet recorded, before the
	// invocation stops.
	saveQueued := func() error {
		if unsaved == nil {
			return nil
		}
		return checkpoint(unsaved, unsavedLeft, false)
	}

	for {
		p.Metrics.AddHighRes(metrics.Role, 1, metrics.None)
		if inflight == nil {
			if err := keepAlive(); err != nil {
				return err
			}
		}
		// Start another batch only if the slowest one so far would still fit.
		remaining := end.Sub(p.now())
		if remaining < 500*time.Millisecond+slowest {
			return lastErr
		}
		// Long-poll no longer than the heartbeat interval (minus the time the
		// client allows a source past its timeout), so renewals keep their
		// pace, and never past the budget.
		timeout := min(p.Job.Feed.Timeout.D(), ttl/3-feed.DefaultSlack, remaining-feed.DefaultSlack)
		if timeout < 250*time.Millisecond {
			timeout = 250 * time.Millisecond
		}
		batch, err := p.Feed.Changes(ctx, since, timeout)
		var held error // a malformed row the batch was cut before
		if err == nil {
			err = p.screen(ctx, since, batch, seen, log)
			if errors.Is(err, errHeld) {
				held, err = err, nil
			}
		}
		if err == nil && len(batch.Rows) > 0 {
			err = p.Feed.FetchBatch(ctx, batch)
		}
		if serr := settle(); serr != nil {
			return serr
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			p.count(metrics.PollerErrors, 1)
			p.pageFailed(ctx, since, err, seen, log)
			if !feed.Transient(err) {
				log.Error("source failed; checkpoint unchanged", "error", err, "checkpoint", string(since))
				return err
			}
			lastErr = err
			backoff = nextBackoff(backoff)
			log.Warn("source unavailable; retrying", "error", err, "backoff", backoff.String(), "checkpoint", string(since))
			if p.now().Add(backoff).After(end) {
				return err
			}
			if err := sleep(ctx, backoff); err != nil {
				return nil
			}
			continue
		}
		backoff, lastErr = 0, nil
		if batch.Cut != "" {
			log.Info("page cut short", "reason", batch.Cut, "rows", len(batch.Rows), "checkpoint", string(since))
		}
		pending = batch.Pending
		p.count(metrics.ChangesRead, float64(len(batch.Rows)))
		res.Read += len(batch.Rows)
		if batch.Pending >= 0 {
			p.Metrics.Add(metrics.PendingChanges, float64(batch.Pending), metrics.Count)
		}

		// Queue the batch in chunks of rows: every row's seq is a valid place
		// to resume, so a slow output or the end of the budget costs at most
		// one chunk, never the whole batch.
		for start := 0; start < len(batch.Rows); start += chunkRows {
			stop := min(start+chunkRows, len(batch.Rows))
			rows := batch.Rows[start:stop]
			if start > 0 && end.Sub(p.now()) < 500*time.Millisecond+slowest {
				return saveQueued()
			}
			chunkStart := p.now()
			changes := p.envelopes(l, rows, &counter)
			if len(changes) > 0 {
				if err := keepAlive(); err != nil {
					return err
				}
				st, err := p.Sender.Send(ctx, p.Targets, changes, fence)
				if err != nil {
					if errors.Is(err, lease.ErrLeaseLost) {
						return err // refused by the fence's renewal
					}
					if ctx.Err() != nil {
						// Out of time mid-chunk: the next holder sends it again.
						log.Warn("deadline reached while queueing", "checkpoint", string(since))
						return saveQueued()
					}
					p.count(metrics.PollerErrors, 1)
					log.Error("queue changes; checkpoint stays before them", "error", err, "checkpoint", string(since))
					if serr := saveQueued(); serr != nil {
						return serr
					}
					return fmt.Errorf("queue changes: %w", err)
				}
				res.Enqueued += len(changes)
				p.count(metrics.DocumentsEnqueued, float64(st.Messages))
				p.count(metrics.BytesEnqueued, float64(st.Bytes))
				p.Metrics.Add(metrics.BatchSize, float64(len(changes)), metrics.Count)
			}
			seq := rows[len(rows)-1].Seq
			last := stop == len(batch.Rows)
			if last && len(batch.LastSeq) > 0 {
				seq = batch.LastSeq
			}
			// The checkpoint never goes back where the seq format tells.
			seq = feed.NotBefore(seq, since)
			left := batch.Pending
			if left >= 0 {
				left += int64(len(batch.Rows) - stop)
			}
			if len(seq) > 0 {
				unsaved, unsavedLeft = seq, left
				switch {
				case last:
					if err := checkpoint(seq, left, true); err != nil {
						return err
					}
				case p.now().Sub(checkpointAt) >= time.Second:
					if err := checkpoint(seq, left, false); err != nil {
						return err
					}
				}
			}
			slowest = max(slowest, p.now().Sub(chunkStart))
		}
		if len(batch.Rows) == 0 && len(batch.LastSeq) > 0 && string(batch.LastSeq) != string(since) {
			// Nothing to queue, but the feed moved (filtered or local docs).
			if err := checkpoint(batch.LastSeq, batch.Pending, true); err != nil {
				return err
			}
		}
		caughtUp := batch.CaughtUp()
		res.CaughtUp = caughtUp
		if p.OnBatch != nil {
			p.OnBatch(caughtUp)
		}
		if caughtUp {
			caughtUpAt = p.now()
		}
		// Lag: how long since the poller last saw the end of the feed.
		p.Metrics.Add(metrics.LagSeconds, p.now().Sub(caughtUpAt).Seconds(), metrics.Seconds)
		if !checkpointAt.IsZero() {
			p.Metrics.Add(metrics.CheckpointAgeSeconds, p.now().Sub(checkpointAt).Seconds(), metrics.Seconds)
		}
		if err := p.Metrics.Flush(); err != nil {
			log.Warn("flush metrics", "error", err)
		}
		if held != nil {
			// Read the held-back row again after a backoff.
			p.count(metrics.PollerErrors, 1)
			lastErr = held
			backoff = nextBackoff(backoff)
			log.Warn("malformed feed row; reading it again", "error", held, "backoff", backoff.String(), "checkpoint", string(since))
			if p.now().Add(backoff).After(end) {
				return saveQueued()
			}
			if err := sleep(ctx, backoff); err != nil {
				return saveQueued()
			}
		}
	}
}

// envelopes turns feed rows into changes, applying the job's filters and
// numbering them in observation order.
func (p *Poller) envelopes(l *lease.Lease, rows []feed.Row, counter *int64) []*change.Envelope {
	now := p.now().UTC()
	out := make([]*change.Envelope, 0, len(rows))
	for _, r := range rows {
		if r.Deleted && p.Job.Processing.IgnoreDelete {
			continue
		}
		if r.Removed && p.Job.Processing.IgnoreRemove {
			continue
		}
		*counter++
		e := &change.Envelope{
			V: change.EnvelopeVersion, Job: p.Job.ID, DocID: r.ID, Rev: r.Rev, Seq: r.Seq,
			Deleted: r.Deleted, Removed: r.Removed, EnqueuedAt: now,
			Version: change.Version{Generation: l.Generation, Counter: *counter},
		}
		if !e.Tombstone() {
			e.Doc = r.Doc
		}
		out = append(out, e)
	}
	return out
}

func (p *Poller) count(name string, v float64) { p.Metrics.Add(name, v, metrics.Count) }

func nextBackoff(d time.Duration) time.Duration {
	if d == 0 {
		d = 250 * time.Millisecond
	} else {
		d *= 2
	}
	if d > 5*time.Second {
		d = 5 * time.Second
	}
	// Full jitter on the upper half so pollers of many jobs don't align.
	return d/2 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
