package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/statetable/halt"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/statetable/outage"
	"github.com/changes-worker/changes-worker/shared/statetable/quarantine"
)

// jobStatus is one job's row in `changesctl status`.
type jobStatus struct {
	Job                 string          `json:"job"`
	Owner               string          `json:"owner"`
	Host                string          `json:"host"`
	Role                string          `json:"role"` // active, released, expired, none
	Generation          int64           `json:"generation"`
	Takeover            string          `json:"takeover,omitempty"` // how the lease was last taken
	HeartbeatAgeSeconds *float64        `json:"heartbeat_age_seconds"`
	LeaseLeftSeconds    *float64        `json:"lease_left_seconds"`
	Checkpoint          json.RawMessage `json:"checkpoint"`
	CheckpointAgeSecs   *float64        `json:"checkpoint_age_seconds"`
	Pending             int64           `json:"pending"` // -1: unknown
	Failovers           int64           `json:"failovers"`
	Handoffs            int64           `json:"handoffs"`
	HolderVersion       string          `json:"holder_version,omitempty"` // the holder's release; none recorded before 1.0.0
	// Standby is the last invocation seen waiting for the lease, if it was
	// seen within two lease TTLs.
	Standby string `json:"standby,omitempty"`
	// LargestBatch is the most changes one poller invocation read, and
	// FloodThreshold the job's feed.flood_threshold.
	LargestBatch   int64 `json:"largest_batch"`
	FloodThreshold int   `json:"flood_threshold"`
	// SourceAuthFailedAt is when the source last refused our credentials.
	SourceAuthFailedAt *time.Time     `json:"source_auth_failed_at,omitempty"`
	Outputs            []outputStatus `json:"outputs"`
	// Quarantine lists the feed rows the poller skipped, the pages it was
	// (or is) blocked on and the attachments it delivered without a copy.
	Quarantine []quarantineStatus `json:"quarantine"`
}

// quarantineStatus is one entry of a job's quarantine.
type quarantineStatus struct {
	Kind string `json:"kind"` // row, page or attachment
	// State: "skipped" (a row, an attachment), "blocked" (a page at the
	// current checkpoint), "passed" (a page the checkpoint has moved from
	// since).
	State     string          `json:"state"`
	Seq       json.RawMessage `json:"seq"`
	After     json.RawMessage `json:"after,omitempty"`
	Reason    string          `json:"reason"`
	Raw       string          `json:"raw,omitempty"`
	Attempts  int64           `json:"attempts"`
	FirstSeen time.Time       `json:"first_seen"`
	LastSeen  time.Time       `json:"last_seen"`
}

type outputStatus struct {
	Output string `json:"output"`
	Type   string `json:"type"`
	FIFO   bool   `json:"fifo"`
	Queue  string `json:"queue"`
	// Depth is -1 when the queue does not exist (not bootstrapped).
	Depth      int       `json:"depth"`
	QueueState dlq.Depth `json:"queue_state"`
	// OldestAgeSeconds is the age of the oldest of up to 10 messages sampled
	// with --peek (a lower bound of the queue's oldest), nil without --peek.
	OldestAgeSeconds *float64 `json:"oldest_age_seconds"`
	DLQ              string   `json:"dlq"`
	DLQDepth         int      `json:"dlq_depth"`
	// OnFailure is the output's failure policy; Halted lists the message
	// groups it stopped at (on_failure halt), oldest first.
	OnFailure string      `json:"on_failure"`
	Halted    []haltShown `json:"halted,omitempty"`
	// Down is the output's outage record: a writer found it down and has
	// not seen it take changes since.
	Down  *outageShown `json:"down,omitempty"`
	Error string       `json:"error,omitempty"`
}

