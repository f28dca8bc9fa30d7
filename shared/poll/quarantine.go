package poll

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/metrics"
	"github.com/changes-worker/changes-worker/shared/statetable/quarantine"
)

// Quarantine records what the poller cannot deliver (*quarantine.Store).
type Quarantine interface {
	Record(ctx context.Context, e quarantine.Entry) error
}

// errHeld reports a feed row the poller is holding back (not skipping yet):
// the batch was cut before it, and it is read again after a backoff.
var errHeld = errors.New("feed row held back")

// misreads counts, within one invocation, how often each malformed row and
// each unreadable page was met, by quarantine key.
type misreads map[string]int

// screen decides on a batch's rows that name no document
// (feed.Batch.Malformed), in order. Such a row is lost to the outputs
// whatever happens (it names no document to fetch), so it must not stall
// the job, but one a proxy garbled once must not be skipped either: the
// batch is cut before it and it is read again, after a backoff, until it was
// read the same way Job.Feed.QuarantineAfter times; then it is recorded in
// the job's quarantine (MalformedRows counts it) and the batch goes past it.
// A row whose record cannot be written is held back, never skipped
// unrecorded. It returns an error wrapping errHeld when it cut the batch.
func (p *Poller) screen(ctx context.Context, since json.RawMessage, b *feed.Batch, seen misreads, log *slog.Logger) error {
	for _, m := range b.Malformed {
		e := quarantine.Entry{Job: p.Job.ID, Kind: quarantine.Row, Seq: m.Seq, After: m.After, Reason: m.Reason, Raw: m.Raw}
		k := e.Key()
		seen[k]++
		n := seen[k]
		if n >= p.quarantineAfter() {
			e.Attempts = 1
			if n == p.quarantineAfter() {
				e.Attempts = int64(n)
			}
			err := p.record(ctx, e)
			if err == nil {
				if n == p.quarantineAfter() {
					p.count(metrics.MalformedRows, 1)
				}
				log.Error("feed row names no document; recorded in quarantine and skipped",
					"quarantine_key", k, "reason", m.Reason, "seq", string(m.Seq), "after", string(m.After), "attempts", n)
				continue
			}
			log.Warn("record quarantined row; holding it back", "error", err, "quarantine_key", k)
		}
		b.CutBefore(m.Before, since, "a row that names no document: "+m.Reason)
		return fmt.Errorf("%w: row after %s: %s (read %d of %d times before it is quarantined)",
			errHeld, position(m.After), m.Reason, n, p.quarantineAfter())
	}
	return nil
}

// pageFailed records a page the poller cannot read as sent: a malformed
// answer with nothing whole in it, or an answer over a limit. The poller
// never moves past such a page, because nothing says where it ends: it
// keeps reading it (the next attempt may get it whole) and, from the
// QuarantineAfter-th failure in an invocation (the first for a limit, which
// the same request always meets again), records it in the job's quarantine
// as blocked at since and counts MalformedPages, so that status and an
// alarm show it. Other failures (unavailable source, refused credentials)
// are not about the page and are left to PollerErrors.
func (p *Poller) pageFailed(ctx context.Context, since json.RawMessage, err error, seen misreads, log *slog.Logger) {
	var le *feed.LimitError
	limit := errors.As(err, &le)
	if !limit && !errors.Is(err, feed.ErrMalformed) {
		return
	}
	e := quarantine.Entry{Job: p.Job.ID, Kind: quarantine.Page, Seq: since, Reason: err.Error()}
	k := e.Key()
	seen[k]++
	n := seen[k]
	switch {
	case limit:
		e.Attempts = 1
	case n < p.quarantineAfter():
		return
	case n == p.quarantineAfter():
		e.Attempts = int64(n)
	default:
		e.Attempts = 1
	}
	p.count(metrics.MalformedPages, 1)
	log.Error("page cannot be read; blocked here, retrying", "quarantine_key", k, "error", err, "attempts", n)
	if rerr := p.record(ctx, e); rerr != nil {
		log.Warn("record blocked page", "error", rerr, "quarantine_key", k)
	}
}

func (p *Poller) record(ctx context.Context, e quarantine.Entry) error {
	if p.Quarantine == nil {
		return errors.New("no quarantine store")
	}
	return p.Quarantine.Record(ctx, e)
}

func (p *Poller) quarantineAfter() int {
	if n := p.Job.Feed.QuarantineAfter; n > 0 {
		return n
	}
	return 3
}

// position is a seq for a message.
func position(seq json.RawMessage) string {
	if len(seq) == 0 {
		return "the beginning"
	}
	return string(seq)
}
