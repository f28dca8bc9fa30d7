package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/verify"
)

// Verification is one output of a job opened for verify: the job's source,
// the output's state reader and its work queue, which a repair sends to.
// `changesctl verify` opens it where it runs, the verify function in the
// stack.
type Verification struct {
	Job    *config.Job
	Output *config.Output
	Source *feed.Client
	State  verify.Output
	// Queue and QueueURL are the output's work queue.
	Queue, QueueURL string

	deps *Deps
}

// NoState returns a *NoStateError for an output whose type keeps no state
// that verify could read (http), nil for one that does. It opens nothing.
func (d *Deps) NoState(o *config.Output) error {
	impl, err := d.implementation(o)
	if err != nil {
		return err
	}
	if impl.state == nil {
		return &NoStateError{Type: o.Type, Reason: impl.noState}
	}
	return nil
}

// OpenVerification opens output o of job j for verify: its state reader
// (a *NoStateError for an output that keeps none), the job's source with
// its credentials, and the URL of the output's work queue.
func (d *Deps) OpenVerification(ctx context.Context, j *config.Job, o *config.Output) (*Verification, error) {
	state, err := d.State(ctx, o)
	if err != nil {
		return nil, err
	}
	src, err := d.Feed(ctx, j)
	if err != nil {
		return nil, err
	}
	name := d.Config.QueueName(j, o)
	q, err := d.SQS.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		return nil, fmt.Errorf("get queue url %s: %w", name, err)
	}
	return &Verification{Job: j, Output: o, Source: src, State: state, Queue: name, QueueURL: aws.ToString(q.QueueUrl), deps: d}, nil
}

// Options are the comparison's options for this job: its feed's page size,
// and what it keeps of deleted and removed documents.
func (v *Verification) Options(content, recheck bool) verify.Options {
	return verify.Options{
		PageSize:    v.Job.Feed.Limit,
		Content:     content,
		Recheck:     recheck,
		KeepDeleted: v.Job.Processing.IgnoreDelete || v.Job.Feed.ActiveOnly,
		KeepRemoved: v.Job.Processing.IgnoreRemove || v.Job.Feed.ActiveOnly,
	}
}

// Busy describes why the pipeline may still be delivering to the output
// (messages in its work queue, changes the poller reported pending), or ""
// when it looks idle or cannot tell.
func (v *Verification) Busy(ctx context.Context) string {
	var why []string
	if d, err := dlq.QueueDepth(ctx, v.deps.SQS, v.QueueURL); err == nil && d.Total() > 0 {
		why = append(why, fmt.Sprintf("%s holds %d messages", v.Queue, d.Total()))
	}
	if st, err := v.leases().Get(ctx, v.Job.ID); err == nil && st.Pending > 0 {
		why = append(why, fmt.Sprintf("the poller of %s last reported %d pending changes", v.Job.ID, st.Pending))
	}
	return strings.Join(why, "; ")
}

// Repairer returns the repair of the output, under the job's lease held as
// owner on host; wait and force say how it takes the lease (see
// verify.Repairer).
func (v *Verification) Repairer(owner, host string, wait time.Duration, force bool) *verify.Repairer {
	cfg := v.deps.Config.Stack
	return &verify.Repairer{
		Source:      v.Source,
		Leases:      v.leases(),
		Sender:      &fanout.Sender{SQS: v.deps.SQS, S3: v.deps.S3, Bucket: cfg.Bucket, Stack: cfg.Prefix, MaxBytes: cfg.MaxMessageBytes},
		Job:         v.Job,
		Target:      fanout.NewTarget(v.Output, v.QueueURL),
		Owner:       owner,
		Host:        host,
		Wait:        wait,
		Force:       force,
		KeepDeleted: v.Job.Processing.IgnoreDelete || v.Job.Feed.ActiveOnly,
		KeepRemoved: v.Job.Processing.IgnoreRemove || v.Job.Feed.ActiveOnly,
		Log:         v.deps.Log,
		Clock:       v.deps.Now,
	}
}

func (v *Verification) leases() *lease.Store {
	return &lease.Store{DB: v.deps.DynamoDB, Table: v.deps.Config.TableName(), Clock: v.deps.Now}
}

// VerifyEvent is the verify function's input: which output of the job to
// compare with the source, how, and whether to repair what differs. Left
// out, content is compared, drifted documents are read a second time, 10
// samples of each kind are shown and a repair waits up to 3 minutes for
// the lease. A key it does not know is an error, so that a misspelt
// "repair" is not silently a comparison alone.
type VerifyEvent struct {
	Job    string `json:"job"`
	Output string `json:"output"`
	// Content false compares revisions only.
	Content *bool `json:"content,omitempty"`
	// NoRecheck reports first-pass drift.
	NoRecheck bool `json:"no_recheck,omitempty"`
	// Sample is the number of sample documents per kind of drift.
	Sample *int `json:"sample,omitempty"`
	// Repair re-enqueues what differs, after the comparison, in the same
	// invocation.
	Repair bool `json:"repair,omitempty"`
	// LeaseWait bounds the repair's wait for the job's lease.
	LeaseWait config.Duration `json:"lease_wait,omitempty"`
	// Force takes the lease at once, fencing a running poller out.
	Force bool `json:"force,omitempty"`
}

