package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

const jobUsage = `usage: changesctl job pause|resume --config FILE [--job J] [flags]

  pause    disable the job's schedule rule (P-<job>-schedule): no poller
           invocation starts any more
  resume   enable it again: the next tick starts a poller, which reads on from
           the checkpoint

A pause loses nothing: the checkpoint stays where it is, and what the source
changes meanwhile is read once the job resumes; the writers go on delivering
what is queued. An invocation already running reads until its budget ends
(stack.poller_timeout) and releases the lease: pause --wait D waits for it.

The schedule rule is a deployed stack's (make deploy, make localstack-deploy).
changesctl run schedules its pollers itself, without a rule: there pause and
resume exit 3; stop changesctl run instead, or run the other jobs (--job).
`

// cmdJob pauses and resumes a deployed job's schedule.
func cmdJob(ctx context.Context, env *cliEnv, args []string) error {
	return runAction(ctx, env, "job", jobUsage, args,
		command{"pause", func(ctx context.Context, env *cliEnv, args []string) error { return jobSchedule(ctx, env, args, true) }},
		command{"resume", func(ctx context.Context, env *cliEnv, args []string) error { return jobSchedule(ctx, env, args, false) }})
}

// scheduleRules is the part of the EventBridge client job pause and resume
// call.
type scheduleRules interface {
	DescribeRule(ctx context.Context, in *eventbridge.DescribeRuleInput, optFns ...func(*eventbridge.Options)) (*eventbridge.DescribeRuleOutput, error)
	DisableRule(ctx context.Context, in *eventbridge.DisableRuleInput, optFns ...func(*eventbridge.Options)) (*eventbridge.DisableRuleOutput, error)
	EnableRule(ctx context.Context, in *eventbridge.EnableRuleInput, optFns ...func(*eventbridge.Options)) (*eventbridge.EnableRuleOutput, error)
}

var _ scheduleRules = (*eventbridge.Client)(nil)

// jobScheduled is what `job pause|resume -o json` prints: the rule's state
// before and after, and after a pause who still holds the job's lease.
type jobScheduled struct {
	Job   string     `json:"job"`
	Rule  string     `json:"rule"`
	State string     `json:"state"`
	Was   string     `json:"was"`
	Lease *leaseBusy `json:"lease,omitempty"`
}

// leaseBusy is who still runs the job: the invocation holding its lease and
// one seen standing by.
type leaseBusy struct {
	Role       string `json:"role"`
	Owner      string `json:"owner,omitempty"`
	Generation int64  `json:"generation"`
	Standby    string `json:"standby,omitempty"`
}

// busy reports whether a poller invocation still runs the job.
func (l *leaseBusy) busy() bool { return l.Role == "active" || l.Standby != "" }

