package dlq

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// withArchive redrives the archive, then the DLQ, then the archive again
// (what a sweep moved there meanwhile), within Limit, and adds up what each
// did. The DLQ's part is done in the Redriver's mode.
func (r *Redriver) withArchive(ctx context.Context) (Result, error) {
	res := Result{Mode: ModeCopy}
	if r.Journal == nil {
		return res, errors.New("redrive: the dlq archive needs a journal")
	}
	stats, err := r.Archive.Stats(ctx)
	if err != nil {
		return res, err
	}
	depth, err := QueueDepth(ctx, r.SQS, r.Queues.DLQURL)
	if err != nil {
		return res, err
	}
	total := int64(stats.Count + depth.Total())
	if r.Limit > 0 {
		total = min(total, int64(r.Limit))
	}
	progress := func(done int64) {
		if r.Progress != nil {
			r.Progress(done, max(total, done))
		}
	}
	progress(0)
	left := func() int64 {
		if r.Limit == 0 {
			return -1
		}
		return int64(r.Limit) - res.Done()
	}
	finish := func(err error) (Result, error) {
		if s, serr := r.Archive.Stats(context.WithoutCancel(ctx)); serr == nil {
			res.ArchiveLeft = int64(s.Count)
		}
		return res, err
	}

	if err := r.redriveArchive(ctx, &res, left(), progress); err != nil {
		res.Left = int64(depth.Total())
		return finish(err)
	}
	if n := left(); depth.Total() > 0 && n != 0 {
		dq := *r
		dq.Archive = nil
		if n > 0 {
			dq.Limit = int(n)
		}
		offset := res.Done()
		dq.Progress = func(done, _ int64) { progress(offset + done) }
		d, err := dq.redriveDLQ(ctx)
		res.Mode, res.Fallback, res.TaskHandle, res.Left = d.Mode, d.Fallback, d.TaskHandle, d.Left
		res.Moved += d.Moved
		res.Recovered += d.Recovered
		res.Resent += d.Resent
		if err != nil {
			return finish(err)
		}
	} else if d, err := QueueDepth(ctx, r.SQS, r.Queues.DLQURL); err == nil {
		res.Left = int64(d.Total())
	}
	if left() != 0 {
		if err := r.redriveArchive(ctx, &res, left(), progress); err != nil {
			return finish(err)
		}
	}
	return finish(nil)
}

// redriveArchive sends the archived messages back to the work queue, in the
// DLQ's order, at most limit of them (-1: all), with the journal discipline
// of a copy redrive (see Redriver): journaled Sending, sent, journaled Sent,
// then the object deleted and the entry forgotten. A message journaled Sent
// by an interrupted run is only deleted. It adds what it did to res and
// reports the messages done so far to progress.
func (r *Redriver) redriveArchive(ctx context.Context, res *Result, limit int64, progress func(int64)) error {
	var keys []ArchivedKey
	err := r.Archive.Keys(ctx, func(k ArchivedKey) bool {
		keys = append(keys, k)
		return limit < 0 || int64(len(keys)) < limit
	})
	if err != nil || limit == 0 {
		return err
	}
	run := &copyRun{r: r, pace: pacer{rate: float64(r.Rate)}}
	for chunk := range slices.Chunk(keys, 10) {
		if err := run.pace.wait(ctx, len(chunk)); err != nil {
			return fmt.Errorf("redrive dlq archive: %w", err)
		}
		var msgs []Message
		for _, k := range chunk {
			m, err := r.Archive.Read(ctx, k.Key)
			var gone *types.NoSuchKey
			if errors.As(err, &gone) {
				continue // redriven meanwhile by another run
			}
			if err != nil {
				return err
			}
			msgs = append(msgs, m)
		}
		if err := r.archiveBatch(ctx, run, res, msgs); err != nil {
			return err
		}
		progress(res.Done())
	}
	return nil
}

// archiveBatch sends back one chunk of archived messages (see
// redriveArchive) and counts them in res.
func (r *Redriver) archiveBatch(ctx context.Context, run *copyRun, res *Result, msgs []Message) error {
	entries, err := r.Journal.Lookup(ctx, messageIDs(msgs))
	if err != nil {
		return err
	}
	var send, recovered []Message
	for _, m := range msgs {
		switch e := entries[m.ID]; e.State {
		case Sent:
			recovered = append(recovered, m)
			continue
		case Sending:
			r.log().Warn("an interrupted redrive may have sent this archived message; sending it again (the work queue may hold it twice, which the output ignores)",
				"message_id", m.ID, "doc_id", m.DocID(), "interrupted_at", e.At)
		}
		if err := r.Archive.restoreClaimCheck(ctx, &m); err != nil {
			return err
		}
		send = append(send, m)
	}
	accepted, sendErr, err := run.journaledSend(ctx, send)
	if err != nil {
		return err
	}
	var deleted []string
	var errs []error
	done := map[string]bool{}
	for _, m := range slices.Concat(accepted, recovered) {
		if err := r.Archive.Delete(ctx, m.Archived.Key); err != nil {
			// Journaled Sent: the next redrive only deletes it.
			errs = append(errs, err)
			continue
		}
		deleted = append(deleted, m.ID)
		done[m.ID] = true
	}
	if len(deleted) > 0 {
		if err := r.Journal.Forget(ctx, deleted); err != nil {
			r.log().Warn("clear redrive journal", "error", err)
		}
	}
	for _, m := range accepted {
		switch {
		case !done[m.ID]:
		case entries[m.ID].State == Sending:
			res.Resent++
			res.FromArchive++
		default:
			res.Moved++
			res.FromArchive++
		}
	}
	for _, m := range recovered {
		if done[m.ID] {
			res.Recovered++
			res.FromArchive++
		}
	}
	return errors.Join(append([]error{sendErr}, errs...)...)
}
