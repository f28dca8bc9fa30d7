package poll_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/metrics"
	"github.com/changes-worker/changes-worker/shared/poll"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

// ttl is the test job's lease TTL.
const ttl = 9 * time.Second

// world is what the fakes share: a clock the fakes move, and the order in
// which things happened ("send d001-d010", "checkpoint 100", "renew",
// "release", ...).
type world struct {
	*clock.Manual
	mu     sync.Mutex
	events []string
}

func newWorld() *world {
	return &world{Manual: clock.NewManual(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))}
}

func (w *world) record(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events = append(w.events, fmt.Sprintf(format, args...))
}

// log returns the events so far.
func (w *world) log() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.events...)
}

// fakeLeases is the job item in memory, with the real store's conditions:
// writes are refused (ErrLeaseLost) unless they come from the current owner
// and generation. Func fields, when set, inject failures.
type fakeLeases struct {
	w *world

	mu           sync.Mutex
	owner        string
	generation   int64
	expires      time.Time
	released     bool
	checkpoint   json.RawMessage
	checkpointAt time.Time
	replayEpoch  int64
	releaseAt    time.Time // as the holder announced it (AcquireUntil)
	// freeAfterReads releases the other owner's lease at this read (Get).
	freeAfterReads int
	// perRead moves the clock on every read (Get).
	perRead time.Duration
	// renewing keeps the other owner's lease alive: every read (Get) sees
	// it renewed.
	renewing bool
	reads    int
	marks    int
	// standby and standbyAt are the last standby mark: who, and when.
	standby   string
	standbyAt time.Time

	// checkpointErr, when set, answers a checkpoint write of seq instead
	// of the store.
	checkpointErr func(seq string) error
}

var _ poll.Leases = (*fakeLeases)(nil)

func (f *fakeLeases) state() *lease.State {
	return &lease.State{Exists: f.owner != "", Owner: f.owner, Generation: f.generation, ExpiresAt: f.expires,
		Released: f.released, Checkpoint: f.checkpoint, CheckpointAt: f.checkpointAt, HeartbeatAt: f.expires.Add(-ttl),
		ReplayEpoch: f.replayEpoch, Standby: f.standby, StandbySeenAt: f.standbyAt, ReleaseAt: f.releaseAt}
}

// holdBy makes owner the holder, as if it had just renewed.
func (f *fakeLeases) holdBy(owner string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.owner, f.generation, f.expires, f.released = owner, f.generation+1, f.w.Now().Add(ttl), false
}

func (f *fakeLeases) Get(context.Context, string) (*lease.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	f.w.Advance(f.perRead)
	if f.renewing {
		f.expires = f.w.Now().Add(ttl)
	}
	if f.freeAfterReads > 0 && f.reads >= f.freeAfterReads {
		f.released = true
	}
	return f.state(), nil
}

func (f *fakeLeases) Acquire(ctx context.Context, job, owner, host string, ttl time.Duration) (*lease.Lease, *lease.State, error) {
	return f.AcquireUntil(ctx, job, owner, host, ttl, time.Time{})
}

// AcquireUntil is Acquire recording when the holder will release the lease,
// as the store does.
func (f *fakeLeases) AcquireUntil(_ context.Context, job, owner, _ string, ttl time.Duration, releaseAt time.Time) (*lease.Lease, *lease.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.w.Now()
	if f.state().Held(now) {
		return nil, f.state(), lease.ErrLeaseHeld
	}
	prev := *f.state()
	kind := lease.First
	switch {
	case prev.Exists && prev.Released:
		kind = lease.Handoff
	case prev.Exists:
		kind = lease.Failover
	}
	f.owner, f.generation, f.expires, f.released, f.releaseAt = owner, f.generation+1, now.Add(ttl), false, releaseAt
	f.w.record("acquire %d", f.generation)
	return &lease.Lease{JobID: job, Owner: owner, Generation: f.generation, Kind: kind, Checkpoint: f.checkpoint,
		RenewedAt: now, TTL: ttl, Previous: prev}, nil, nil
}

func (f *fakeLeases) ForceTake(context.Context, string, string, string, time.Duration) (*lease.Lease, error) {
	return nil, fmt.Errorf("force take: not expected of a poller")
}

// write applies a conditional write of l.
func (f *fakeLeases) write(l *lease.Lease, what string) error {
	if f.owner != l.Owner || f.generation != l.Generation {
		f.w.record("refused %s", what)
		return lease.ErrLeaseLost
	}
	now := f.w.Now()
	f.expires = now.Add(l.TTL)
	l.RenewedAt = now
	f.w.record("%s", what)
	return nil
}

