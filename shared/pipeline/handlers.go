package pipeline

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/poll"
)

// ScheduleEvent is the poller's input: the EventBridge schedule of a job
// sends {"job": "<id>"}.
type ScheduleEvent struct {
	Job string `json:"job"`
}

// HandleSchedule is the poller Lambda handler: one invocation for one job,
// until the context's deadline (without one, the job's poller timeout by the
// Deps clock). Beside the poll loop it archives the job's DLQs when due
// (archiveDLQs). The invocation's owner id is the Lambda request id from
// the context. The local runtime calls it too, with a context built the
// same way.
func (d *Deps) HandleSchedule(ctx context.Context, ev ScheduleEvent) (poll.Result, error) {
	if ev.Job == "" {
		return poll.Result{}, errors.New("handle schedule: event has no job (want {\"job\": \"<id>\"})")
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		timeout := d.Config.Stack.PollerTimeout.D()
		if j := d.Config.Job(ev.Job); j != nil {
			timeout = d.Config.PollerTimeout(j)
		}
		deadline = d.Now.Now().Add(timeout)
	}
	stopArchiving := d.archiveDLQs(ctx, ev.Job, deadline)
	defer stopArchiving()
	p, err := d.cachedPoller(ctx, ev.Job)
	if err != nil {
		return poll.Result{}, err
	}
	owner := "unknown"
	if lc, ok := lambdacontext.FromContext(ctx); ok {
		owner = lc.AwsRequestID
	}
	res, err := p.Run(ctx, poll.Invocation{Owner: owner, Host: Hostname(), Deadline: deadline})
	if err != nil {
		if sourceRefused(err) {
			d.forgetPoller(ev.Job, p)
		}
		return res, fmt.Errorf("poll %s: %w", ev.Job, err)
	}
	return res, nil
}

// sourceRefused reports whether err is the source refusing our credentials
// (401 or 403, a refused session sign-in included).
func sourceRefused(err error) bool {
	var se *feed.StatusError
	return errors.As(err, &se) && (se.Status == http.StatusUnauthorized || se.Status == http.StatusForbidden)
}

// forgetPoller drops the job's cached poller p, whose source refused its
// credentials, and has the secrets read again: the next invocation builds
// the poller anew, so a rotated or corrected source secret takes effect on
// this warm instance (after the secrets' floor, secret.Resolver).
func (d *Deps) forgetPoller(job string, p *poll.Poller) {
	d.mu.Lock()
	if d.pollers[job] == p {
		delete(d.pollers, job)
	}
	d.mu.Unlock()
	d.Secrets.Refresh()
}

// PreparePoller builds the poller of a job for HandleSchedule, as a cold
// start does on its first event, so that a configuration error shows before
// the first tick.
func (d *Deps) PreparePoller(ctx context.Context, job string) error {
	_, err := d.cachedPoller(ctx, job)
	return err
}

// cachedPoller returns the job's poller, built once per process. The
// pollers report every batch to d.OnBatch.
func (d *Deps) cachedPoller(ctx context.Context, job string) (*poll.Poller, error) {
	d.mu.Lock()
	p, ok := d.pollers[job]
	d.mu.Unlock()
	if ok {
		return p, nil
	}
	p, err := d.Poller(ctx, job)
	if err != nil {
		return nil, err
	}
	p.OnBatch = func(caughtUp bool) {
		if d.OnBatch != nil {
			d.OnBatch(job, caughtUp)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if cached, ok := d.pollers[job]; ok {
		return cached, nil // built meanwhile by another invocation
	}
	if d.pollers == nil {
		d.pollers = map[string]*poll.Poller{}
	}
	d.pollers[job] = p
	return p, nil
}
