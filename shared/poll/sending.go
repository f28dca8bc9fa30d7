package poll

import (
	"context"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/metrics"
)

// DefaultSendDepth is how many chunks a poller catching up has in flight
// when Poller.SendDepth is zero: one, so that a failover replays at most
// one batch. With more, while one chunk waits for SQS the next is encoded
// and sent. The requests of all of them count against the one
// send_concurrency (fanout.Sender.Concurrency), so a poller that lost its
// lease has no more requests landing late than with one.
const DefaultSendDepth = config.DefaultSendDepth

// sending is a chunk being queued in the background.
type sending struct {
	b          *feed.Batch
	start, end int                 // the chunk is b.Rows[start:end]
	entry      *entry              // its end in the ledger, once started
	docs       map[string]struct{} // its documents, when chunks in flight must not share one
	n          int                 // changes sent
	began      time.Time
	done       chan struct{} // closed when sent, bytes and err are set
	sent       int           // messages queued
	bytes      int
	err        error
}

// newSending is the chunk b.Rows[start:end], not started.
func (v *invocation) newSending(b *feed.Batch, start, end int) *sending {
	s := &sending{b: b, start: start, end: end, done: make(chan struct{})}
	if v.fifo && v.depth > 1 {
		s.docs = make(map[string]struct{}, end-start)
		for _, r := range b.Rows[start:end] {
			s.docs[r.ID] = struct{}{}
		}
	}
	return s
}

// makeRoom records the chunks in flight, oldest first, until s may start:
// fewer than depth chunks in flight, none of them failed and, on a
// per-document FIFO output, none with a document of s. Those already done
// are recorded first. A non-nil error ends the invocation (see
// completeOldest).
func (v *invocation) makeRoom(ctx context.Context, s *sending) error {
	for len(v.sends) > 0 && (len(v.sends) >= v.depth || closed(v.sends[0].done) || v.failed() || v.shares(s)) {
		if err := v.completeOldest(ctx); err != nil {
			return err
		}
	}
	return nil
}

// startSend starts queueing the chunk s in the background, and records the
// chunks already done, in order. A non-nil error ends the invocation.
func (v *invocation) startSend(ctx context.Context, s *sending) error {
	s.began = v.now()
	changes := v.envelopes(s.b.Rows[s.start:s.end])
	s.n = len(changes)
	if len(changes) == 0 {
		close(s.done)
	} else {
		if err := v.keepAlive(ctx); err != nil {
			return err
		}
		// Fences run while Run's goroutine waits (see invocation.mu).
		fence := func() error {
			v.mu.Lock()
			defer v.mu.Unlock()
			return v.fence(ctx)
		}
		sctx := v.sendCtx
		go func() {
			defer close(s.done)
			st, err := v.p.Sender.Send(sctx, v.targets, changes, fence)
			s.sent, s.bytes, s.err = st.Messages, st.Bytes, err
		}()
	}
	v.sends = append(v.sends, s)
	s.entry = v.ledger.sent(endOf(s.b, s.end))
	for len(v.sends) > 0 && closed(v.sends[0].done) {
		if err := v.completeOldest(ctx); err != nil {
			return err
		}
	}
	return nil
}

// failed reports whether a chunk in flight has failed: the chunks before
// it are waited for and recorded, and the invocation ends on it.
func (v *invocation) failed() bool {
	for _, s := range v.sends {
		if closed(s.done) && s.err != nil {
			return true
		}
	}
	return false
}

// shares reports whether a chunk in flight has a document of s.
func (v *invocation) shares(s *sending) bool {
	if s.docs == nil {
		return false
	}
	for _, o := range v.sends {
		for id := range s.docs {
			if _, ok := o.docs[id]; ok {
				return true
			}
		}
	}
	return false
}

// completeOldest waits for the oldest chunk in flight and records it as
// queued (which may write the checkpoint). After a failure, the chunks
// after it are abandoned, and the invocation ends as after a failed send,
// the checkpoint before the failed chunk, with sendFailed's error.
func (v *invocation) completeOldest(ctx context.Context) error {
	s := v.sends[0]
	v.unlocked(func() { <-s.done })
	v.sends = v.sends[1:]
	if s.err != nil {
		v.abandonSends()
		return v.sendFailed(ctx, s.err)
	}
	if s.n > 0 {
		v.res.Enqueued += s.n
		v.p.count(metrics.DocumentsEnqueued, float64(s.sent))
		v.p.count(metrics.BytesEnqueued, float64(s.bytes))
		v.p.Metrics.Add(metrics.BatchSize, float64(s.n), metrics.Count)
	}
	if err := v.queued(ctx, s); err != nil {
		v.abandonSends()
		return err
	}
	v.slowest = max(v.slowest, v.now().Sub(s.began))
	return nil
}

// drain waits for every chunk in flight and records them, in order.
func (v *invocation) drain(ctx context.Context) error {
	for len(v.sends) > 0 {
		if err := v.completeOldest(ctx); err != nil {
			return err
		}
	}
	return nil
}

// abandonSends cancels the chunks in flight and waits for them without
// recording them: the checkpoint stays before them, and the next holder
// sends them again. The invocation ends after it: no chunk starts again.
func (v *invocation) abandonSends() {
	v.ledger.abandon()
	if len(v.sends) == 0 {
		return
	}
	v.cancelSends()
	for _, s := range v.sends {
		v.unlocked(func() { <-s.done })
	}
	v.sends = nil
}

// endOf is where the feed stands after b.Rows[:end]: the last row's seq,
// or the batch's last_seq after its final row, with what the source has
// pending after it.
func endOf(b *feed.Batch, end int) mark {
	seq := b.Rows[end-1].Seq
	if end == len(b.Rows) {
		seq = nextSince(b)
	}
	left := b.Pending
	if left >= 0 {
		left += int64(len(b.Rows) - end)
	}
	return mark{seq: seq, left: left}
}

// unlocked runs f, a wait, with the invocation unlocked, so that the
// fences of the chunks in flight can run meanwhile.
func (v *invocation) unlocked(f func()) {
	v.mu.Unlock()
	defer v.mu.Lock()
	f()
}

// closed reports whether c is closed, without waiting.
func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
