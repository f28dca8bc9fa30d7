package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/statetable/halt"
)

const haltUsage = `usage: changesctl halt show|retry|skip|clear --config FILE [--job J] [--output O] [--group G] [flags]

  show    the changes an output with on_failure halt stopped at: document, seq,
          reason, since when, attempts (--body prints the change's document)
  retry   deliver the blocked change again now (after fixing the cause)
  skip    move the blocked change to the DLQ with its reason; the output goes on
  clear   remove a halt whose blocked change is no longer in the queue (the queue
          was purged, or SQS dropped it after its retention): the output goes on

--group picks one halted document of a per_document output (its message
group, as show prints it); an output with ordering total has one group.
retry and skip wait (--wait, 2m) until the writer took the change again.
`

// cmdHalt inspects and resumes halted outputs.
func cmdHalt(ctx context.Context, env *cliEnv, args []string) error {
	return runAction(ctx, env, "halt", haltUsage, args,
		command{"show", cmdHaltShow}, command{"retry", cmdHaltRetry}, command{"skip", cmdHaltSkip}, command{"clear", cmdHaltClear})
}

// haltScope is what the flags every halt action takes name: the
// configuration, the job and output, and the message group.
type haltScope struct {
	*scope
	group  *string
	asJSON *bool
}

func haltFlags(fs *flag.FlagSet) *haltScope {
	return &haltScope{
		scope:  scopeFlags(fs, helpOneJob, helpOneOutput),
		group:  fs.String("group", "", "the halted message `group` (default: the only one)"),
		asJSON: outputFlag(fs),
	}
}

// haltedOutput is an output with on_failure halt and its halt records.
type haltedOutput struct {
	deps  *pipeline.Deps
	store *halt.Store
	j     *config.Job
	o     *config.Output
	list  []halt.State
}

// open loads the dependencies and reads the halt records of the output; an
// output that never halts is an error. The caller closes the dependencies.
func (s *haltScope) open(ctx context.Context, env *cliEnv, verb string) (*haltedOutput, error) {
	deps, j, o, err := s.openOutput(ctx, env, "halt")
	if err != nil {
		return nil, err
	}
	if !o.Halts() {
		deps.Close()
		return nil, fmt.Errorf("halt: output %s/%s has on_failure %s: it never halts, so halt is %w for it (its failures go to the DLQ: changesctl dlq list)", j.ID, o.ID, o.OnFailure, errUnsupported)
	}
	store := &halt.Store{DB: deps.DynamoDB, Table: deps.Config.TableName()}
	list, err := store.List(ctx, j.ID, o.ID)
	if err != nil {
		deps.Close()
		return nil, fmt.Errorf("halt %s: %w", verb, err)
	}
	return &haltedOutput{deps: deps, store: store, j: j, o: o, list: list}, nil
}

// one picks the record a retry, skip or clear acts on.
func (ho *haltedOutput) one(verb, group string) (halt.State, error) {
	st, err := oneHalt(ho.list, ho.j, ho.o, group)
	if err != nil {
		return halt.State{}, fmt.Errorf("halt %s: %w", verb, err)
	}
	return st, nil
}

// cmdHaltShow prints the changes an output stopped at.
func cmdHaltShow(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "halt show")
	hs := haltFlags(fs)
	body := fs.Bool("body", false, "print the blocked change's document")
	if err := fs.Parse(args); err != nil {
		return err
	}
	h, err := hs.open(ctx, env, "show")
	if err != nil {
		return err
	}
	defer h.deps.Close()
	if *hs.group != "" {
		h.list = pickGroup(h.list, *hs.group)
	}
	return h.show(ctx, env, *body, *hs.asJSON)
}

// waitFlag defines --wait of halt retry and skip.
func waitFlag(fs *flag.FlagSet) *time.Duration {
	return fs.Duration("wait", 2*time.Minute, "wait this long for the writer to take the change (0: do not wait)")
}

