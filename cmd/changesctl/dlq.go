package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/pipeline"
)

const dlqUsage = `usage: changesctl dlq list|show|redrive|purge --config FILE [--job J] [--output O] [flags]

  list      count the failed changes by reason, with sample document ids
  show      decode messages: envelope and failure reason (--id ID, or the first --limit N)
  redrive   move the messages back to the work queue (SQS message move task, or copy)
  purge     delete every message of the DLQ (asks first, unless --yes)

Each command covers the DLQ's archive too: the messages the job's poller
moved to the stack bucket (dlq-archive/) before SQS's retention would drop
them, marked archived.

--job and --output may be left out when the configuration has only one.
`

// cmdDLQ inspects and empties the dead-letter queue of one (job, output).
func cmdDLQ(ctx context.Context, env *cliEnv, args []string) error {
	return runAction(ctx, env, "dlq", dlqUsage, args,
		command{"list", cmdDLQList}, command{"show", cmdDLQShow}, command{"redrive", cmdDLQRedrive}, command{"purge", cmdDLQPurge})
}

// openedDLQ is the DLQ of one (job, output) and its archive, with the
// dependencies that reach them.
type openedDLQ struct {
	deps    *pipeline.Deps
	q       dlq.Queues
	archive *dlq.Archive
}

// openDLQ loads the dependencies and resolves the queues of the job and
// output sc names. The caller closes the dependencies.
func openDLQ(ctx context.Context, env *cliEnv, sc *scope) (*openedDLQ, error) {
	deps, j, o, err := sc.openOutput(ctx, env, "dlq")
	if err != nil {
		return nil, err
	}
	q, err := dlq.Resolve(ctx, deps.SQS, deps.Config, j, o)
	if err != nil {
		deps.Close()
		return nil, fmt.Errorf("dlq: %w%s", err, missingQueueHint(deps, err))
	}
	return &openedDLQ{deps: deps, q: q, archive: dlq.NewArchive(deps.S3, deps.Config, j, o)}, nil
}

// missingQueueHint says, for an error about a queue the endpoint does not
// have, what to check: the usual cause is a region or stack.prefix other
// than the deployed stack's. changesctl bootstrap is named for the local
// services only: on AWS it would create the queues outside the stack.
func missingQueueHint(deps *pipeline.Deps, err error) string {
	var missing *sqstypes.QueueDoesNotExist
	if !errors.As(err, &missing) {
		return ""
	}
	return fmt.Sprintf(" (no such queue in region %s: check the region and stack.prefix %q against the deployed stack's; on the local services, changesctl bootstrap creates the queues)",
		deps.AWS.Region, deps.Config.Stack.Prefix)
}

// name is "job/output".
func (d *openedDLQ) name() string { return d.q.Job + "/" + d.q.Output }

// cmdDLQList counts the failed changes by reason.
func cmdDLQList(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "dlq list")
	sc := scopeFlags(fs, helpOneJob, helpOneOutput)
	asJSON := outputFlag(fs)
	samples := fs.Int("samples", 5, "sample document ids per reason")
	maxMsgs := fs.Int("limit", dlq.DefaultScanMax, "read at most this many messages")
	renamedFlag(env, fs, "max", "limit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	d, err := openDLQ(ctx, env, sc)
	if err != nil {
		return err
	}
	defer d.deps.Close()
	return d.list(ctx, env, *samples, *maxMsgs, *asJSON)
}

// cmdDLQShow decodes messages: one by id, or the first few.
func cmdDLQShow(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "dlq show")
	sc := scopeFlags(fs, helpOneJob, helpOneOutput)
	asJSON := outputFlag(fs)
	id := fs.String("id", "", "the message id to show")
	limit := fs.Int("limit", 1, "show the first N messages (without --id)")
	body := fs.Bool("body", false, "print the document body too")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *limit < 1 {
		return usagef("dlq show: --limit %d must be at least 1", *limit)
	}
	d, err := openDLQ(ctx, env, sc)
	if err != nil {
		return err
	}
	defer d.deps.Close()
	return d.show(ctx, env, *id, *limit, *body, *asJSON)
}