// jobSchedule disables (pause) or enables the job's schedule rule.
// Idempotent: a rule already in that state is left alone.
func jobSchedule(ctx context.Context, env *cliEnv, args []string, pause bool) error {
	verb := "resume"
	if pause {
		verb = "pause"
	}
	fs := newFlags(env, "job "+verb)
	sc := scopeFlags(fs, helpOneJob, "")
	wait := new(time.Duration)
	if pause {
		wait = fs.Duration("wait", 0, "wait this long for the poller invocations still running to end (0: do not wait)")
	}
	asJSON := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *wait < 0 {
		return usagef("job pause: --wait %s is negative", *wait)
	}
	deps, j, err := sc.openJob(ctx, env, "job "+verb)
	if err != nil {
		return err
	}
	defer deps.Close()
	rule := deps.Config.ScheduleName(j)
	res, err := setSchedule(ctx, eventbridge.NewFromConfig(deps.AWS), rule, pause)
	var missing *ebtypes.ResourceNotFoundException
	if errors.As(err, &missing) {
		return fmt.Errorf("job %s: no schedule rule %s in region %s: %w here (the rule is a deployed stack's: check the region and stack.prefix %q against it; "+
			"under changesctl run, which schedules the pollers itself, stop it or run the other jobs with --job)",
			verb, rule, deps.AWS.Region, errUnsupported, deps.Config.Stack.Prefix)
	}
	if err != nil {
		return fmt.Errorf("job %s: %w", verb, err)
	}
	res.Job = j.ID
	if !pause {
		if *asJSON {
			return writeJSON(env.stdout, res)
		}
		if res.Was == res.State {
			fmt.Fprintf(env.stdout, "%s was not paused: schedule rule %s enabled\n", j.ID, rule)
			return nil
		}
		fmt.Fprintf(env.stdout, "%s resumed: schedule rule %s enabled; the next tick (every %s) starts a poller, which reads on from the checkpoint\n",
			j.ID, rule, j.Schedule.D())
		return nil
	}
	res.Lease, err = waitIdle(ctx, deps, j, *wait)
	if err != nil {
		return fmt.Errorf("job pause: %w", err)
	}
	if *asJSON {
		if err := writeJSON(env.stdout, res); err != nil {
			return err
		}
	} else {
		if res.Was == res.State {
			fmt.Fprintf(env.stdout, "%s already paused: schedule rule %s disabled\n", j.ID, rule)
		} else {
			fmt.Fprintf(env.stdout, "%s paused: schedule rule %s disabled; no poller invocation starts until job resume\n", j.ID, rule)
		}
		if l := res.Lease; l.busy() {
			fmt.Fprintf(env.stdout, "%s: still running: %s; each reads until its budget ends (stack.poller_timeout %s), then releases the lease\n",
				j.ID, l.describe(), deps.Config.Stack.PollerTimeout.D())
		} else {
			fmt.Fprintf(env.stdout, "%s: no poller invocation runs; the writers deliver what is queued\n", j.ID)
		}
	}
	if l := res.Lease; *wait > 0 && l.busy() {
		return fmt.Errorf("job pause: after %s, %s: it ends within stack.poller_timeout (%s) of the pause; wait longer (--wait)",
			*wait, l.describe(), deps.Config.Stack.PollerTimeout.D())
	}
	return nil
}

// setSchedule disables or enables rule unless it is already so, and
// returns its state before and after.
func setSchedule(ctx context.Context, eb scheduleRules, rule string, pause bool) (jobScheduled, error) {
	cur, err := eb.DescribeRule(ctx, &eventbridge.DescribeRuleInput{Name: &rule})
	if err != nil {
		return jobScheduled{}, fmt.Errorf("describe rule %s: %w", rule, err)
	}
	res := jobScheduled{Rule: rule, Was: string(cur.State), State: string(ebtypes.RuleStateEnabled)}
	switch {
	case pause && cur.State != ebtypes.RuleStateDisabled:
		if _, err := eb.DisableRule(ctx, &eventbridge.DisableRuleInput{Name: &rule}); err != nil {
			return res, fmt.Errorf("disable rule %s: %w", rule, err)
		}
	case !pause && cur.State == ebtypes.RuleStateDisabled:
		if _, err := eb.EnableRule(ctx, &eventbridge.EnableRuleInput{Name: &rule}); err != nil {
			return res, fmt.Errorf("enable rule %s: %w", rule, err)
		}
	case !pause:
		res.State = string(cur.State)
	}
	if pause {
		res.State = string(ebtypes.RuleStateDisabled)
	}
	return res, nil
}

// waitIdle reads the job's lease until no poller invocation holds it or
// stands by, for up to wait (0: reads it once), and returns who runs the
// job at the last read.
func waitIdle(ctx context.Context, deps *pipeline.Deps, j *config.Job, wait time.Duration) (*leaseBusy, error) {
	store := lease.New(deps.DynamoDB, deps.Config.TableName())
	deadline := time.Now().Add(wait)
	for {
		st, err := store.Get(ctx, j.ID)
		if err != nil {
			return nil, err
		}
		now := time.Now()
		l := &leaseBusy{Role: role(st, now), Owner: st.Owner, Generation: st.Generation}
		if st.Standby != "" && st.Standby != st.Owner && now.Sub(st.StandbySeenAt) < 2*j.Lease.TTL.D() {
			l.Standby = st.Standby
		}
		if !l.busy() || !now.Before(deadline) {
			return l, nil
		}
		t := time.NewTimer(min(time.Second, deadline.Sub(now)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// describe names the invocations still running.
func (l *leaseBusy) describe() string {
	s := ""
	if l.Role == "active" {
		s = fmt.Sprintf("poller invocation %s holds the lease (generation %d)", l.Owner, l.Generation)
	}
	if l.Standby != "" {
		if s != "" {
			s += ", "
		}
		s += "poller invocation " + l.Standby + " stands by"
	}
	return s
}
