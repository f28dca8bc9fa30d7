package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

// RepairSource is what a repair reads from the source.
type RepairSource interface {
	// Current reads each document's current state, one row per id in the
	// order of ids: the winner's Rev and Doc, or Deleted (also when never
	// written), or Removed (the Sync Gateway family no longer lets the
	// reader see it). It reads many documents per request.
	Current(ctx context.Context, ids []string) ([]feed.Row, error)
	// Now returns the feed's current position.
	Now(ctx context.Context) (json.RawMessage, error)
}

// Sender queues changes (fanout.Sender). It asks fence before every
// request, retries included, and stops with fence's error.
type Sender interface {
	Send(ctx context.Context, targets []fanout.Target, changes []*change.Envelope, fence fanout.Fence) (fanout.Stats, error)
}

// ErrLeaseBusy is returned when the job's lease stayed held for the whole
// wait and Force was not set.
var ErrLeaseBusy = errors.New("the job's lease stayed held")

// Repairer re-enqueues documents to one output with their current source
// state, at an observation version that outranks whatever the output holds
// and that every later change of the live poller outranks in turn.
//
// Why that holds: sinks order changes by (generation, counter), where the
// generation is the job lease's fencing token. The repair takes the job's
// lease like a poller taking over (Acquire, which increments the
// generation to G+1; it waits for a running poller to hand over at the end
// of its invocation, as a standby does), and while holding it reads each
// document from the source and enqueues it as (G+1, 1), (G+1, 2), ... It
// then releases the lease without moving the checkpoint.
//
//   - It outranks stale output state: everything in the output was sent
//     under generation G or lower, and G+1 is higher.
//   - It never outranks a later change: the next poller takes the lease as
//     generation G+2 and resumes from the unchanged checkpoint, so every
//     change made after the repair's reads (all of them after the
//     checkpoint) is sent again at G+2, which outranks G+1.
//   - It cannot fight a poller: while the repair holds the lease no poller
//     sends anything (a previous holder fences itself before its lease can
//     have expired, exactly as in a failover), so each repaired document is
//     the newest state observed so far, as the observation order requires.
//
// The cost is a pause of the job's poller while the repair runs (one
// handoff), and one extra generation. The alternatives fail: generation G
// with a high counter would outrank the live poller's later changes of the
// same generation; G with a low counter would not outrank stale state of
// generation G; force-taking the lease (Force) fences a running poller at
// once and is allowed only on request, because a poller fenced mid-send
// may still queue a change read after the repair's read, at generation G:
// the repair would outrank it until G+2 sends the change again.
//
// A document that is deleted in the source by the time the repair reads it
// is enqueued as a tombstone; one the Sync Gateway family no longer lets
// the reader see (403), as a removal. With KeepDeleted (KeepRemoved) such
// documents are left alone: the job does not delete them from its outputs.
// Envelopes carry the source's current feed position (Now) as their seq.
type Repairer struct {
	Source RepairSource
	// Leases is the job's lease store; the repair holds the lease through a
	// lease.Session, as a poller does.
	Leases lease.Keeper
	Sender Sender
	Job    *config.Job
	Target fanout.Target
	// Owner and Host name the repair in the job item, like a poller's.
	Owner, Host string
	// Wait bounds how long Repair waits for the lease. Default 3 minutes.
	Wait time.Duration
	// Force takes the lease at once (fencing out a running poller).
	Force bool
	// KeepDeleted: do not enqueue tombstones (ignore_delete, active_only).
	KeepDeleted bool
	// KeepRemoved: do not enqueue removals (ignore_remove).
	KeepRemoved bool
	// Progress, when set, is called after each enqueued batch.
	Progress func(done, total int)
	Log      *slog.Logger
	// Clock decides when the lease could have expired. Zero: the system clock.
	Clock clock.Clock
}

// RepairResult is what a repair enqueued.
type RepairResult struct {
	Generation int64           `json:"generation"`
	Takeover   lease.Takeover  `json:"takeover"`
	Seq        json.RawMessage `json:"seq"`
	Live       int             `json:"live"`
	Tombstones int             `json:"tombstones"`
	Skipped    int             `json:"skipped"` // deleted or removed, left alone (KeepDeleted, KeepRemoved)
}

func (r *Repairer) log() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.New(slog.DiscardHandler)
}

// repairBatch is the number of documents read (in one request to the
// source) and enqueued at once.
const repairBatch = 100