// cmdDLQRedrive moves the messages back to the work queue.
func cmdDLQRedrive(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "dlq redrive")
	sc := scopeFlags(fs, helpOneJob, helpOneOutput)
	asJSON := outputFlag(fs)
	rate := fs.Int("rate", 0, "at most this many messages per second (0: as fast as possible; a move task caps it at 500)")
	mode := fs.String("mode", string(dlq.ModeAuto), "auto (a move task for a standard dlq where the endpoint supports it, else copy), task (standard dlqs only) or copy")
	limit := fs.Int("limit", 0, "copy at most this many messages (0: all)")
	visibility := fs.Duration("visibility", dlq.DefaultVisibility, "copy: how long a received DLQ message stays hidden")
	workers := fs.Int("workers", dlq.DefaultWorkers, "copy: concurrent copy loops")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var bad []error
	if *limit < 0 {
		bad = append(bad, fmt.Errorf("--limit %d is negative", *limit))
	}
	if *rate < 0 {
		bad = append(bad, fmt.Errorf("--rate %d is negative", *rate))
	}
	if *visibility < time.Second || *visibility > 12*time.Hour {
		bad = append(bad, fmt.Errorf("--visibility %s must be between 1s and 12h", *visibility))
	}
	if *workers < 1 {
		bad = append(bad, fmt.Errorf("--workers %d must be at least 1", *workers))
	}
	if err := errors.Join(bad...); err != nil {
		return usagef("dlq redrive: %w", err)
	}
	d, err := openDLQ(ctx, env, sc)
	if err != nil {
		return err
	}
	defer d.deps.Close()
	r := &dlq.Redriver{
		SQS:        d.deps.SQS,
		Journal:    &dlq.Journal{DB: d.deps.DynamoDB, Table: d.deps.Config.TableName(), Job: d.q.Job, Output: d.q.Output},
		Queues:     d.q,
		Archive:    d.archive,
		Mode:       dlq.Mode(*mode),
		Rate:       *rate,
		Limit:      *limit,
		Visibility: *visibility,
		Workers:    *workers,
		Log:        d.deps.Log,
	}
	return dlqRedrive(ctx, env, r, d.name(), *asJSON)
}

// cmdDLQPurge deletes every message of the DLQ.
func cmdDLQPurge(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "dlq purge")
	sc := scopeFlags(fs, helpOneJob, helpOneOutput)
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	asJSON := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	d, err := openDLQ(ctx, env, sc)
	if err != nil {
		return err
	}
	defer d.deps.Close()
	return d.purge(ctx, env, *yes, *asJSON)
}

// route finds the job and output, defaulting to the only one of each.
func route(f *config.File, jobID, outputID string) (*config.Job, *config.Output, error) {
	j, err := pickJob(f, jobID)
	if err != nil {
		return nil, nil, err
	}
	if outputID == "" {
		if len(j.Outputs) != 1 {
			return nil, nil, usagef("--output is required: job %s has %d outputs", j.ID, len(j.Outputs))
		}
		return j, j.Outputs[0], nil
	}
	ids := make([]string, len(j.Outputs))
	for i, o := range j.Outputs {
		if o.ID == outputID {
			return j, o, nil
		}
		ids[i] = o.ID
	}
	hint := didYouMean(outputID, ids, "")
	if outputID == "json" || outputID == "table" {
		// --output names an output; the format is -o.
		hint = " (-o " + outputID + " chooses what is printed)"
	}
	return nil, nil, usagef("job %s has no output %q%s", j.ID, outputID, hint)
}

type dlqListing struct {
	Job     string         `json:"job"`
	Output  string         `json:"output"`
	DLQ     string         `json:"dlq"`
	Depth   dlq.Depth      `json:"depth"`
	Archive archiveListing `json:"archive"`
	Scanned int            `json:"scanned"`
	Groups  []dlq.Group    `json:"groups"`
}

// archiveListing is what the DLQ's archive holds.
type archiveListing struct {
	Location string    `json:"location"`
	Messages int       `json:"messages"`
	Oldest   time.Time `json:"oldest_sent_at,omitzero"`
}

