// Package poll runs one poller invocation for one job: take the job's lease
// (or stand by until it can), then read bounded _changes batches, fetch bodies,
// filter, queue every change to every output, and checkpoint only after SQS
// accepted every entry, until the invocation's time budget is spent.
package poll

import (
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/metrics"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

// Feed reads the source.
type Feed interface {
	Changes(ctx context.Context, since json.RawMessage, timeout time.Duration) (*feed.Batch, error)
	FetchBatch(ctx context.Context, b *feed.Batch) error
}

// Leases keeps the job's lease and checkpoint (*lease.Store): what the
// invocation's lease.Session needs, the checkpoint write, and the standby
// mark.
type Leases interface {
	lease.Keeper
	Checkpoint(ctx context.Context, l *lease.Lease, seq json.RawMessage, pending int64) error
	MarkStandby(ctx context.Context, job, owner string) error
}

// notes is what a Leases may also record for operators (*lease.Store
// does): the largest batch and the last source auth failure. Best effort.
type notes interface {
	NoteLargestBatch(ctx context.Context, job string, n int64) error
	NoteSourceAuthFailure(ctx context.Context, job string, at time.Time) error
}

// Sender queues changes. It must call fence before every request, retries
// included, and stop with fence's error.
type Sender interface {
	Send(ctx context.Context, targets []fanout.Target, changes []*change.Envelope, fence fanout.Fence) (fanout.Stats, error)
}

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
	// OpenStream, when set, makes the invocation stream once caught up
	// (feed.mode other than longpoll); see streaming. Nil: pages only.
	OpenStream OpenStream
	Log        *slog.Logger
	Metrics    *metrics.Recorder
	// Clock is the time of the poller's budget and lease decisions; fault
	// tests skew it. Zero: the system clock.
	Clock clock.Clock

	// largest is the largest batch this process has recorded in the job
	// item, so an invocation writes it only when it read more.
	largest atomic.Int64

	// StandbyInterval is how often a standby reads the job item. Default 1s.
	StandbyInterval time.Duration
	// HeartbeatInterval is how often, in real time, the holder looks
	// whether its lease is due for renewal while it waits on the source
	// (see invocation.heartbeat). Default a tenth of the lease TTL.
	HeartbeatInterval time.Duration
	// ChunkRows is how many feed rows are queued at a time (one Send); the
	// checkpoint can move after each chunk, so a slow output or the end of
	// the budget costs at most one chunk. Default DefaultChunkRows.
	ChunkRows int
	// ChunkBytes ends a chunk early once its bodies reach this many bytes.
	// Default DefaultChunkBytes.
	ChunkBytes int
	// SendDepth is how many chunks are in flight at once while the feed
	// is read ahead (catching up); 1 whenever an output orders the whole
	// feed. At 1 (the default), a batch never holds more than a page's
	// rows, so a failover replays at most one batch; above 1, pages that
	// have arrived are merged up to ChunkRows and ChunkBytes.
	SendDepth int
	// OnBatch, when set, is called after every poll with whether the job is
	// caught up (the last read returned nothing new); the local runtime's
	// --until-idle uses it.
	OnBatch func(caughtUp bool)
	// OnFailover, when set, is called as the invocation takes the lease
	// over from a holder that did not release it (lease.Failover), before
	// it reads, and must return at once: the invocation that stood by is
	// now the holder, so the Lambda function starts another to stand by
	// beside it (pipeline), in the background.
	OnFailover func(ctx context.Context)
}

// Invocation identifies one run.
type Invocation struct {
	Owner    string // unique per invocation, e.g. the Lambda request id
	Host     string
	Deadline time.Time
}

// Result summarises one invocation.
type Result struct {
	Role       string // "active", "standby", "fenced", or "duplicate" (another invocation runs for the same event)
	Generation int64
	Takeover   lease.Takeover
	Read       int
	Enqueued   int
	Checkpoint json.RawMessage
	CaughtUp   bool
}

// DefaultChunkRows is how many feed rows are queued at a time when
// Poller.ChunkRows is zero: a default page (500 rows) is one chunk, so its
// requests (50 per output) run together at the sender's concurrency.
const DefaultChunkRows = 1000

// DefaultChunkBytes is the body size at which a chunk ends early: a chunk's
// bodies are held encoded while it is queued (once, and once more per
// output), beside the page read ahead, so large documents make smaller
// chunks and the poller's memory stays within a small function's.
const DefaultChunkBytes = 4 << 20

// noteTimeout bounds the note of the largest batch written as an
// invocation ends.
const noteTimeout = 5 * time.Second

// checkpointEvery spaces the checkpoint writes within a batch.
const checkpointEvery = time.Second

// budgetMargin is kept free before the deadline for what an invocation
// does as it ends (see lease.TailContext): queue what its last look
// brought, checkpoint, release the lease. A tenth of the invocation, 1.5 s
// to 5 s: at least a second for those writes besides lease.TailReserve.
func budgetMargin(total time.Duration) time.Duration {
	return min(max(total/10, 1500*time.Millisecond), 5*time.Second)
}

// Run runs one invocation until the budget (deadline minus a margin) is spent,
// the lease is lost, or the source fails permanently. The checkpoint never
// moves past a change that SQS did not accept.
func (p *Poller) Run(ctx context.Context, in Invocation) (Result, error) {
	v := p.invocation(ctx, in)
	// What an invocation that ends on errors counted (PollerErrors,
	// MalformedPages) is written too, not left for a later batch.
	defer v.flush(ctx)
	if err := v.acquire(ctx); err != nil || v.lease == nil {
		if v.duplicate != "" {
			return Result{Role: "duplicate"}, err
		}
		return Result{Role: "standby"}, err
	}
	v.start(ctx)
	return v.finish(ctx, v.loop(ctx))
}

// invocation prepares the state of one run; ctx is the run's, for the
// records the standby's watch logs.
func (p *Poller) invocation(ctx context.Context, in Invocation) *invocation {
	now := p.Clock.Now()
	v := &invocation{
		p:         p,
		owner:     in.Owner,
		started:   now,
		changedAt: now,
		end:       in.Deadline.Add(-budgetMargin(in.Deadline.Sub(now))),
		log:       p.Log.With("job", p.Job.ID, "owner", in.Owner),
	}
	s := lease.NewSession(p.Leases, p.Job.ID, in.Owner, in.Host, p.Job.Lease.TTL.D())
	s.Clock = p.Clock
	// The holder releases the lease as its budget ends (see lastLook):
	// announced, a standby takes over then.
	s.ReleaseAt = v.end
	if p.StandbyInterval > 0 {
		s.Interval = p.StandbyInterval
	}
	s.Announce = v.announce
	s.Watching = func(holder *lease.State) { v.standingBy(ctx, holder) }
	s.Renewed = func() { p.count(metrics.LeaseRenewed, 1) }
	// The release must fit in the margin left before the deadline.
	s.ReleaseTimeout = 2 * time.Second
	s.Log = v.log
	v.sess = s
	return v
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
