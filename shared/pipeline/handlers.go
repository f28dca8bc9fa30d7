package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/changes-worker/changes-worker/shared/poll"
)

// ScheduleEvent is the poller's input: the EventBridge schedule of a job
// sends {"job": "<id>"}.
type ScheduleEvent struct {
	Job string `json:"job"`
}

// HandleSchedule is the poller Lambda handler: one invocation for one job,
// until the context's deadline.
func (d *Deps) HandleSchedule(ctx context.Context, ev ScheduleEvent) (poll.Result, error) {
	if ev.Job == "" {
		return poll.Result{}, errors.New("handle schedule: event has no job (want {\"job\": \"<id>\"})")
	}
	p, err := d.cachedPoller(ctx, ev.Job)
	if err != nil {
		return poll.Result{}, err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(d.Config.Stack.PollerTimeout.D())
	}
	owner := "unknown"
	if lc, ok := lambdacontext.FromContext(ctx); ok {
		owner = lc.AwsRequestID
	}
	res, err := p.Run(ctx, poll.Invocation{Owner: owner, Host: Hostname(), Deadline: deadline})
	if err != nil {
		return res, fmt.Errorf("poll %s: %w", ev.Job, err)
	}
	return res, nil
}

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
	d.mu.Lock()
	if d.pollers == nil {
		d.pollers = map[string]*poll.Poller{}
	}
	d.pollers[job] = p
	d.mu.Unlock()
	return p, nil
}
