package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/lambda"
	lambdatypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/verify"
)

// cmdVerify compares an output with the source and, with --repair,
// re-enqueues what differs: here, or with --remote in the job's verify
// function of the deployed stack, which prints the same report. Exit
// status 2 when drift was found, 3 when the output cannot be verified, 0
// when the output matches the source.
func cmdVerify(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "verify")
	sc := scopeFlags(fs, helpOneJob, helpOneOutput)
	repair := fs.Bool("repair", false, "re-enqueue the missing, stale, differing and unexpected documents with their current source state")
	content := fs.Bool("content", true, "compare the content of documents held at the source's revision (reads every body from the source and the output); false compares revisions only")
	sample := fs.Int("samples", 10, "sample documents shown per kind of drift")
	renamedFlag(env, fs, "sample", "samples")
	yes := fs.Bool("yes", false, "repair without asking")
	wait := fs.Duration("wait", 3*time.Minute, "repair: how long to wait for the running poller to hand the job's lease over")
	renamedFlag(env, fs, "lease-wait", "wait")
	force := fs.Bool("force", false, "repair: take the lease at once, fencing out a running poller")
	noRecheck := fs.Bool("no-recheck", false, "report first-pass drift without reading drifted documents a second time")
	remote := fs.Bool("remote", false, "run the comparison, and the repair, in the job's verify function of the deployed stack (P-<job>-verify), where the source and the output are reachable (its VPC); at most 15 minutes")
	asJSON := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("verify: unexpected argument %q", fs.Arg(0))
	}
	if *sample < 0 {
		return usagef("verify: --samples %d is negative", *sample)
	}
	open := load
	if *remote {
		open = loadConfig // the function knows the stack's bucket
	}
	deps, err := open(ctx, env, *sc.path, env.stderr, false)
	if err != nil {
		return err
	}
	defer deps.Close()
	j, o, err := route(deps.Config, *sc.job, *sc.output)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	name := j.ID + "/" + o.ID
	var noState *pipeline.NoStateError
	if err := deps.NoState(o); errors.As(err, &noState) {
		fmt.Fprintf(env.stderr, "verify is not supported for %s outputs: %s (%s is %s; verify reads postgres and s3 outputs)\n", noState.Type, noState.Reason, name, noState.Type)
		return fmt.Errorf("verify %s: %w for %s outputs", name, errUnsupported, noState.Type)
	} else if err != nil {
		return fmt.Errorf("verify %s: %w", name, err)
	}
	v := verifyRun{env: env, name: name, content: *content, asJSON: *asJSON}

	if *remote {
		if *repair && !*yes && !confirm(env, fmt.Sprintf("compare %s in the stack and re-enqueue whatever differs? The repair holds job %s's lease while it enqueues (its poller pauses)", name, j.ID)) {
			return errors.New("verify: repair not confirmed")
		}
		res, err := invokeVerify(ctx, env, deps, j, pipeline.VerifyEvent{
			Job: j.ID, Output: o.ID, Content: content, NoRecheck: *noRecheck, Sample: sample,
			Repair: *repair, LeaseWait: config.Duration(*wait), Force: *force,
		})
		if err != nil {
			return fmt.Errorf("verify %s: %w", name, err)
		}
		if res.Busy != "" {
			fmt.Fprintf(env.stderr, "note: %s; drift may include changes still on their way\n", res.Busy)
		}
		v.report(res)
		return v.finish(res, deps.Config.QueueName(j, o), nil)
	}

	vo, err := deps.OpenVerification(ctx, j, o)
	if err != nil {
		var noQueue *sqstypes.QueueDoesNotExist
		if errors.As(err, &noQueue) {
			return fmt.Errorf("verify: %w%s", err, missingQueueHint(deps, err))
		}
		return fmt.Errorf("verify %s: %w", name, err)
	}
	busy := vo.Busy(ctx)
	if busy != "" {
		fmt.Fprintf(env.stderr, "note: %s; drift may include changes still on their way\n", busy)
	}
	var bar *progress
	phase := ""
	opts := vo.Options(*content, !*noRecheck)
	opts.Progress = func(p string, done, total int) {
		if p != phase {
			if bar != nil {
				bar.Finish()
			}
			bar, phase = newProgress(env.stderr, "verify "+name+": "+p, "docs"), p
		}
		bar.Set(int64(done), int64(total))
	}
	rep, err := verify.Compare(ctx, vo.Source, vo.State, opts)
	if bar != nil {
		bar.Finish()
	}
	if err != nil {
		return fmt.Errorf("verify %s: %w", name, err)
	}
	res := verify.NewResult(j.ID, o.ID, rep, *sample)
	res.Busy = busy
	v.report(res)
	if !*repair || rep.Clean() {
		return v.finish(res, vo.Queue, nil)
	}
	ids := rep.IDs()
	if !*yes && !confirm(env, fmt.Sprintf("re-enqueue %d documents to %s? The repair holds job %s's lease while it enqueues (its poller pauses)", len(ids), name, j.ID)) {
		return errors.New("verify: repair not confirmed")
	}
	host := pipeline.Hostname()
	r := vo.Repairer(fmt.Sprintf("changesctl-verify-%s-%d", host, time.Now().UnixNano()), host, *wait, *force)
	rbar := newProgress(env.stderr, "repair "+name, "docs")
	r.Progress = func(done, total int) { rbar.Set(int64(done), int64(total)) }
	rres, err := r.Repair(ctx, ids)
	rbar.Finish()
	res.Repair = &rres
	if err != nil {
		res.RepairError = err.Error()
	}
	return v.finish(res, vo.Queue, err)
}

