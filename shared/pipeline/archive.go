package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/metrics"
)

// sweepBefore is how long before the invocation's deadline a sweep must
// end: it starts no later than sweepMinTime before it.
const (
	sweepBefore  = 2 * time.Second
	sweepMinTime = 10 * time.Second
)

// archiveDLQs sweeps the DLQs of the job into their archives while a poller
// invocation runs, beside its poll loop, which it never delays: once when
// the invocation starts and every stack.dlq's SweepEvery after, each time
// only if no other invocation of the job swept within SweepEvery (a claim
// in the state table). A sweep stops sweepBefore the invocation's deadline.
// The returned function stops the sweeps and waits for the one under way.
//
// Each sweep reports, per output whose archive holds messages, how many and
// how long ago the first was queued (ArchivedMessages, ArchiveOldestAge,
// dimensions Job and Output, which the output's dlq-waiting alarm reads);
// an empty archive reports nothing, so that an idle job publishes no more
// metrics. A failed sweep counts one PollerErrors.
func (d *Deps) archiveDLQs(ctx context.Context, job string, deadline time.Time) (stop func()) {
	j := d.Config.Job(job)
	if j == nil {
		return func() {}
	}
	every := d.Config.Stack.DLQ.SweepEvery()
	ctx, cancel := context.WithDeadline(ctx, deadline.Add(-sweepBefore))
	claim := &dlq.SweepClaim{DB: d.DynamoDB, Table: d.Config.TableName(), Job: j.ID, Now: d.Now}
	log := d.Log.With("job", j.ID)
	stopped := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer cancel()
		next := time.NewTimer(every)
		defer next.Stop()
		for {
			if d.Now.Now().Add(sweepMinTime).After(deadline) {
				return
			}
			if ok, err := claim.Take(ctx, every); err != nil {
				d.sweepFailed(ctx, log, j, err)
			} else if ok {
				d.sweepJob(ctx, log, j)
			}
			select {
			case <-stopped:
				return
			case <-ctx.Done():
				return
			case <-next.C:
				next.Reset(every)
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() { close(stopped) })
		wg.Wait()
	}
}

// sweepJob sweeps the DLQ of every output of job j and reports each
// archive's metrics.
func (d *Deps) sweepJob(ctx context.Context, log *slog.Logger, j *config.Job) {
	after := d.Config.Stack.DLQ.ArchiveAfter.D()
	for _, o := range j.Outputs {
		url, err := d.dlqURL(ctx, j, o)
		if err != nil {
			d.sweepFailed(ctx, log, j, err)
			continue
		}
		s := &dlq.Sweeper{
			SQS: d.SQS, Archive: dlq.NewArchive(d.S3, d.Config, j, o), DLQURL: url, DLQName: d.Config.DLQName(j, o),
			After: after, Log: log.With("output", o.ID), Now: d.Now,
		}
		if _, err := s.Sweep(ctx); err != nil {
			d.sweepFailed(ctx, log.With("output", o.ID), j, err)
		}
		stats, err := s.Archive.Stats(ctx)
		if err != nil {
			d.sweepFailed(ctx, log.With("output", o.ID), j, err)
			continue
		}
		if stats.Count == 0 {
			continue // nothing to report: the alarm reads no data as an empty archive
		}
		rec := metrics.New(d.Metrics, map[string]string{"Job": j.ID, "Output": o.ID})
		rec.Add(metrics.ArchivedMessages, float64(stats.Count), metrics.Count)
		rec.Add(metrics.ArchiveOldestAge, d.Now.Since(stats.Oldest).Seconds(), metrics.Seconds)
		if err := rec.Flush(); err != nil {
			log.Warn("write archive metrics", "output", o.ID, "error", err)
		}
	}
}

// sweepFailed logs a failed sweep and counts it as a poller error.
func (d *Deps) sweepFailed(ctx context.Context, log *slog.Logger, j *config.Job, err error) {
	if ctx.Err() != nil {
		return // the invocation ended
	}
	log.Error("dlq archive sweep failed", "error", err)
	rec := metrics.New(d.Metrics, map[string]string{"Job": j.ID})
	rec.Sum(metrics.PollerErrors, 1, metrics.Count)
	_ = rec.Flush()
}

// dlqURL is the URL of the DLQ of output o of job j, asked once per process.
func (d *Deps) dlqURL(ctx context.Context, j *config.Job, o *config.Output) (string, error) {
	name := d.Config.DLQName(j, o)
	d.mu.Lock()
	url, ok := d.dlqURLs[name]
	d.mu.Unlock()
	if ok {
		return url, nil
	}
	out, err := d.SQS.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		return "", fmt.Errorf("get queue url %s: %w", name, err)
	}
	url = aws.ToString(out.QueueUrl)
	d.mu.Lock()
	if d.dlqURLs == nil {
		d.dlqURLs = map[string]string{}
	}
	d.dlqURLs[name] = url
	d.mu.Unlock()
	return url, nil
}