func (d *openedDLQ) list(ctx context.Context, env *cliEnv, samples, maxMsgs int, asJSON bool) error {
	deps, q, name := d.deps, d.q, d.name()
	depth, err := dlq.QueueDepth(ctx, deps.SQS, q.DLQURL)
	if err != nil {
		return err
	}
	stats, err := d.archive.Stats(ctx)
	if err != nil {
		return err
	}
	var msgs []dlq.Message
	n, err := dlq.Scan(ctx, deps.SQS, q.DLQURL, dlq.ScanOptions{Max: maxMsgs}, func(m dlq.Message) bool {
		msgs = append(msgs, m)
		return true
	})
	if err != nil {
		return err
	}
	read, err := d.readArchive(ctx, "", maxMsgs-n, func(m dlq.Message) bool {
		msgs = append(msgs, m)
		return true
	})
	if err != nil {
		return err
	}
	l := dlqListing{Job: q.Job, Output: q.Output, DLQ: q.DLQName, Depth: depth, Scanned: n + read, Groups: dlq.Summarize(msgs, samples),
		Archive: archiveListing{Location: d.archive.Location(), Messages: stats.Count, Oldest: stats.Oldest}}
	if asJSON {
		return writeJSON(env.stdout, l)
	}
	now := time.Now()
	fmt.Fprintf(env.stdout, "%s dead-letter queue %s: %d messages", name, q.DLQName, depth.Total())
	if depth.InFlight > 0 {
		fmt.Fprintf(env.stdout, " (%d in flight: held by a redrive or another reader)", depth.InFlight)
	}
	fmt.Fprintln(env.stdout)
	fmt.Fprintf(env.stdout, "archive %s: %d archived", d.archive.Location(), stats.Count)
	if stats.Count > 0 {
		fmt.Fprintf(env.stdout, " (the first queued %s)", ago(now, stats.Oldest))
	}
	fmt.Fprintln(env.stdout)
	if n+read == 0 {
		return nil
	}
	if n < depth.Total() || read < stats.Count {
		fmt.Fprintf(env.stdout, "read %d of the dlq's messages and %d of the archived", n, read)
		if q.FIFO && n < depth.Total() {
			fmt.Fprint(env.stdout, " (a FIFO DLQ shows one message per document at a time)")
		}
		fmt.Fprintln(env.stdout)
	}
	fmt.Fprintln(env.stdout)
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "COUNT\tARCHIVED\tCLASS\tREASON\tSTATUS\tLAST FAILURE\tSAMPLE DOC IDS\tERROR")
	for _, g := range l.Groups {
		status := dash(failureStatus(g.HTTPStatus, g.SQLState))
		last := "-"
		if !g.LastAt.IsZero() {
			last = ago(now, g.LastAt)
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Count, g.Archived, dash(g.Class), dash(g.Reason), status, last,
			truncate(strings.Join(printables(g.Samples), ", "), 60), truncate(printable(g.Error), 100))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "\nshow one:  changesctl dlq show --config ... --job %s --output %s\nredrive:   changesctl dlq redrive --config ... --job %s --output %s\n", q.Job, q.Output, q.Job, q.Output)
	return nil
}

