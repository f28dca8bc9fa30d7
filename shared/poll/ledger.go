package poll

import (
	"encoding/json"
	"time"

	"github.com/changes-worker/changes-worker/shared/feed"
)

// ledger is an invocation's account of its checkpoint: the last checkpoint
// written, the chunks handed to SQS and not yet acknowledged (in feed
// order), and the position up to which SQS acknowledged every change that
// is not yet written.
//
// Its contract: the checkpoint it gives out (take) never passes a change
// that SQS did not acknowledge. A chunk's end counts once that chunk and
// every chunk sent before it were acknowledged (ack), so a chunk in flight,
// or abandoned, holds back every position after it, whatever order the
// acknowledgements come in. A position never goes back where the seq
// format tells (feed.NotBefore). It does no I/O, and is not safe for
// concurrent use: only Run's goroutine uses it.
type ledger struct {
	saved   json.RawMessage // the last checkpoint written, or being written
	savedAt time.Time       // when it was taken (zero: never, as far as known)
	taken   bool            // this ledger took a checkpoint (savedAt is its own)
	queued  *mark           // acknowledged past saved, not yet written; nil when nothing is
	pending []*entry        // the chunks sent, oldest first, until they count
}

// mark is a place in the feed to resume from, with the changes the source
// had pending after it (negative when it does not say).
type mark struct {
	seq  json.RawMessage
	left int64
}

// entry is a chunk handed to SQS: where the feed stands after it.
type entry struct {
	end   mark
	acked bool
}

// newLedger starts from the checkpoint saved, written at savedAt.
func newLedger(saved json.RawMessage, savedAt time.Time) ledger {
	return ledger{saved: saved, savedAt: savedAt}
}

// sent records a chunk handed to SQS that ends at end. It counts towards
// the checkpoint once ack is called with the entry returned, and with every
// entry sent before it.
func (l *ledger) sent(end mark) *entry {
	e := &entry{end: end}
	l.pending = append(l.pending, e)
	return e
}

// ack records that SQS accepted every change of e's chunk, and moves the
// queued position over the chunks acknowledged from the oldest on. It
// reports whether the queued position moved.
func (l *ledger) ack(e *entry) bool {
	e.acked = true
	moved := false
	for len(l.pending) > 0 && l.pending[0].acked {
		end := l.pending[0].end
		l.pending[0] = nil
		l.pending = l.pending[1:]
		if len(end.seq) == 0 {
			continue
		}
		l.queued = &mark{seq: feed.NotBefore(end.seq, l.position()), left: end.left}
		moved = true
	}
	return moved
}

// reached records that the feed moved to m with nothing to queue (its rows
// filtered out or local documents): as a chunk sent and acknowledged at
// once, so it too waits for the chunks before it.
func (l *ledger) reached(m mark) { l.ack(l.sent(m)) }

// abandon forgets the chunks not yet counted: their changes are sent
// again by the next holder, so the checkpoint stays before them.
func (l *ledger) abandon() { l.pending = nil }

// checkpoint is the last checkpoint written, or being written.
func (l *ledger) checkpoint() json.RawMessage { return l.saved }

// position is where the feed has been queued up to: the queued position,
// or the checkpoint when nothing is held back.
func (l *ledger) position() json.RawMessage {
	if l.queued != nil {
		return l.queued.seq
	}
	return l.saved
}

// next is where the next read starts: after the last chunk sent, not
// before position.
func (l *ledger) next() json.RawMessage {
	if n := len(l.pending); n > 0 {
		return feed.NotBefore(l.pending[n-1].end.seq, l.position())
	}
	return l.position()
}

// held reports whether a queued position waits to be written.
func (l *ledger) held() bool { return l.queued != nil }

// recent reports whether this ledger took a checkpoint less than
// checkpointEvery before now. Checkpoints are spaced within one holder's
// invocation only: a new holder's first one is due at once, whenever the
// previous holder wrote its last, so that a takeover shows its progress
// without waiting out the spacing.
func (l *ledger) recent(now time.Time) bool {
	return l.taken && now.Sub(l.savedAt) < checkpointEvery
}

// due reports whether a queued position waits and checkpointEvery has
// passed since the last checkpoint.
func (l *ledger) due(now time.Time) bool { return l.held() && !l.recent(now) }

// dueIn is how long after now a queued position falls due; ok is false
// when none waits.
func (l *ledger) dueIn(now time.Time) (d time.Duration, ok bool) {
	if !l.held() {
		return 0, false
	}
	if !l.taken {
		return 0, true
	}
	return l.savedAt.Add(checkpointEvery).Sub(now), true
}

// age is how long before now the last checkpoint was taken; ok is false
// when that is not known.
func (l *ledger) age(now time.Time) (d time.Duration, ok bool) {
	if l.savedAt.IsZero() {
		return 0, false
	}
	return now.Sub(l.savedAt), true
}

// take returns the queued position as the checkpoint to write, and records
// it as written at now; ok is false when nothing is held back.
func (l *ledger) take(now time.Time) (m mark, ok bool) {
	if l.queued == nil {
		return mark{}, false
	}
	m = *l.queued
	l.saved, l.savedAt, l.queued, l.taken = m.seq, now, nil, true
	return m, true
}
