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
}

// Feed is a feed whose FetchDocs also copies the attachments of the fetched
// bodies (Stage.Process), so the poller queues documents that reference S3
// objects which already exist. Errors keep feed.Transient's meaning.
type Feed struct {
	Inner
	Stage *Stage
	// OnStats, when set, receives the stats of every batch with attachments.
	OnStats func(Stats)
}

// FetchDocs fetches the bodies, then copies their attachments.
func (f *Feed) FetchDocs(ctx context.Context, rows []feed.Row) error {
	if err := f.Inner.FetchDocs(ctx, rows); err != nil {
		return err
	}
	st, err := f.Stage.Process(ctx, rows)
	if err != nil {
		return err
	}
	if f.OnStats != nil && st.Attachments > 0 {
		f.OnStats(st)
	}
	return nil
}
