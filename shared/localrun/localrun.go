// Package localrun hosts the poller and writer handlers on one machine with
// the contracts Lambda gives them: the poller runs on a schedule tick with a
// deadline (so a new invocation overlaps the previous one and stands by), and
// the writer is fed by an SQS long-poll loop that hands it batches, deletes
// only the messages it did not report failed, and leaves the rest to the
// queue's visibility timeout, receive count and redrive policy.
package localrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/poll"
	"github.com/changes-worker/changes-worker/shared/writer"
)

// Options control a run.
type Options struct {
	// Jobs restricts the run to these job ids; empty means every job.
	Jobs []string
	// Tick is the schedule interval. Default: each job's schedule.
	Tick time.Duration
	// PollerTimeout is each poller invocation's deadline. Default: the stack's.
	PollerTimeout time.Duration
	// WriterTimeout is each writer invocation's deadline. Default: the stack's.
	WriterTimeout time.Duration
	// NoPoller / NoWriter run only one side (fault tests run pollers as
	// separate processes).
	NoPoller, NoWriter bool
	// UntilIdle stops the run, successfully, once every job is caught up and
	// every work queue is drained.
	UntilIdle bool
	// Concurrency is the number of receivers per work queue, each invoking
	// the writer on the batches it receives. Default DefaultReceivers.
	Concurrency int
}

// Runtime runs pipelines locally.
type Runtime struct {
	Deps *pipeline.Deps
	Opts Options
	Log  *slog.Logger

	invocations atomic.Int64
	inflight    atomic.Int64
	read        atomic.Int64
	enqueued    atomic.Int64
	invoked     atomic.Int64 // writer invocations
	handling    atomic.Int64 // time.Duration the writer spent in them
	writer      *writer.Handler
	mu          sync.Mutex
	caughtUp    map[string]bool
}

// Run runs until ctx ends or, with UntilIdle, until the pipelines are idle.
func (r *Runtime) Run(ctx context.Context) error {
	f := r.Deps.Config
	var jobs []*config.Job
	for _, j := range f.Jobs {
		if len(r.Opts.Jobs) == 0 || contains(r.Opts.Jobs, j.ID) {
			jobs = append(jobs, j)
		}
	}
	if len(jobs) == 0 {
		return errors.New("run: no job matches")
	}
	r.caughtUp = map[string]bool{}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 64)
	var wg sync.WaitGroup

	var queues []queue
	if !r.Opts.NoWriter {
		h := r.Deps.Writer()
		r.writer = h
		for _, j := range jobs {
			for _, o := range j.Outputs {
				q, err := r.queue(ctx, f.QueueName(j, o), o)
				if err != nil {
					return err
				}
				queues = append(queues, q)
				src := newEventSource(r, h, q)
				wg.Go(func() { src.run(ctx) })
			}
		}
	}
	if !r.Opts.NoPoller {
		for _, j := range jobs {
			p, err := r.Deps.Poller(ctx, j.ID)
			if err != nil {
				return err
			}
			id := j.ID
			p.OnBatch = func(caughtUp bool) {
				r.mu.Lock()
				r.caughtUp[id] = caughtUp
				r.mu.Unlock()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.schedule(ctx, j, p, errc)
			}()
		}
	}
	var err error
	if r.Opts.UntilIdle {
		err = r.waitIdle(ctx, jobs, queues, errc)
		cancel()
	} else {
		select {
		case <-ctx.Done():
		case err = <-errc:
			cancel()
		}
	}
	wg.Wait()
	return err
}

// Summary is what a run did.
type Summary struct {
	Read, Enqueued int64
	Outputs        map[string]writer.Stats // by "job/output"
	// WriterInvocations is the number of batches handed to the writer, and
	// WriterTime the time it spent on them: what Lambda would bill.
	WriterInvocations int64
	WriterTime        time.Duration
}

// Summary returns the counters of the run so far.
func (r *Runtime) Summary() Summary {
	s := Summary{Read: r.read.Load(), Enqueued: r.enqueued.Load(),
		WriterInvocations: r.invoked.Load(), WriterTime: time.Duration(r.handling.Load())}
	if r.writer != nil {
		s.Outputs = r.writer.Stats()
	}
	return s
}

// schedule starts a poller invocation at every tick, as EventBridge does.
func (r *Runtime) schedule(ctx context.Context, j *config.Job, p *poll.Poller, errc chan<- error) {
	tick := r.Opts.Tick
	if tick == 0 {
		tick = j.Schedule.D()
	}
	timeout := r.Opts.PollerTimeout
	if timeout == 0 {
		timeout = r.Deps.Config.Stack.PollerTimeout.D()
	}
	host := pipeline.Hostname()
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		n := r.invocations.Add(1)
		owner := fmt.Sprintf("local-%s-%d-%d", host, os.Getpid(), n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ictx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			deadline, _ := ictx.Deadline()
			res, err := p.Run(ictx, poll.Invocation{Owner: owner, Host: host, Deadline: deadline})
			r.read.Add(int64(res.Read))
			r.enqueued.Add(int64(res.Enqueued))
			if err != nil && ctx.Err() == nil {
				r.Log.Error("poller invocation failed", "job", j.ID, "owner", owner, "error", err)
				if !r.Opts.UntilIdle {
					return // as on Lambda: the next tick tries again
				}
				select {
				case errc <- fmt.Errorf("poller %s: %w", j.ID, err):
				default:
				}
				return
			}
			r.Log.Debug("poller invocation ended", "job", j.ID, "owner", owner, "role", res.Role, "read", res.Read, "enqueued", res.Enqueued)
		}()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

type queue struct {
	name, url, arn string
	out            *config.Output
}

func (r *Runtime) queue(ctx context.Context, name string, o *config.Output) (queue, error) {
	c := r.Deps.SQS
	u, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		return queue{}, fmt.Errorf("get queue url %s (run changesctl bootstrap first): %w", name, err)
	}
	a, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: u.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn},
	})
	if err != nil {
		return queue{}, fmt.Errorf("get queue arn %s: %w", name, err)
	}
	return queue{name: name, url: aws.ToString(u.QueueUrl), arn: a.Attributes["QueueArn"], out: o}, nil
}

// waitIdle returns nil when, twice in a row, every job is caught up, no
// writer batch is in flight and every work queue is empty.
func (r *Runtime) waitIdle(ctx context.Context, jobs []*config.Job, queues []queue, errc <-chan error) error {
	streak := 0
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			return err
		case <-t.C:
		}
		idle, err := r.idle(ctx, jobs, queues)
		if err != nil {
			return err
		}
		if idle {
			streak++
		} else {
			streak = 0
		}
		if streak >= 3 {
			return nil
		}
	}
}

func (r *Runtime) idle(ctx context.Context, jobs []*config.Job, queues []queue) (bool, error) {
	if !r.Opts.NoPoller {
		r.mu.Lock()
		for _, j := range jobs {
			if !r.caughtUp[j.ID] {
				r.mu.Unlock()
				return false, nil
			}
		}
		r.mu.Unlock()
	}
	if r.inflight.Load() > 0 {
		return false, nil
	}
	for _, q := range queues {
		d, err := dlq.QueueDepth(ctx, r.Deps.SQS, q.url)
		if err != nil {
			return false, err
		}
		if d.Total() > 0 {
			return false, nil
		}
	}
	return true, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