func (f *fakeLeases) Checkpoint(_ context.Context, l *lease.Lease, seq json.RawMessage, _ int64) error {
	if f.checkpointErr != nil {
		if err := f.checkpointErr(string(seq)); err != nil {
			f.w.record("failed checkpoint %s", seq)
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.write(l, "checkpoint "+string(seq)); err != nil {
		return err
	}
	f.checkpoint, f.checkpointAt = seq, f.w.Now()
	l.Checkpoint = seq
	return nil
}

func (f *fakeLeases) Renew(_ context.Context, l *lease.Lease, _ int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.write(l, "renew")
}

func (f *fakeLeases) Release(_ context.Context, l *lease.Lease) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.owner != l.Owner || f.generation != l.Generation {
		return lease.ErrLeaseLost
	}
	f.released, f.expires = true, f.w.Now()
	f.w.record("release")
	return nil
}

func (f *fakeLeases) MarkStandby(_ context.Context, _, owner string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.marks++
	f.standby, f.standbyAt = owner, f.w.Now()
	return nil
}

// looks is how many times a standby read the job item (the holder never
// does).
func (f *fakeLeases) looks() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// takeOver makes another poller take the lease: every later write of the
// current holder is refused.
func (f *fakeLeases) takeOver() {
	f.holdBy("zombie-hunter")
	f.w.record("taken over")
}

// stored returns the checkpoint in the item.
func (f *fakeLeases) stored() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return string(f.checkpoint)
}

// expiresIn is how long the stored lease has left by the world's clock.
func (f *fakeLeases) expiresIn() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.expires.Sub(f.w.Now())
}

// fakeFeed answers reads with batch(call, since); each read moves the
// clock by perRead.
type fakeFeed struct {
	w       *world
	perRead time.Duration
	batch   func(call int, since string) (*feed.Batch, error)
	// fetch, when set, answers FetchBatch.
	fetch func(ctx context.Context, b *feed.Batch) error

	mu     sync.Mutex
	sinces []string
	at     []time.Time // real time of each read
}

func (f *fakeFeed) Changes(_ context.Context, since json.RawMessage, _ time.Duration) (*feed.Batch, error) {
	f.mu.Lock()
	f.sinces = append(f.sinces, string(since))
	f.at = append(f.at, time.Now())
	call := len(f.sinces)
	f.mu.Unlock()
	f.w.Advance(f.perRead)
	f.w.record("read %s", since)
	return f.batch(call, string(since))
}

// FetchBatch answers with fetch(b) when set.
func (f *fakeFeed) FetchBatch(ctx context.Context, b *feed.Batch) error {
	if f.fetch == nil {
		return nil
	}
	if err := f.fetch(ctx, b); err != nil {
		f.w.record("failed fetch %s-%s", b.Rows[0].ID, b.Rows[len(b.Rows)-1].ID)
		return err
	}
	return nil
}

// fakeStreams opens streams whose Next answers next(stream, call): stream
// counts the streams opened (from 1), call the Next calls on that stream
// (from 1). A nil batch and nil error is a wait in which nothing arrived:
// the clock moves by the wait and the batch is empty.
type fakeStreams struct {
	w    *world
	next func(stream, call int) (*feed.Batch, error)
	// openErr, when set, answers every open.
	openErr error

	mu     sync.Mutex
	opened []string // the since of each stream opened
}

func (f *fakeStreams) open(_ context.Context, since json.RawMessage) (poll.Stream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opened = append(f.opened, string(since))
	n := len(f.opened)
	if f.openErr != nil {
		f.w.record("stream %d refused", n)
		return nil, f.openErr
	}
	f.w.record("stream %d from %s", n, since)
	return &fakeStream{f: f, n: n, pos: since}, nil
}

// froms returns the since of each stream opened.
func (f *fakeStreams) froms() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.opened...)
}

type fakeStream struct {
	f      *fakeStreams
	n      int
	calls  int
	pos    json.RawMessage
	closed bool
}

func (s *fakeStream) Next(_ context.Context, wait time.Duration) (*feed.Batch, error) {
	if s.closed {
		return nil, fmt.Errorf("stream %d: next after close", s.n)
	}
	s.calls++
	b, err := s.f.next(s.n, s.calls)
	switch {
	case err != nil:
		s.f.w.record("stream %d failed", s.n)
		return nil, err
	case b == nil:
		s.f.w.Advance(wait)
		return &feed.Batch{Rows: []feed.Row{}, LastSeq: s.pos, Pending: -1}, nil
	}
	s.pos = b.LastSeq
	return b, nil
}

func (s *fakeStream) Close() error {
	if !s.closed {
		s.closed = true
		s.f.w.record("stream %d closed", s.n)
	}
	return nil
}

// streamed is a batch of rows from..to as a stream hands it out.
func streamed(from, to int) *feed.Batch {
	return &feed.Batch{Rows: rows(from, to), LastSeq: json.RawMessage(strconv.Itoa(to)), Pending: -1}
}

// batches answers a stream's calls with the batches in order (a nil batch:
// nothing arrived) and with nothing once they are spent, whatever the
// stream.
func batches(bs ...*feed.Batch) func(stream, call int) (*feed.Batch, error) {
	return func(_, call int) (*feed.Batch, error) {
		if call > len(bs) {
			return nil, nil
		}
		return bs[call-1], nil
	}
}

