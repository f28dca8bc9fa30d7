package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/verify"
)

// cmdVerify compares an output with the source and, with --repair,
// re-enqueues what differs. Exit status 2 when drift was found, 3 when the
// output cannot be verified, 0 when the output matches the source.
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
	asJSON := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	deps, j, o, err := sc.openOutput(ctx, env, "verify")
	if err != nil {
		return err
	}
	defer deps.Close()
	name := j.ID + "/" + o.ID
	out, err := deps.State(ctx, o)
	var noState *pipeline.NoStateError
	if errors.As(err, &noState) {
		fmt.Fprintf(env.stderr, "verify is not supported for %s outputs: %s (%s is %s; verify reads postgres and s3 outputs)\n", noState.Type, noState.Reason, name, noState.Type)
		return fmt.Errorf("verify %s: %w for %s outputs", name, errUnsupported, noState.Type)
	}
	if err != nil {
		return fmt.Errorf("verify %s: %w", name, err)
	}
	src, err := deps.Feed(ctx, j)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}

	q, err := dlq.Resolve(ctx, deps.SQS, deps.Config, j, o)
	if err != nil {
		return fmt.Errorf("verify: %w%s", err, missingQueueHint(deps, err))
	}
	if busy := pipelineBusy(ctx, deps, j, q); busy != "" {
		fmt.Fprintf(env.stderr, "note: %s; drift may include changes still on their way\n", busy)
	}

	var bar *progress
	phase := ""
	rep, err := verify.Compare(ctx, src, out, verify.Options{
		PageSize:    j.Feed.Limit,
		Content:     *content,
		Recheck:     !*noRecheck,
		KeepDeleted: j.Processing.IgnoreDelete || j.Feed.ActiveOnly,
		KeepRemoved: j.Processing.IgnoreRemove || j.Feed.ActiveOnly,
		Progress: func(p string, done, total int) {
			if p != phase {
				if bar != nil {
					bar.Finish()
				}
				bar, phase = newProgress(env.stderr, "verify "+name+": "+p, "docs"), p
			}
			bar.Set(int64(done), int64(total))
		},
	})
	if bar != nil {
		bar.Finish()
	}
	if err != nil {
		return fmt.Errorf("verify %s: %w", name, err)
	}

	result := verifyResult{Job: j.ID, Output: o.ID, Report: rep, Samples: map[verify.Kind][]verify.Drift{}}
	for _, k := range verify.Kinds {
		if s := rep.Samples(k, *sample); len(s) > 0 {
			result.Samples[k] = s
		}
	}
	if !*asJSON {
		printReport(env, name, rep, *sample, *content)
	}
	if rep.Clean() {
		if *asJSON {
			return writeJSON(env.stdout, result)
		}
		return nil
	}
	if *repair {
		ids := rep.IDs()
		if !*yes && !confirm(env, fmt.Sprintf("re-enqueue %d documents to %s? The repair holds job %s's lease while it enqueues (its poller pauses)", len(ids), name, j.ID)) {
			return errors.New("verify: repair not confirmed")
		}
		rres, err := repairDrift(ctx, env, deps, j, o, q, src, ids, *wait, *force)
		result.Repair = &rres
		if err != nil {
			return fmt.Errorf("verify %s: repair: %w", name, err)
		}
		if !*asJSON {
			fmt.Fprintf(env.stdout, "repair: enqueued %d documents and %d tombstones at generation %d (source position %s)",
				rres.Live, rres.Tombstones, rres.Generation, rres.Seq)
			if rres.Skipped > 0 {
				fmt.Fprintf(env.stdout, "; left %d deleted or removed documents alone (the job keeps them)", rres.Skipped)
			}
			fmt.Fprintf(env.stdout, "\nrun verify again once the writer has drained %s\n", q.WorkName)
		}
	}
	if *asJSON {
		if err := writeJSON(env.stdout, result); err != nil {
			return err
		}
	}
	return fmt.Errorf("verify %s: %d documents differ: %w", name, len(rep.Drift), exitError(exitDrift))
}

type verifyResult struct {
	Job     string                         `json:"job"`
	Output  string                         `json:"output"`
	Report  *verify.Report                 `json:"report"`
	Samples map[verify.Kind][]verify.Drift `json:"samples"`
	Repair  *verify.RepairResult           `json:"repair,omitempty"`
}

// kindLabels name the kinds of drift in the printed report.
var kindLabels = map[verify.Kind]string{
	verify.Missing:    "missing",
	verify.Stale:      "stale",
	verify.Content:    "content differs",
	verify.Unexpected: "unexpected",
}

func printReport(env *cliEnv, name string, rep *verify.Report, n int, content bool) {
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
		for _, d := range rep.Samples(k, n) {
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
		if c := rep.Counts[k]; c > n {
			fmt.Fprintf(env.stdout, "    … and %d more\n", c-n)
		}
	}
}

func repairDrift(ctx context.Context, env *cliEnv, deps *pipeline.Deps, j *config.Job, o *config.Output, q dlq.Queues,
	src *feed.Client, ids []string, wait time.Duration, force bool) (verify.RepairResult, error) {
	host := pipeline.Hostname()
	bar := newProgress(env.stderr, "repair "+j.ID+"/"+o.ID, "docs")
	defer bar.Finish()
	r := &verify.Repairer{
		Source:      src,
		Leases:      lease.New(deps.DynamoDB, deps.Config.TableName()),
		Sender:      &fanout.Sender{SQS: deps.SQS, S3: deps.S3, Bucket: deps.Config.Stack.Bucket, Stack: deps.Config.Stack.Prefix, MaxBytes: deps.Config.Stack.MaxMessageBytes},
		Job:         j,
		Target:      fanout.NewTarget(o, q.WorkURL),
		Owner:       fmt.Sprintf("changesctl-verify-%s-%d", host, time.Now().UnixNano()),
		Host:        host,
		Wait:        wait,
		Force:       force,
		KeepDeleted: j.Processing.IgnoreDelete || j.Feed.ActiveOnly,
		KeepRemoved: j.Processing.IgnoreRemove || j.Feed.ActiveOnly,
		Progress:    func(done, total int) { bar.Set(int64(done), int64(total)) },
		Log:         deps.Log,
	}
	return r.Repair(ctx, ids)
}

// pipelineBusy describes why the pipeline may still be delivering, or "".
func pipelineBusy(ctx context.Context, deps *pipeline.Deps, j *config.Job, q dlq.Queues) string {
	var why []string
	if d, err := dlq.QueueDepth(ctx, deps.SQS, q.WorkURL); err == nil && d.Total() > 0 {
		why = append(why, fmt.Sprintf("%s holds %d messages", q.WorkName, d.Total()))
	}
	if st, err := lease.New(deps.DynamoDB, deps.Config.TableName()).Get(ctx, j.ID); err == nil && st.Pending > 0 {
		why = append(why, fmt.Sprintf("the poller of %s last reported %d pending changes", j.ID, st.Pending))
	}
	return strings.Join(why, "; ")
}