// verifyRun prints the outcome of one verify, run here or in the stack.
type verifyRun struct {
	env     *cliEnv
	name    string // <job>/<output>
	content bool
	asJSON  bool
}

// report prints the comparison's report, unless JSON was asked for.
func (v verifyRun) report(res *verify.Result) {
	if !v.asJSON {
		printReport(v.env, v.name, res, v.content)
	}
}

// finish prints what follows the report: the repair, or the JSON of the
// whole result. It returns the command's outcome: the repair's failure
// (repairErr, or the one the result names), exit status 2 for drift, or
// nil when in sync.
func (v verifyRun) finish(res *verify.Result, queue string, repairErr error) error {
	env := v.env
	if rr := res.Repair; rr != nil && res.RepairError == "" && !v.asJSON {
		fmt.Fprintf(env.stdout, "repair: enqueued %d documents and %d tombstones at generation %d (source position %s)",
			rr.Live, rr.Tombstones, rr.Generation, rr.Seq)
		if rr.Skipped > 0 {
			fmt.Fprintf(env.stdout, "; left %d deleted or removed documents alone (the job keeps them)", rr.Skipped)
		}
		fmt.Fprintf(env.stdout, "\nrun verify again once the writer has drained %s\n", queue)
	}
	if v.asJSON {
		if err := writeJSON(env.stdout, res); err != nil {
			return err
		}
	}
	switch {
	case repairErr != nil:
		return fmt.Errorf("verify %s: repair: %w", v.name, repairErr)
	case res.RepairError != "":
		return fmt.Errorf("verify %s: repair: %s", v.name, res.RepairError)
	case res.Report.Clean():
		return nil
	}
	return fmt.Errorf("verify %s: %d documents differ: %w", v.name, driftCount(res.Report), exitError(exitDrift))
}

// driftCount is the number of drifted documents of a report.
func driftCount(rep *verify.Report) int {
	n := 0
	for _, c := range rep.Counts {
		n += c
	}
	return n
}

// kindLabels name the kinds of drift in the printed report.
var kindLabels = map[verify.Kind]string{
	verify.Missing:    "missing",
	verify.Stale:      "stale",
	verify.Content:    "content differs",
	verify.Unexpected: "unexpected",
}