// cmdHaltRetry has the writer deliver the blocked change again now.
func cmdHaltRetry(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "halt retry")
	hs := haltFlags(fs)
	wait := waitFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *wait < 0 {
		return usagef("halt retry: --wait %s is negative", *wait)
	}
	h, err := hs.open(ctx, env, "retry")
	if err != nil {
		return err
	}
	defer h.deps.Close()
	st, err := h.one("retry", *hs.group)
	if err != nil {
		return err
	}
	return h.resume(ctx, env, st, halt.Retry, *wait, *hs.asJSON)
}

// cmdHaltSkip has the writer move the blocked change to the DLQ.
func cmdHaltSkip(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "halt skip")
	hs := haltFlags(fs)
	wait := waitFlag(fs)
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *wait < 0 {
		return usagef("halt skip: --wait %s is negative", *wait)
	}
	h, err := hs.open(ctx, env, "skip")
	if err != nil {
		return err
	}
	defer h.deps.Close()
	st, err := h.one("skip", *hs.group)
	if err != nil {
		return err
	}
	if !*yes && !confirm(env, fmt.Sprintf("Move the change of document %q (seq %s) to %s and let %s/%s go on?",
		st.DocID, st.Seq, h.deps.Config.DLQName(h.j, h.o), h.j.ID, h.o.ID)) {
		return errors.New("halt skip: not confirmed")
	}
	return h.resume(ctx, env, st, halt.Skip, *wait, *hs.asJSON)
}

// cmdHaltClear removes a halt whose blocked change is no longer in the
// queue.
func cmdHaltClear(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "halt clear")
	hs := haltFlags(fs)
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	if err := fs.Parse(args); err != nil {
		return err
	}
	h, err := hs.open(ctx, env, "clear")
	if err != nil {
		return err
	}
	defer h.deps.Close()
	st, err := h.one("clear", *hs.group)
	if err != nil {
		return err
	}
	j, o := h.j, h.o
	if !*yes && !confirm(env, fmt.Sprintf("Forget the halt of %s/%s at document %q (seq %s)? Meant for a change no longer in %s; one still there is tried again first and halts the output again if it fails.",
		j.ID, o.ID, st.DocID, st.Seq, h.deps.Config.QueueName(j, o))) {
		return errors.New("halt clear: not confirmed")
	}
	if err := h.store.Clear(ctx, j.ID, o.ID, st.Group, st.MessageID); err != nil {
		return fmt.Errorf("halt clear: %w", err)
	}
	if *hs.asJSON {
		return writeJSON(env.stdout, haltOutcome{Job: j.ID, Output: o.ID, Group: st.Group, DocID: st.DocID, Action: "clear", Outcome: "cleared"})
	}
	fmt.Fprintf(env.stdout, "%s/%s: halt at document %q cleared; the output goes on\n", j.ID, o.ID, st.DocID)
	return nil
}

// haltOutcome is what `halt retry|skip|clear -o json` prints: the action
// and its outcome: requested (--wait 0: carried out at the writer's next
// attempt), delivered, skipped (moved to the DLQ), or cleared.
type haltOutcome struct {
	Job     string `json:"job"`
	Output  string `json:"output"`
	Group   string `json:"group"`
	DocID   string `json:"doc_id"`
	Action  string `json:"action"`
	Outcome string `json:"outcome"`
	DLQ     string `json:"dlq,omitempty"`
}

func pickGroup(list []halt.State, group string) []halt.State {
	var out []halt.State
	for _, st := range list {
		if st.Group == group {
			out = append(out, st)
		}
	}
	return out
}

// oneHalt picks the record to act on.
func oneHalt(list []halt.State, j *config.Job, o *config.Output, group string) (halt.State, error) {
	if group != "" {
		list = pickGroup(list, group)
	}
	switch {
	case len(list) == 0 && group != "":
		return halt.State{}, fmt.Errorf("%s/%s is not halted at group %q", j.ID, o.ID, group)
	case len(list) == 0:
		return halt.State{}, fmt.Errorf("%s/%s is not halted", j.ID, o.ID)
	case len(list) > 1:
		groups := make([]string, len(list))
		for i, st := range list {
			groups[i] = st.Group
		}
		return halt.State{}, fmt.Errorf("%s/%s is halted in %d groups (%s): pick one with --group", j.ID, o.ID, len(list), strings.Join(groups, ", "))
	}
	return list[0], nil
}