// fakeSender sends groups of ten changes per target, one "request" each,
// asking the fence first, as fanout.Sender does. Before request n (counted
// over the whole test) it calls before(n), which can fail the request or
// change the world. Each request moves the clock by perRequest.
type fakeSender struct {
	w          *world
	leases     *fakeLeases
	perRequest time.Duration
	before     func(n int) error
	// beforeDoc, when set, runs after before with the request's first
	// document.
	beforeDoc func(first string) error

	mu       sync.Mutex
	requests int
	sends    []int    // the changes of every Send, in the order called
	epochs   []int64  // the targets' replay epoch of every Send
	sent     []string // doc ids
	// unsafe lists requests made while the stored lease had less than
	// half its TTL left by the clock.
	unsafe []string
}

func (s *fakeSender) Send(_ context.Context, targets []fanout.Target, changes []*change.Envelope, fence fanout.Fence) (fanout.Stats, error) {
	var st fanout.Stats
	s.mu.Lock()
	s.sends = append(s.sends, len(changes))
	for _, t := range targets {
		s.epochs = append(s.epochs, t.Epoch)
	}
	s.mu.Unlock()
	for range targets {
		for start := 0; start < len(changes); start += 10 {
			group := changes[start:min(start+10, len(changes))]
			if err := fence(); err != nil {
				return st, err
			}
			s.mu.Lock()
			s.requests++
			n := s.requests
			if left := s.leases.expiresIn(); left < ttl/2 {
				s.unsafe = append(s.unsafe, fmt.Sprintf("request %d with %s left", n, left))
			}
			s.mu.Unlock()
			if s.before != nil {
				if err := s.before(n); err != nil {
					return st, err
				}
			}
			if s.beforeDoc != nil {
				if err := s.beforeDoc(group[0].DocID); err != nil {
					return st, err
				}
			}
			s.mu.Lock()
			for _, c := range group {
				s.sent = append(s.sent, c.DocID)
			}
			s.mu.Unlock()
			s.w.record("send %s-%s", group[0].DocID, group[len(group)-1].DocID)
			s.w.Advance(s.perRequest)
			st.Messages += len(group)
		}
	}
	return st, nil
}

func (s *fakeSender) docs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.sent...)
}

// rows returns feed rows from..to (inclusive), seq i and id dNNN.
func rows(from, to int) []feed.Row {
	var out []feed.Row
	for i := from; i <= to; i++ {
		out = append(out, feed.Row{Seq: json.RawMessage(strconv.Itoa(i)), ID: fmt.Sprintf("d%03d", i), Rev: "1-a",
			Doc: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
	}
	return out
}

// batchOf is a batch of rows from..to with last_seq to and nothing pending.
func batchOf(from, to int) *feed.Batch {
	return &feed.Batch{Rows: rows(from, to), LastSeq: json.RawMessage(strconv.Itoa(to)), Pending: 0}
}

// empty is a batch with nothing new after seq.
func empty(seq string) *feed.Batch {
	return &feed.Batch{LastSeq: json.RawMessage(seq), Pending: 0}
}

// docIDs returns dNNN for from..to.
func docIDs(from, to int) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, fmt.Sprintf("d%03d", i))
	}
	return out
}

// rig is a poller on fakes.
type rig struct {
	w       *world
	leases  *fakeLeases
	feed    *fakeFeed
	sender  *fakeSender
	streams *fakeStreams
	poller  *poll.Poller
	logs    *bytes.Buffer
}

func newRig(batch func(call int, since string) (*feed.Batch, error)) *rig {
	w := newWorld()
	r := &rig{w: w, leases: &fakeLeases{w: w}, logs: &bytes.Buffer{}}
	r.feed = &fakeFeed{w: w, perRead: 10 * time.Millisecond, batch: batch}
	r.sender = &fakeSender{w: w, leases: r.leases}
	job := &config.Job{ID: "orders", Lease: config.Lease{TTL: config.Duration(ttl)}, Feed: config.Feed{Limit: 100, Timeout: config.Duration(time.Second)}}
	r.poller = &poll.Poller{
		Job: job, Feed: r.feed, Leases: r.leases, Sender: r.sender,
		Targets: []fanout.Target{{Output: "pg", QueueURL: "queue"}},
		Log:     slog.New(slog.NewTextHandler(r.logs, nil)),
		Metrics: metrics.New(io.Discard, map[string]string{"Job": "orders"}),
		Clock:   w.Now, StandbyInterval: 5 * time.Millisecond, ChunkRows: 100, SendDepth: 1,
	}
	return r
}

// run runs one invocation with a deadline d after the world's now.
func (r *rig) run(t *testing.T, d time.Duration) (poll.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	return r.poller.Run(ctx, poll.Invocation{Owner: "me", Host: "host", Deadline: r.w.Now().Add(d)})
}

// after returns the events after the first one with the prefix.
func after(events []string, prefix string) []string {
	for i, e := range events {
		if strings.HasPrefix(e, prefix) {
			return events[i+1:]
		}
	}
	return nil
}

// matching returns the events with the prefix.
func matching(events []string, prefix string) []string {
	var out []string
	for _, e := range events {
		if strings.HasPrefix(e, prefix) {
			out = append(out, e)
		}
	}
	return out
}
