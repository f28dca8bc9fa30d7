package poll

import (
	"context"
	"encoding/json"
	"time"

	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/metrics"
)

// Stream is an open streaming feed (*feed.Stream). Next waits up to wait for
// a change, then returns every change already received (up to the feed
// limit) as a batch whose LastSeq is a safe place to resume; an empty batch
// means nothing arrived. Once the stream ends, Next returns an error and the
// stream is of no further use. Close is idempotent. Neither is safe for
// concurrent use.
type Stream interface {
	Next(ctx context.Context, wait time.Duration) (*feed.Batch, error)
	Close() error
}

// OpenStream opens the job's streaming feed from since, exactly as stored in
// the checkpoint.
type OpenStream func(ctx context.Context, since json.RawMessage) (Stream, error)

// maxStreamBackoff bounds the wait before a dropped stream is opened again.
const maxStreamBackoff = 30 * time.Second

// streaming is an invocation's streaming state (Poller.OpenStream set): it
// catches up with pages, and once a page leaves nothing more to read it opens
// one stream from the checkpoint and takes its batches instead of pages.
// Batches from a stream go through the page path (screen, fetch, queue,
// checkpoint) unchanged. A stream that fails is closed and the invocation
// goes back to pages from the checkpoint, so no change read from the stream
// but not queued is skipped; the stream is opened again after a backoff
// that grows while streams keep failing.
type streaming struct {
	open     Stream
	from     json.RawMessage // the position the open stream started at
	caughtUp bool            // the last page left nothing more to read
	backoff  time.Duration
	reopenAt time.Time
}

// streams reports whether the next batch comes from a stream.
func (v *invocation) streams() bool {
	if v.p.OpenStream == nil {
		return false
	}
	return v.str.open != nil || (v.str.caughtUp && !v.now().Before(v.str.reopenAt))
}

// readStream returns the stream's next batch with its bodies, opening the
// stream from the checkpoint first if none is open. On any error the
// stream is closed.
func (v *invocation) readStream(ctx context.Context) (*feed.Batch, error) {
	if v.str.open == nil {
		s, err := v.p.OpenStream(ctx, v.ledger.position())
		if err != nil {
			return nil, err
		}
		v.str.open, v.str.from = s, v.ledger.position()
		v.log.InfoContext(ctx, "stream opened", "mode", v.p.Job.Feed.Mode, "from", string(v.str.from))
	}
	b, err := v.str.open.Next(ctx, v.waitTimeout())
	if err == nil && len(b.Rows) > 0 {
		err = v.p.Feed.FetchBatch(ctx, b)
	}
	if err != nil {
		v.closeStream(ctx)
		return nil, err
	}
	if len(b.Rows) > 0 {
		v.str.backoff = 0
	}
	return b, nil
}

// streamFailed handles a failed stream (already closed): a transient
// failure sends the invocation back to pages from the checkpoint at once,
// the stream to be opened again after a backoff; anything else is a source
// failure. A non-nil error stops the invocation.
func (v *invocation) streamFailed(ctx context.Context, err error) error {
	if ctx.Err() != nil || !feed.Transient(err) {
		return v.sourceFailed(ctx, err)
	}
	v.p.count(metrics.PollerErrors, 1)
	v.str.caughtUp = false
	v.str.backoff = min(max(2*v.str.backoff, time.Second), maxStreamBackoff)
	v.str.reopenAt = v.now().Add(v.str.backoff)
	v.log.WarnContext(ctx, "stream ended; catching up with pages", "error", err, "reopen_in", v.str.backoff.String(), "checkpoint", string(v.ledger.checkpoint()))
	return nil
}

// paged records where a page read from the checkpoint left the feed: once a
// page leaves nothing more to read, the next batch comes from a stream.
func (v *invocation) paged(b *feed.Batch) {
	v.str.caughtUp = v.held == nil && !v.more(b)
}

// cutStream closes the stream when the batch taken from it was cut
// (Batch.Cut): by its byte budget (FetchBatch) or before a row held back
// (screen). The stream has moved past the rows after the cut, so they are
// read again from where the batch ends, with pages.
func (v *invocation) cutStream(ctx context.Context, b *feed.Batch) {
	if v.str.open != nil && b.Cut != "" {
		v.closeStream(ctx)
		v.str.caughtUp = false
	}
}

// closeStream closes the open stream, if any.
func (v *invocation) closeStream(ctx context.Context) {
	if v.str.open == nil {
		return
	}
	_ = v.str.open.Close()
	v.str.open = nil
	v.log.InfoContext(ctx, "stream closed", "opened_at", string(v.str.from), "checkpoint", string(v.ledger.checkpoint()))
}