// UnmarshalJSON decodes the event strictly: an unknown key is an error.
func (e *VerifyEvent) UnmarshalJSON(b []byte) error {
	type plain VerifyEvent
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p plain
	if err := dec.Decode(&p); err != nil {
		return fmt.Errorf("decode verify event: %w", err)
	}
	*e = VerifyEvent(p)
	return nil
}

// Defaults of VerifyEvent.
const (
	defaultVerifySample    = 10
	defaultVerifyLeaseWait = 3 * time.Minute
)

// MaxVerifyAnswer bounds the verify function's answer: Lambda returns at
// most 6 MB from a synchronous invocation. Samples beyond it are left out,
// never the counts.
const MaxVerifyAnswer = 5 << 20

// verifyMargin is the time kept, before the invocation's deadline, to
// release a repair's lease and answer with what failed.
const verifyMargin = 10 * time.Second

// HandleVerify is the verify function's handler: it compares the event's
// output with the source, as `changesctl verify` does, repairs what
// differs when asked (holding the job's lease as verify-<request id>), and
// answers with the result, its samples cut to fit MaxVerifyAnswer. It reads
// the secrets it uses again at every invocation. A failed repair is part of
// the result (RepairError), after the report it follows; any other failure
// is the invocation's error. The whole run must end within the
// invocation's deadline: one that ends before the comparison does says so.
func (d *Deps) HandleVerify(ctx context.Context, ev VerifyEvent) (*verify.Result, error) {
	j, o, err := d.verifyRoute(ev)
	if err != nil {
		return nil, err
	}
	name := j.ID + "/" + o.ID
	sample := defaultVerifySample
	if ev.Sample != nil {
		if sample = *ev.Sample; sample < 0 {
			return nil, fmt.Errorf("verify %s: sample %d is negative", name, sample)
		}
	}
	// Operators invoke the function seldom, often right after correcting
	// a secret: every invocation reads the secrets again (no sooner than
	// the resolver's floor), not only one that was refused.
	d.Secrets.Refresh()
	start := d.Now.Now()
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-verifyMargin))
		defer cancel()
	}
	failed := func(err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("verify %s: the comparison did not end within the function's time (%s): compare this output from a machine that reaches its source and its store (changesctl verify without --remote): %w",
				name, d.Now.Now().Sub(start).Round(time.Second), err)
		}
		return fmt.Errorf("verify %s: %w", name, err)
	}
	v, err := d.OpenVerification(ctx, j, o)
	if err != nil {
		return nil, failed(err)
	}
	busy := v.Busy(ctx)
	rep, err := verify.Compare(ctx, v.Source, v.State, v.Options(ev.Content == nil || *ev.Content, !ev.NoRecheck))
	if err != nil {
		return nil, failed(err)
	}
	res := verify.NewResult(j.ID, o.ID, rep, sample)
	res.Busy = busy
	if ev.Repair && !rep.Clean() {
		owner := "verify-unknown"
		if lc, ok := lambdacontext.FromContext(ctx); ok {
			owner = "verify-" + lc.AwsRequestID
		}
		wait := ev.LeaseWait.D()
		if wait <= 0 {
			wait = defaultVerifyLeaseWait
		}
		rr, err := v.Repairer(owner, Hostname(), wait, ev.Force).Repair(ctx, rep.IDs())
		res.Repair = &rr
		if err != nil {
			res.RepairError = err.Error()
		}
	}
	d.Log.InfoContext(ctx, "verify done", "job", j.ID, "output", o.ID, "source_docs", rep.SourceDocs, "output_docs", rep.OutputDocs,
		"missing", rep.Counts[verify.Missing], "stale", rep.Counts[verify.Stale], "content", rep.Counts[verify.Content],
		"unexpected", rep.Counts[verify.Unexpected], "repaired", res.Repair != nil && res.RepairError == "")
	if err := res.Fit(MaxVerifyAnswer); err != nil {
		return nil, fmt.Errorf("verify %s: %w", name, err)
	}
	return res, nil
}

// verifyRoute finds the event's job and output; both must be named.
func (d *Deps) verifyRoute(ev VerifyEvent) (*config.Job, *config.Output, error) {
	if ev.Job == "" || ev.Output == "" {
		return nil, nil, errors.New(`verify: the event must name the job and the output: {"job": "<id>", "output": "<id>"}`)
	}
	j := d.Config.Job(ev.Job)
	if j == nil {
		return nil, nil, fmt.Errorf("verify: no job %q in this function's configuration", ev.Job)
	}
	o := j.Output(ev.Output)
	if o == nil {
		return nil, nil, fmt.Errorf("verify: job %s has no output %q", j.ID, ev.Output)
	}
	return j, o, nil
}