// printReport prints a comparison's report with its samples; content says
// whether content was compared.
func printReport(env *cliEnv, name string, res *verify.Result, content bool) {
	rep := res.Report
	fmt.Fprintf(env.stdout, "verify %s: the source has %d live documents, the output holds %d\n", name, rep.SourceDocs, rep.OutputDocs)
	if content {
		fmt.Fprintf(env.stdout, "  content compared for %d documents held at the source's revision\n", rep.ContentChecked)
	} else {
		fmt.Fprintln(env.stdout, "  content not compared (--content=false): revisions only")
	}
	if rep.Kept > 0 {
		fmt.Fprintf(env.stdout, "  %d documents deleted or removed in the source are kept on purpose (ignore_delete, ignore_remove or active_only)\n", rep.Kept)
	}
	if rep.Recheck.Settled > 0 {
		fmt.Fprintf(env.stdout, "  %d documents differed at first and matched on a second look (changes in flight)\n", rep.Recheck.Settled)
	}
	if rep.Clean() {
		fmt.Fprintln(env.stdout, "in sync: nothing missing, stale, differing or unexpected")
		return
	}
	for _, k := range verify.Kinds {
		fmt.Fprintf(env.stdout, "  %-15s %d\n", kindLabels[k], rep.Counts[k])
		samples := res.Samples[k]
		for _, d := range samples {
			fmt.Fprintf(env.stdout, "    %q", d.DocID)
			switch k {
			case verify.Missing:
				fmt.Fprintf(env.stdout, " source %s", d.SourceRev)
			case verify.Stale:
				fmt.Fprintf(env.stdout, " source %s, output %s", d.SourceRev, d.OutputRev)
			case verify.Content:
				fmt.Fprintf(env.stdout, " rev %s", d.SourceRev)
			case verify.Unexpected:
				fmt.Fprintf(env.stdout, " output %s", dash(d.OutputRev))
			}
			if d.Problem != "" {
				fmt.Fprintf(env.stdout, " (%s)", d.Problem)
			}
			fmt.Fprintln(env.stdout)
		}
		if c := rep.Counts[k]; c > len(samples) {
			fmt.Fprintf(env.stdout, "    … and %d more\n", c-len(samples))
		}
	}
}

// invokeVerify runs ev in job j's verify function of the deployed stack and
// returns its result. The invocation is synchronous and made once: it waits
// as long as the function runs (at most its timeout, 15 minutes), with no
// retry that would compare or repair a second time.
func invokeVerify(ctx context.Context, env *cliEnv, deps *pipeline.Deps, j *config.Job, ev pipeline.VerifyEvent) (*verify.Result, error) {
	fn := deps.Config.FunctionName(j, config.FunctionVerify)
	payload, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encode the event of %s: %w", fn, err)
	}
	fmt.Fprintf(env.stderr, "verify %s/%s: running in %s, in the deployed stack (up to 15 minutes)\n", ev.Job, ev.Output, fn)
	out, err := lambda.NewFromConfig(deps.AWS).Invoke(ctx, &lambda.InvokeInput{FunctionName: &fn, Payload: payload},
		func(o *lambda.Options) { o.RetryMaxAttempts = 1 })
	var notFound *lambdatypes.ResourceNotFoundException
	switch {
	case errors.As(err, &notFound):
		return nil, fmt.Errorf("no function %s in the deployed stack (a stack of an earlier release, or of the local variant): deploy this release, or run verify without --remote from a machine that reaches the source and the output", fn)
	case err != nil:
		return nil, fmt.Errorf("invoke %s: %w", fn, err)
	case out.FunctionError != nil:
		var fe struct {
			Message string `json:"errorMessage"`
		}
		if json.Unmarshal(out.Payload, &fe) != nil || fe.Message == "" {
			fe.Message = string(out.Payload)
		}
		return nil, fmt.Errorf("%s failed: %s", fn, fe.Message)
	}
	var res verify.Result
	if err := json.Unmarshal(out.Payload, &res); err != nil {
		return nil, fmt.Errorf("decode the answer of %s: %w", fn, err)
	}
	if res.Report == nil {
		return nil, fmt.Errorf("the answer of %s holds no report: %.200s", fn, out.Payload)
	}
	return &res, nil
}
