package attach

import (
	"context"
	"encoding/json"
	"time"

	"github.com/changes-worker/changes-worker/shared/feed"
)

// Inner is the feed the stage wraps.
type Inner interface {
	Changes(ctx context.Context, since json.RawMessage, timeout time.Duration) (*feed.Batch, error)
	FetchDocs(ctx context.Context, rows []feed.Row) error
	FetchBatch(ctx context.Context, b *feed.Batch) error
}

// Feed is a feed whose FetchDocs and FetchBatch also copy the attachments of the fetched
// bodies (Stage.Process), so the poller queues documents that reference S3
// objects which already exist. Errors keep feed.Transient's meaning.
type Feed struct {
	Inner
	Stage *Stage
	// OnStats, when set, receives the stats of every batch with
	// attachments, or with a document recorded in the quarantine.
	OnStats func(Stats)
}

// FetchDocs fetches the bodies, then copies their attachments.
func (f *Feed) FetchDocs(ctx context.Context, rows []feed.Row) error {
	if err := f.Inner.FetchDocs(ctx, rows); err != nil {
		return err
	}
	return f.process(ctx, rows)
}

// FetchBatch fetches the bodies within the page's budget (the batch may be
// cut, see feed.Client.FetchBatch), then copies the attachments of the rows
// it kept.
func (f *Feed) FetchBatch(ctx context.Context, b *feed.Batch) error {
	if err := f.Inner.FetchBatch(ctx, b); err != nil {
		return err
	}
	return f.process(ctx, b.Rows)
}

// process copies the attachments of fetched rows.
func (f *Feed) process(ctx context.Context, rows []feed.Row) error {
	st, err := f.Stage.Process(ctx, rows)
	if err != nil {
		return err
	}
	if f.OnStats != nil && (st.Attachments > 0 || st.Quarantined > 0) {
		f.OnStats(st)
	}
	return nil
}