// Repair enqueues the current state of each document in ids (see
// Repairer). Enqueuing is idempotent: running it again only enqueues the
// same states at a newer version. It returns ErrLeaseBusy when a poller
// kept the lease for the whole Wait.
func (r *Repairer) Repair(ctx context.Context, ids []string) (RepairResult, error) {
	var res RepairResult
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	if len(ids) == 0 {
		return res, nil
	}
	sess, err := r.take(ctx)
	if err != nil {
		return res, err
	}
	l := sess.Lease()
	res.Generation, res.Takeover = l.Generation, l.Kind
	log := r.log().With("job", r.Job.ID, "output", r.Target.Output, "generation", l.Generation)
	log.Info("repair lease acquired", "takeover", l.Kind, "previous_owner", l.Previous.Owner)
	defer func() {
		if err := sess.Release(ctx); err != nil {
			log.Warn("release repair lease", "error", err)
		}
	}()
	if res.Seq, err = r.Source.Now(ctx); err != nil {
		return res, fmt.Errorf("read source position: %w", err)
	}
	var counter int64
	done := 0
	for chunk := range slices.Chunk(ids, repairBatch) {
		if err := r.enqueue(ctx, sess, chunk, &counter, &res); err != nil {
			return res, err
		}
		done += len(chunk)
		if r.Progress != nil {
			r.Progress(done, len(ids))
		}
	}
	log.Info("repair enqueued", "live", res.Live, "tombstones", res.Tombstones, "seq", string(res.Seq))
	return res, nil
}

// take acquires the job's lease, waiting for a holder to hand it over, or
// by force.
func (r *Repairer) take(ctx context.Context) (*lease.Session, error) {
	sess := lease.NewSession(r.Leases, r.Job.ID, r.Owner, r.Host, r.Job.Lease.TTL.D())
	sess.Clock = r.Clock
	// Pollers on standby look once a second: look more often, to get the
	// lease at the next handoff.
	sess.Interval = 100 * time.Millisecond
	sess.Log = r.log()
	if r.Force {
		if err := sess.Force(ctx); err != nil {
			return nil, fmt.Errorf("take repair lease: %w", err)
		}
		return r.keepPending(sess), nil
	}
	wait := r.Wait
	if wait <= 0 {
		wait = 3 * time.Minute
	}
	err := sess.Wait(ctx, r.Clock.Now().Add(wait))
	var held *lease.HeldError
	if errors.As(err, &held) {
		return nil, fmt.Errorf("take repair lease of %s: %w for %s by %s (generation %d); retry, wait longer, or use --force",
			r.Job.ID, ErrLeaseBusy, wait, held.Holder.Owner, held.Holder.Generation)
	}
	if err != nil {
		return nil, fmt.Errorf("take repair lease: %w", err)
	}
	return r.keepPending(sess), nil
}

// keepPending makes the session's renewals keep the pending count the
// poller last recorded.
func (r *Repairer) keepPending(sess *lease.Session) *lease.Session {
	sess.Pending = sess.Lease().Previous.Pending
	return sess
}

// enqueue reads the documents of one chunk and enqueues their states under
// the session's lease.
func (r *Repairer) enqueue(ctx context.Context, sess *lease.Session, ids []string, counter *int64, res *RepairResult) error {
	if err := sess.KeepAlive(ctx); err != nil {
		return fmt.Errorf("renew repair lease: %w", err)
	}
	states, err := r.read(ctx, ids)
	if err != nil {
		return err
	}
	changes := r.changes(sess.Lease().Generation, ids, states, counter, res)
	if len(changes) == 0 {
		return nil
	}
	if err := sess.KeepAlive(ctx); err != nil {
		return fmt.Errorf("renew repair lease: %w", err)
	}
	fence := func() error { return sess.Fence(ctx) }
	if _, err := r.Sender.Send(ctx, []fanout.Target{r.Target}, changes, fence); err != nil {
		return fmt.Errorf("enqueue repairs: %w", err)
	}
	return nil
}

// changes turns the states read into changes, numbered only now, after the
// reads, in id order.
func (r *Repairer) changes(generation int64, ids []string, states []docState, counter *int64, res *RepairResult) []*change.Envelope {
	var out []*change.Envelope
	now := r.Clock.Now().UTC()
	for i, id := range ids {
		st := states[i]
		if (st.deleted && r.KeepDeleted) || (st.removed && r.KeepRemoved) {
			res.Skipped++
			continue
		}
		*counter++
		e := &change.Envelope{
			V: change.EnvelopeVersion, Job: r.Job.ID, Output: r.Target.Output, DocID: id, Rev: st.rev,
			Seq: res.Seq, EnqueuedAt: now, Version: change.Version{Generation: generation, Counter: *counter},
		}
		switch {
		case st.removed:
			e.Removed = true
			res.Tombstones++
		case st.deleted:
			e.Deleted = true
			res.Tombstones++
		default:
			e.Doc = st.body
			res.Live++
		}
		out = append(out, e)
	}
	return out
}

// docState is a document as the repair read it.
type docState struct {
	body             json.RawMessage
	rev              string
	deleted, removed bool
}

// read fetches the current state of each id, as few requests as the source
// allows (one per repairBatch documents).
func (r *Repairer) read(ctx context.Context, ids []string) ([]docState, error) {
	rows, err := r.Source.Current(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("read source documents: %w", err)
	}
	if len(rows) != len(ids) {
		return nil, fmt.Errorf("read source documents: %d answers for %d documents", len(rows), len(ids))
	}
	out := make([]docState, len(rows))
	for i, row := range rows {
		if row.ID != ids[i] {
			return nil, fmt.Errorf("read source documents: answer %d is for %q, not %q", i, row.ID, ids[i])
		}
		out[i] = docState{body: row.Doc, rev: row.Rev, deleted: row.Deleted, removed: row.Removed}
	}
	return out, nil
}
