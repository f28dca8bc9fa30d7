package pipeline

import (
	"context"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/docid"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/poll"
)

// scrubbedFeed is a poller's feed whose body-fetching errors (which may
// name a document: a failed fetch, an attachment that could not be copied)
// show the batch's document ids as ids says (stack.doc_ids).
type scrubbedFeed struct {
	poll.Feed
	ids docid.Exposure
}

func (f scrubbedFeed) FetchBatch(ctx context.Context, b *feed.Batch) error {
	err := f.Feed.FetchBatch(ctx, b)
	if err == nil {
		return nil
	}
	ids := make([]string, len(b.Rows))
	for i := range b.Rows {
		ids[i] = b.Rows[i].ID
	}
	return f.ids.ScrubError(err, ids...)
}

// scrubbedSender is a poller's sender whose errors show the changes'
// document ids as ids says.
type scrubbedSender struct {
	poll.Sender
	ids docid.Exposure
}

func (s scrubbedSender) Send(ctx context.Context, targets []fanout.Target, changes []*change.Envelope, fence fanout.Fence) (fanout.Stats, error) {
	st, err := s.Sender.Send(ctx, targets, changes, fence)
	if err == nil {
		return st, nil
	}
	ids := make([]string, len(changes))
	for i, c := range changes {
		ids[i] = c.DocID
	}
	return st, s.ids.ScrubError(err, ids...)
}

// scrubbed wraps a poller's feed and sender unless ids are shown as they are.
func scrubbed(ids docid.Exposure, f poll.Feed, s poll.Sender) (poll.Feed, poll.Sender) {
	if ids == "" || ids == docid.Plain {
		return f, s
	}
	return scrubbedFeed{Feed: f, ids: ids}, scrubbedSender{Sender: s, ids: ids}
}