// outageShown is an output's outage record as status shows it.
type outageShown struct {
	Since     time.Time `json:"since"`
	LastAt    time.Time `json:"last_at"`
	LastError string    `json:"last_error"`
	// Held counts the messages the writers held back since, at each hold.
	Held int64 `json:"messages_held"`
	// Current: a writer found the output down recently enough (within two
	// outage.max_retry and a minute) that the outage is still going on, or
	// the output's intake is paused; a record older than that was left by a
	// writer instance that ended before it saw the output back.
	Current bool `json:"current"`
	// Intake is "paused" while the writer receives none of the output's
	// messages and its probe tries the output (a FIFO output), "resuming"
	// once the probe found it back; PausedAt is when it paused.
	Intake   string     `json:"intake,omitempty"`
	PausedAt *time.Time `json:"intake_paused_at,omitempty"`
}

// cmdStatus shows each job's lease, checkpoint and queues.
//
// The age of a queue's oldest message is not readable from SQS without
// receiving messages (on AWS, CloudWatch's ApproximateAgeOfOldestMessage has
// it, and the stack's dashboard and alarms use it). --peek samples up to ten
// messages per work queue and releases them at once: each sampled message
// counts one receive toward the queue's max_receive_count (a visibility
// timeout of 0 cannot be asked for: the SDK leaves zero out and the queue's
// default applies, so the peek uses 1 second and releases right away). That
// is why --peek is opt-in and refused with --watch, whose repeated peeks
// could push a message stuck behind a failing output into the DLQ without
// a recorded reason.
func cmdStatus(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "status")
	sc := scopeFlags(fs, "only this job `id`", "")
	asJSON := outputFlag(fs)
	watch := fs.Bool("watch", false, "redraw until interrupted")
	interval := fs.Duration("interval", 2*time.Second, "--watch: time between redraws")
	peek := fs.Bool("peek", false, "sample work queues for the age of their oldest message (counts as a receive; see -h)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *watch && *peek {
		return usagef("status: --peek cannot be combined with --watch: every peek counts as a receive toward max_receive_count")
	}
	if *interval < 100*time.Millisecond {
		return usagef("status: --interval %s is too short", *interval)
	}
	deps, err := sc.load(ctx, env, false)
	if err != nil {
		return err
	}
	defer deps.Close()
	jobs := deps.Config.Jobs
	if *sc.job != "" {
		j, err := pickJob(deps.Config, *sc.job)
		if err != nil {
			return fmt.Errorf("status: %w", err)
		}
		jobs = []*config.Job{j}
	}
	tty := isTerminal(env.stdout)
	for {
		now := time.Now()
		rows, err := collectStatus(ctx, deps, jobs, now, *peek)
		if err != nil {
			if *watch && ctx.Err() != nil {
				return nil
			}
			return err
		}
		if *watch {
			if tty {
				fmt.Fprint(raw(env.stdout), "\033[H\033[2J")
			}
			fmt.Fprintf(env.stdout, "changesctl status, every %s, at %s (Ctrl-C stops)\n\n", *interval, now.Format("15:04:05"))
		}
		if *asJSON {
			err = writeJSON(env.stdout, rows)
		} else {
			err = printStatus(env.stdout, rows)
		}
		if err != nil || !*watch {
			return err
		}
		if !tty {
			fmt.Fprintln(env.stdout)
		}
		t := time.NewTimer(*interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

func printStatus(w io.Writer, rows []jobStatus) error {
	var problems, halts, downs []string
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tROLE\tHOLDER\tGEN\tHEARTBEAT\tCHECKPOINT\tCP AGE\tPENDING\tOUTPUT\tQUEUE\tOLDEST\tDLQ")
	for _, r := range rows {
		roleText := r.Role
		if r.Standby != "" {
			roleText += "+standby"
		}
		lead := fmt.Sprintf("%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s", r.Job, roleText, dash(truncate(r.Owner, 32)), r.Generation,
			age(r.HeartbeatAgeSeconds), dash(truncate(string(r.Checkpoint), 24)), age(r.CheckpointAgeSecs), pending(r.Pending))
		if len(r.Outputs) == 0 {
			fmt.Fprintln(tw, lead+"\t-\t-\t-\t-")
		}
		for i, o := range r.Outputs {
			if i > 0 {
				lead = "\t\t\t\t\t\t\t"
			}
			queue, dlqDepth := strconv.Itoa(o.Depth), strconv.Itoa(o.DLQDepth)
			if o.Error != "" {
				problems = append(problems, fmt.Sprintf("%s/%s: %s", r.Job, o.Output, o.Error))
			}
			switch {
			case o.Depth < 0:
				queue = "?"
			case o.QueueState.InFlight > 0:
				queue += fmt.Sprintf(" (%d in flight)", o.QueueState.InFlight)
			}
			if o.DLQDepth < 0 {
				dlqDepth = "?"
			}
			oldest := "n/a"
			if o.OldestAgeSeconds != nil {
				oldest = "≥" + age(o.OldestAgeSeconds)
			} else if o.Depth == 0 {
				oldest = "-"
			}
			output := o.Output
			if len(o.Halted) > 0 {
				output += " HALTED"
			}
			if d := o.Down; d != nil {
				downs = append(downs, downLine(r.Job, o.Output, d, o.Depth))
				if d.Current {
					output += " DOWN"
				}
			}
			for _, h := range o.Halted {
				status := inParens(failureStatus(h.HTTPStatus, h.SQLState))
				halts = append(halts, fmt.Sprintf("%s/%s HALTED since %s at document %q seq %s: %s %s%s; changesctl halt show --job %s --output %s",
					r.Job, o.Output, when(time.Now(), h.Since), h.DocID, dash(string(h.Seq)), h.Class, h.Reason, status, r.Job, o.Output))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", lead, output, queue, oldest, dlqDepth)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, h := range halts {
		fmt.Fprintln(w, h)
	}
	for _, d := range downs {
		fmt.Fprintln(w, d)
	}
	for _, r := range rows {
		switch {
		case r.Role == "none":
		case r.HolderVersion != "":
			fmt.Fprintf(w, "%s: lease holder version %s\n", r.Job, r.HolderVersion)
		default:
			fmt.Fprintf(w, "%s: lease holder version not recorded (a release before 1.0.0)\n", r.Job)
		}
		if r.SourceAuthFailedAt != nil {
			fmt.Fprintf(w, "%s: the source last refused our credentials at %s\n", r.Job, r.SourceAuthFailedAt.Format(time.RFC3339))
		}
		if r.LargestBatch > 0 {
			flood := ""
			if r.LargestBatch > int64(r.FloodThreshold) {
				flood = " (a flood)"
			}
			fmt.Fprintf(w, "%s: largest batch %d changes, flood threshold %d%s\n", r.Job, r.LargestBatch, r.FloodThreshold, flood)
		}
	}
	for _, p := range problems {
		fmt.Fprintln(w, p)
	}
	for _, r := range rows {
		for _, q := range r.Quarantine {
			fmt.Fprintln(w, quarantineLine(r.Job, q))
		}
	}
	return nil
}

// downLine describes an output's outage record on one line.
func downLine(job, output string, d *outageShown, depth int) string {
	queue := "?"
	if depth >= 0 {
		queue = strconv.Itoa(depth)
	}
	if !d.Current {
		return fmt.Sprintf("%s/%s was DOWN from %s, last found down %s (no writer has reported it since): %s",
			job, output, d.Since.Format(time.RFC3339), when(time.Now(), d.LastAt), d.LastError)
	}
	line := fmt.Sprintf("%s/%s DOWN since %s: %s; messages held %d times, %s in the queue; nothing is dead-lettered while it lasts",
		job, output, when(time.Now(), d.Since), d.LastError, d.Held, queue)
	switch d.Intake {
	case outage.IntakePaused:
		line += fmt.Sprintf("; intake paused since %s: no message is received, the writer's probe tries the output (last %s)", when(time.Now(), *d.PausedAt), when(time.Now(), d.LastAt))
	case outage.IntakeResuming:
		line += "; the probe found it back, its intake is resuming"
	}
	return line
}

// quarantineLine describes one quarantine entry on one line.
func quarantineLine(job string, q quarantineStatus) string {
	q.Reason, q.Raw = printable(q.Reason), printable(q.Raw)
	seen := fmt.Sprintf("%d reads, first %s, last %s", q.Attempts, q.FirstSeen.Format(time.RFC3339), q.LastSeen.Format(time.RFC3339))
	pos := string(q.Seq)
	if pos == "" {
		pos = "the beginning"
	}
	switch {
	case q.Kind == string(quarantine.Page) && q.State == "blocked":
		return fmt.Sprintf("%s: BLOCKED at %s, the poller cannot read the page from there (%s): %s", job, pos, seen, q.Reason)
	case q.Kind == string(quarantine.Page):
		return fmt.Sprintf("%s: was blocked at %s, passed since (%s): %s", job, pos, seen, q.Reason)
	case q.Kind == string(quarantine.Attachment):
		return fmt.Sprintf("%s: attachment not copied, row %s (%s): %s: %s", job, pos, seen, q.Reason, truncate(q.Raw, 200))
	}
	if q.Seq == nil {
		pos = "without seq"
	}
	return fmt.Sprintf("%s: skipped row %s (after %s; %s): %s: %s", job, pos, dash(string(q.After)), seen, q.Reason, truncate(q.Raw, 200))
}

func collectStatus(ctx context.Context, deps *pipeline.Deps, jobs []*config.Job, now time.Time, peek bool) ([]jobStatus, error) {
	store := lease.New(deps.DynamoDB, deps.Config.TableName())
	rows := []jobStatus{}
	for _, j := range jobs {
		st, err := store.Get(ctx, j.ID)
		if err != nil {
			return nil, err
		}
		r := jobStatus{Job: j.ID, Owner: st.Owner, Host: st.Host, Role: role(st, now), Generation: st.Generation,
			Takeover: string(st.TakeoverKind), HolderVersion: st.HolderVersion, Checkpoint: st.Checkpoint, Pending: st.Pending,
			Failovers: st.Failovers, Handoffs: st.Handoffs, Outputs: []outputStatus{},
			LargestBatch: st.LargestBatch, FloodThreshold: j.Feed.FloodThreshold}
		if !st.SourceAuthFailedAt.IsZero() {
			at := st.SourceAuthFailedAt.UTC()
			r.SourceAuthFailedAt = &at
		}
		if st.Standby != "" && now.Sub(st.StandbySeenAt) < 2*j.Lease.TTL.D() && st.Standby != st.Owner {
			r.Standby = st.Standby
		}
		r.HeartbeatAgeSeconds = secondsSince(now, st.HeartbeatAt)
		r.CheckpointAgeSecs = secondsSince(now, st.CheckpointAt)
		if r.Role == "active" {
			v := st.ExpiresAt.Sub(now).Seconds()
			r.LeaseLeftSeconds = &v
		}
		for _, o := range j.Outputs {
			r.Outputs = append(r.Outputs, outputState(ctx, deps, j, o, now, peek))
		}
		if r.Quarantine, err = quarantineState(ctx, deps, j.ID, st.Checkpoint); err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// quarantineState lists a job's quarantine; a page entry is blocked while
// the checkpoint is where it was recorded.
func quarantineState(ctx context.Context, deps *pipeline.Deps, job string, checkpoint json.RawMessage) ([]quarantineStatus, error) {
	entries, err := quarantine.List(ctx, deps.DynamoDB, deps.Config.TableName(), job)
	if err != nil {
		return nil, err
	}
	out := []quarantineStatus{}
	for _, e := range entries {
		q := quarantineStatus{Kind: string(e.Kind), State: "skipped", Seq: e.Seq, After: e.After, Reason: e.Reason,
			Raw: strings.ToValidUTF8(string(e.Raw), "\ufffd"), Attempts: e.Attempts, FirstSeen: e.FirstSeen, LastSeen: e.LastSeen}
		if e.Kind == quarantine.Page {
			q.State = "passed"
			if string(e.Seq) == string(checkpoint) {
				q.State = "blocked"
			}
		}
		out = append(out, q)
	}
	return out, nil
}

// outputState reads one output's queues; a failure is reported in the row.
func outputState(ctx context.Context, deps *pipeline.Deps, j *config.Job, o *config.Output, now time.Time, peek bool) outputStatus {
	s := outputStatus{Output: o.ID, Type: o.Type, FIFO: o.FIFO(), Queue: deps.Config.QueueName(j, o), DLQ: deps.Config.DLQName(j, o), Depth: -1, DLQDepth: -1, OnFailure: o.OnFailure}
	if o.Halts() {
		list, err := (&halt.Store{DB: deps.DynamoDB, Table: deps.Config.TableName()}).List(ctx, j.ID, o.ID)
		if err != nil {
			s.Error = err.Error()
			return s
		}
		for _, st := range list {
			s.Halted = append(s.Halted, shown(st))
		}
	}
	down, err := (&outage.Store{DB: deps.DynamoDB, Table: deps.Config.TableName()}).Get(ctx, j.ID, o.ID)
	if err != nil {
		s.Error = err.Error()
		return s
	}
	if down != nil {
		s.Down = &outageShown{Since: down.Since, LastAt: down.LastAt, LastError: down.LastError, Held: down.Held,
			Current: down.Intake != "" || now.Sub(down.LastAt) <= 2*o.Outage.MaxRetry.D()+time.Minute, Intake: down.Intake}
		if !down.PausedAt.IsZero() {
			s.Down.PausedAt = &down.PausedAt
		}
	}
	q, err := dlq.Resolve(ctx, deps.SQS, deps.Config, j, o)
	if err != nil {
		s.Error = err.Error()
		return s
	}
	if s.QueueState, err = dlq.QueueDepth(ctx, deps.SQS, q.WorkURL); err != nil {
		s.Error = err.Error()
		return s
	}
	s.Depth = s.QueueState.Total()
	d, err := dlq.QueueDepth(ctx, deps.SQS, q.DLQURL)
	if err != nil {
		s.Error = err.Error()
		return s
	}
	s.DLQDepth = d.Total()
	if peek && s.QueueState.Visible > 0 {
		if sent, err := oldestSample(ctx, deps.SQS, q.WorkURL); err != nil {
			s.Error = err.Error()
		} else if !sent.IsZero() {
			v := now.Sub(sent).Seconds()
			s.OldestAgeSeconds = &v
		}
	}
	return s
}

// oldestSample receives up to 10 messages, releases them at once, and
// returns the earliest SentTimestamp among them (zero when none came).
func oldestSample(ctx context.Context, c *sqs.Client, url string) (time.Time, error) {
	out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl:                    &url,
		MaxNumberOfMessages:         10,
		VisibilityTimeout:           1,
		MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameSentTimestamp},
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("peek %s: %w", url, err)
	}
	var oldest time.Time
	var entries []sqstypes.ChangeMessageVisibilityBatchRequestEntry
	for i, m := range out.Messages {
		if ms, err := strconv.ParseInt(m.Attributes[string(sqstypes.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil {
			if t := time.UnixMilli(ms); oldest.IsZero() || t.Before(oldest) {
				oldest = t
			}
		}
		entries = append(entries, sqstypes.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
	}
	if len(entries) > 0 {
		_, _ = c.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: &url, Entries: entries})
	}
	return oldest, nil
}

// role says who holds a job's lease by the clock value now.
func role(st *lease.State, now time.Time) string {
	switch {
	case !st.Exists || st.Owner == "":
		return "none"
	case st.Released:
		return "released"
	case st.Held(now):
		return "active"
	}
	return "expired"
}

func secondsSince(now, t time.Time) *float64 {
	if t.IsZero() {
		return nil
	}
	v := now.Sub(t).Seconds()
	return &v
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func age(v *float64) string {
	if v == nil {
		return "-"
	}
	d := time.Duration(*v * float64(time.Second))
	if d >= time.Minute {
		return d.Round(time.Second).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

func pending(n int64) string {
	if n < 0 {
		return "?"
	}
	return fmt.Sprint(n)
}