// haltShown is one halted group as show -o json prints it.
type haltShown struct {
	Job           string           `json:"job"`
	Output        string           `json:"output"`
	Group         string           `json:"group"`
	MessageID     string           `json:"message_id"`
	DocID         string           `json:"doc_id"`
	Rev           string           `json:"rev"`
	Seq           json.RawMessage  `json:"seq,omitempty"`
	Class         string           `json:"class"`
	Reason        string           `json:"reason"`
	HTTPStatus    int              `json:"http_status,omitempty"`
	SQLState      string           `json:"sql_state,omitempty"`
	Error         string           `json:"error"`
	Since         time.Time        `json:"since"`
	LastAttemptAt time.Time        `json:"last_attempt_at"`
	Attempts      int              `json:"attempts"`
	Requested     string           `json:"requested,omitempty"`
	Envelope      *change.Envelope `json:"envelope,omitempty"`
	Doc           json.RawMessage  `json:"doc,omitempty"`
}

func shown(st halt.State) haltShown {
	h := haltShown{Job: st.Job, Output: st.Output, Group: st.Group, MessageID: st.MessageID, DocID: st.DocID, Rev: st.Rev,
		Class: st.Class, Reason: st.Reason, HTTPStatus: st.HTTPStatus, SQLState: st.SQLState, Error: st.Error,
		Since: st.Since, LastAttemptAt: st.LastAt, Attempts: st.Attempts, Requested: string(st.Action)}
	if json.Valid([]byte(st.Seq)) {
		h.Seq = json.RawMessage(st.Seq)
	}
	return h
}

// show prints the output's halt records.
func (ho *haltedOutput) show(ctx context.Context, env *cliEnv, body, asJSON bool) error {
	deps, j, o, list := ho.deps, ho.j, ho.o, ho.list
	out := make([]haltShown, len(list))
	for i, st := range list {
		out[i] = shown(st)
		if e, err := change.Decode([]byte(st.Body)); err == nil {
			if body {
				doc, err := envelopeDoc(ctx, deps, j, e)
				if err != nil {
					return fmt.Errorf("halt show: %w", err)
				}
				out[i].Doc = doc
			}
			e.Doc = nil
			out[i].Envelope = e
		}
	}
	if asJSON {
		return writeJSON(env.stdout, out)
	}
	if len(out) == 0 {
		fmt.Fprintf(env.stdout, "%s/%s is not halted\n", j.ID, o.ID)
		return nil
	}
	now := time.Now()
	for i, h := range out {
		if i > 0 {
			fmt.Fprintln(env.stdout)
		}
		tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "output\t%s/%s HALTED (ordering %s)\n", h.Job, h.Output, o.Ordering)
		fmt.Fprintf(tw, "group\t%s\n", printable(h.Group))
		fmt.Fprintf(tw, "message\t%s\n", h.MessageID)
		fmt.Fprintf(tw, "document\t%q\n", h.DocID)
		what := fmt.Sprintf("rev %s, seq %s", dash(printable(h.Rev)), dash(printable(string(h.Seq))))
		if e := h.Envelope; e != nil {
			what += ", version " + e.Version.String()
			if e.Deleted {
				what += ", deleted"
			}
		}
		fmt.Fprintf(tw, "change\t%s\n", what)
		status := inParens(failureStatus(h.HTTPStatus, h.SQLState))
		fmt.Fprintf(tw, "failure\t%s %s%s, %d attempt(s) since the halt\n", h.Class, h.Reason, status, h.Attempts)
		fmt.Fprintf(tw, "error\t%s\n", printable(h.Error))
		fmt.Fprintf(tw, "halted since\t%s\n", when(now, h.Since))
		fmt.Fprintf(tw, "last attempt\t%s\n", when(now, h.LastAttemptAt))
		if h.Requested != "" {
			fmt.Fprintf(tw, "requested\t%s\n", h.Requested)
		}
		if h.Envelope == nil {
			fmt.Fprintf(tw, "body\tnot kept (larger than %d bytes, not a change envelope, or stack.doc_ids is not plain)\n", halt.MaxBody)
		} else if !body {
			fmt.Fprintf(tw, "body\t--body prints it\n")
		}
		tw.Flush()
		if body && h.Doc != nil {
			fmt.Fprintf(env.stdout, "body\n%s\n", h.Doc)
		}
	}
	return nil
}