// readArchive reads the archived messages, in the DLQ's order, and calls fn
// for each until fn returns false or max were read (none when max is 0 or
// less); with an id, only that message is read. It returns how many it read.
func (d *openedDLQ) readArchive(ctx context.Context, id string, maxMsgs int, fn func(dlq.Message) bool) (int, error) {
	if maxMsgs <= 0 {
		return 0, nil
	}
	var keys []string
	err := d.archive.Keys(ctx, func(k dlq.ArchivedKey) bool {
		if id == "" || k.MessageID == id {
			keys = append(keys, k.Key)
		}
		return len(keys) < maxMsgs
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, k := range keys {
		m, err := d.archive.Read(ctx, k)
		if err != nil {
			return n, err
		}
		n++
		if !fn(m) {
			break
		}
	}
	return n, nil
}

// dlqShown is one message as `dlq show -o json` prints it.
type dlqShown struct {
	dlq.Message
	Doc json.RawMessage `json:"doc,omitempty"`
}

func (d *openedDLQ) show(ctx context.Context, env *cliEnv, id string, limit int, body, asJSON bool) error {
	deps, q := d.deps, d.q
	var found []dlq.Message
	maxMsgs := limit
	if id != "" {
		maxMsgs = 0 // the whole queue, up to the default bound
	}
	_, err := dlq.Scan(ctx, deps.SQS, q.DLQURL, dlq.ScanOptions{Max: maxMsgs}, func(m dlq.Message) bool {
		if id != "" {
			if m.ID == id {
				found = append(found, m)
				return false
			}
			return true
		}
		found = append(found, m)
		return len(found) < limit
	})
	if err != nil {
		return err
	}
	if more := limit - len(found); id == "" && more > 0 || id != "" && len(found) == 0 {
		if id != "" {
			more = 1
		}
		if _, err := d.readArchive(ctx, id, more, func(m dlq.Message) bool {
			found = append(found, m)
			return true
		}); err != nil {
			return err
		}
	}
	if id != "" && len(found) == 0 {
		return fmt.Errorf("dlq show: no message %s in %s or its archive %s (gone, or held by another reader)", id, q.DLQName, d.archive.Location())
	}
	if len(found) == 0 && !asJSON {
		fmt.Fprintf(env.stdout, "%s and its archive are empty\n", q.DLQName)
		return nil
	}
	if asJSON {
		out := make([]dlqShown, len(found))
		for i, m := range found {
			out[i].Message = m
			if m.Envelope != nil {
				e := *m.Envelope
				if body {
					out[i].Doc = e.Doc
				}
				e.Doc = nil
				out[i].Envelope = &e
			}
		}
		return writeJSON(env.stdout, out)
	}
	now := time.Now()
	for i, m := range found {
		if i > 0 {
			fmt.Fprintln(env.stdout)
		}
		printMessage(env.stdout, m, now, body)
	}
	return nil
}

func printMessage(w io.Writer, m dlq.Message, now time.Time, body bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintf(tw, "message\t%s\n", m.ID)
	if !m.SentAt.IsZero() {
		fmt.Fprintf(tw, "queued\t%s\n", when(now, m.SentAt))
	}
	if a := m.Archived; a != nil {
		fmt.Fprintf(tw, "archived\t%s, %s\n", when(now, a.At), printable(a.Key))
		if m.ClaimCheckError != "" {
			fmt.Fprintf(tw, "claim check\tnot kept: %s\n", printable(m.ClaimCheckError))
		}
	}
	if e := m.Envelope; e != nil {
		fmt.Fprintf(tw, "document\t%q\n", e.DocID)
		fmt.Fprintf(tw, "change\trev %s, seq %s, version %s", dash(printable(e.Rev)), dash(printable(string(e.Seq))), e.Version)
		switch {
		case e.Deleted:
			fmt.Fprint(tw, ", deleted")
		case e.Removed:
			fmt.Fprint(tw, ", removed")
		}
		fmt.Fprintln(tw)
		fmt.Fprintf(tw, "job/output\t%s/%s\n", e.Job, e.Output)
		if !e.EnqueuedAt.IsZero() {
			fmt.Fprintf(tw, "enqueued\t%s\n", when(now, e.EnqueuedAt))
		}
		switch {
		case e.DocRef != nil:
			fmt.Fprintf(tw, "body\tclaim check s3://%s/%s (%d bytes)\n", printable(e.DocRef.Bucket), printable(e.DocRef.Key), e.DocRef.Size)
		case len(e.Doc) > 0 && !body:
			fmt.Fprintf(tw, "body\t%d bytes (--body prints it)\n", len(e.Doc))
		}
	}
	if m.EnvelopeError != "" {
		fmt.Fprintf(tw, "envelope\tinvalid: %s (%d bytes)\n", printable(m.EnvelopeError), m.BodyBytes)
	}
	f := m.Failure
	if !f.Recorded() {
		fmt.Fprintf(tw, "failure\tno reason recorded: the queue's redrive policy moved it (the writer failed or timed out on every receive)\n")
	} else {
		status := inParens(failureStatus(f.HTTPStatus, f.SQLState))
		fmt.Fprintf(tw, "failure\t%s %s%s after %d attempt(s)\n", f.Class, f.Reason, status, f.Attempts)
		fmt.Fprintf(tw, "error\t%s\n", printable(f.Error))
		if !f.FirstAt.IsZero() {
			fmt.Fprintf(tw, "first failure\t%s\n", when(now, f.FirstAt))
		}
		if !f.LastAt.IsZero() {
			fmt.Fprintf(tw, "last failure\t%s\n", when(now, f.LastAt))
		}
	}
	if body && m.Envelope != nil && len(m.Envelope.Doc) > 0 {
		tw.Flush()
		fmt.Fprintf(w, "body\n%s\n", m.Envelope.Doc)
	} else if body && m.Envelope == nil {
		tw.Flush()
		fmt.Fprintf(w, "raw message\n%s\n", m.Body())
	}
}

func dlqRedrive(ctx context.Context, env *cliEnv, r *dlq.Redriver, name string, asJSON bool) error {
	bar := newProgress(env.stderr, "redrive "+name, "msgs")
	r.Progress = bar.Set
	res, err := r.Redrive(ctx)
	bar.Finish()
	if asJSON {
		if jerr := writeJSON(env.stdout, res); jerr != nil {
			return jerr
		}
		if err != nil {
			return fmt.Errorf("dlq redrive: %w", err)
		}
		return nil
	}
	how := string(res.Mode)
	if res.Fallback != "" {
		how += ", because " + res.Fallback
	}
	if res.TaskHandle != "" {
		how += ", task " + res.TaskHandle
	}
	fmt.Fprintf(env.stdout, "redrive %s (%s): %d messages back on %s", name, how, res.Done(), r.Queues.WorkName)
	if res.FromArchive > 0 {
		fmt.Fprintf(env.stdout, " (%d from the archive)", res.FromArchive)
	}
	if res.Recovered > 0 || res.Resent > 0 {
		fmt.Fprintf(env.stdout, " (%d finished for an interrupted redrive, %d re-sent because an interrupted send's outcome was unknown)", res.Recovered, res.Resent)
	}
	fmt.Fprintf(env.stdout, "; %d left in the dlq", res.Left)
	if r.Archive != nil {
		fmt.Fprintf(env.stdout, ", %d in its archive", res.ArchiveLeft)
	}
	fmt.Fprintln(env.stdout)
	if err != nil {
		return fmt.Errorf("dlq redrive: %w", err)
	}
	return nil
}

// purged is what `dlq purge -o json` prints: how many messages were
// deleted from the DLQ (SQS finishes within a minute) and from its archive.
type purged struct {
	Job             string `json:"job"`
	Output          string `json:"output"`
	DLQ             string `json:"dlq"`
	Deleted         int    `json:"deleted"`
	Archive         string `json:"archive"`
	ArchivedDeleted int    `json:"archived_deleted"`
}

func (d *openedDLQ) purge(ctx context.Context, env *cliEnv, yes, asJSON bool) error {
	deps, q, name := d.deps, d.q, d.name()
	depth, err := dlq.QueueDepth(ctx, deps.SQS, q.DLQURL)
	if err != nil {
		return err
	}
	stats, err := d.archive.Stats(ctx)
	if err != nil {
		return err
	}
	res := purged{Job: q.Job, Output: q.Output, DLQ: q.DLQName, Archive: d.archive.Location()}
	if depth.Total() == 0 && stats.Count == 0 {
		if asJSON {
			return writeJSON(env.stdout, res)
		}
		fmt.Fprintf(env.stdout, "%s and its archive are empty\n", q.DLQName)
		return nil
	}
	if !yes && !confirm(env, fmt.Sprintf("delete all %d failed changes of %s for good (dlq %s: %d, archive %s: %d)?",
		depth.Total()+stats.Count, name, q.DLQName, depth.Total(), d.archive.Location(), stats.Count)) {
		return errors.New("dlq purge: not confirmed")
	}
	if depth.Total() > 0 {
		if err := dlq.Purge(ctx, deps.SQS, q.DLQURL); err != nil {
			return err
		}
		res.Deleted = depth.Total()
		if !asJSON {
			fmt.Fprintf(env.stdout, "purged %s: %d messages deleted (SQS may take up to a minute to finish)\n", q.DLQName, depth.Total())
		}
	}
	if stats.Count > 0 {
		res.ArchivedDeleted, err = d.archive.Purge(ctx)
		if !asJSON {
			fmt.Fprintf(env.stdout, "purged %s: %d archived messages deleted\n", d.archive.Location(), res.ArchivedDeleted)
		}
	}
	if asJSON {
		if jerr := writeJSON(env.stdout, res); jerr != nil && err == nil {
			err = jerr
		}
	}
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// ago says how long before now t was, rounded for people.
func ago(now, t time.Time) string {
	d := now.Sub(t)
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Hour:
		return d.Round(time.Second).String() + " ago"
	}
	return d.Round(time.Minute).String() + " ago"
}

// when is t for people: RFC 3339, and how long before now it was.
func when(now, t time.Time) string {
	return t.Format(time.RFC3339) + " (" + ago(now, t) + ")"
}

// failureStatus names a failure's HTTP status or SQL state ("http 422",
// "sqlstate 23505"), or is empty when it has neither.
func failureStatus(httpStatus int, sqlState string) string {
	switch {
	case httpStatus != 0:
		return fmt.Sprintf("http %d", httpStatus)
	case sqlState != "":
		return "sqlstate " + sqlState
	}
	return ""
}

// inParens returns " (s)", or "" for an empty s.
func inParens(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