// envelopeDoc returns a change's document, reading a claim check from S3
// as the writer does (claimcheck.Fetch: only the job's own references, at
// most the size the message declares).
func envelopeDoc(ctx context.Context, deps *pipeline.Deps, j *config.Job, e *change.Envelope) (json.RawMessage, error) {
	if e.DocRef == nil {
		return e.Doc, nil
	}
	return claimcheck.Fetch(ctx, deps.S3, e.DocRef, deps.Config.Stack.Bucket, deps.Config.Stack.Prefix, j.ID)
}

// resume records the operator's request, makes the blocked change
// visible so that the writer takes it at once, and waits for the outcome.
func (ho *haltedOutput) resume(ctx context.Context, env *cliEnv, st halt.State, a halt.Action, wait time.Duration, asJSON bool) error {
	deps, store, j, o := ho.deps, ho.store, ho.j, ho.o
	name := j.ID + "/" + o.ID
	req, err := store.Request(ctx, j.ID, o.ID, st.Group, st.MessageID, a, time.Now())
	if errors.Is(err, halt.ErrNotHalted) {
		return fmt.Errorf("halt %s: %s moved on meanwhile (the change was delivered or skipped): changesctl halt show", a, name)
	}
	if err != nil {
		return fmt.Errorf("halt %s: %w", a, err)
	}
	url, err := deps.SQS.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(deps.Config.QueueName(j, o))})
	if err != nil {
		return fmt.Errorf("halt %s: get queue url: %w", a, err)
	}
	// The writer holds the change in flight between attempts; visibility 0
	// hands it back now. A refused handle means the writer is taking it
	// already (or it is visible): the request is recorded either way.
	if _, err := deps.SQS.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: url.QueueUrl, ReceiptHandle: &req.ReceiptHandle, VisibilityTimeout: 0,
	}); err != nil {
		deps.Log.Debug("make halted change visible", "error", err)
	}
	fmt.Fprintf(env.stderr, "%s requested for document %q (seq %s) of %s\n", a, st.DocID, st.Seq, name)
	res := haltOutcome{Job: j.ID, Output: o.ID, Group: st.Group, DocID: st.DocID, Action: string(a), Outcome: "requested"}
	if wait == 0 {
		if asJSON {
			return writeJSON(env.stdout, res)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		cur, err := store.Get(ctx, j.ID, o.ID, st.Group)
		switch {
		case err != nil && ctx.Err() != nil:
			return fmt.Errorf("halt %s: the writer did not take the change within %s (is it running? the request stays recorded)", a, wait)
		case err != nil:
			return fmt.Errorf("halt %s: %w", a, err)
		case cur == nil || cur.MessageID != st.MessageID:
			res.Outcome = "delivered"
			if a == halt.Skip {
				res.Outcome, res.DLQ = "skipped", deps.Config.DLQName(j, o)
			}
			switch {
			case asJSON:
				return writeJSON(env.stdout, res)
			case a == halt.Skip:
				fmt.Fprintf(env.stdout, "%s: document %q moved to %s; the output goes on\n", name, st.DocID, res.DLQ)
			default:
				fmt.Fprintf(env.stdout, "%s: document %q delivered; the output goes on\n", name, st.DocID)
			}
			return nil
		case a == halt.Retry && cur.Attempts > req.Attempts:
			return fmt.Errorf("halt retry: document %q failed again: %s (still halted: changesctl halt show)", st.DocID, cur.Error)
		}
		t := time.NewTimer(500 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("halt %s: the writer did not take the change within %s (is it running? the request stays recorded)", a, wait)
		case <-t.C:
		}
	}
}
