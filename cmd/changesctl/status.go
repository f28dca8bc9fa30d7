package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/changes-worker/changes-worker/shared/lease"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/pipeline"
)

// jobStatus is one job's row in `changesctl status`.
type jobStatus struct {
	Job                 string          `json:"job"`
	Owner               string          `json:"owner"`
	Host                string          `json:"host"`
	Role                string          `json:"role"` // active, released, expired, none
	Generation          int64           `json:"generation"`
	HeartbeatAgeSeconds *float64        `json:"heartbeat_age_seconds"`
	Checkpoint          json.RawMessage `json:"checkpoint"`
	CheckpointAgeSecs   *float64        `json:"checkpoint_age_seconds"`
	Pending             int64           `json:"pending"`
	Failovers           int64           `json:"failovers"`
	Handoffs            int64           `json:"handoffs"`
	Outputs             []outputStatus  `json:"outputs"`
}

type outputStatus struct {
	Output   string `json:"output"`
	Queue    string `json:"queue"`
	Depth    int    `json:"depth"`
	DLQDepth int    `json:"dlq_depth"`
}

func cmdStatus(ctx context.Context, env *cliEnv, args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	path := fs.String("config", "", "job configuration file")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	deps, err := load(ctx, env, *path, env.stderr, false)
	if err != nil {
		return err
	}
	rows, err := collectStatus(ctx, deps, time.Now())
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(env.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tROLE\tOWNER\tGEN\tHEARTBEAT\tCHECKPOINT\tCP AGE\tPENDING\tOUTPUT\tQUEUE\tDLQ")
	for _, r := range rows {
		for i, o := range r.Outputs {
			if i == 0 {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", r.Job, r.Role, dash(r.Owner), r.Generation,
					age(r.HeartbeatAgeSeconds), dash(string(r.Checkpoint)), age(r.CheckpointAgeSecs), pending(r.Pending), o.Output, o.Depth, o.DLQDepth)
				continue
			}
			fmt.Fprintf(tw, "\t\t\t\t\t\t\t\t%s\t%d\t%d\n", o.Output, o.Depth, o.DLQDepth)
		}
	}
	return tw.Flush()
}

func collectStatus(ctx context.Context, deps *pipeline.Deps, now time.Time) ([]jobStatus, error) {
	store := lease.New(deps.DynamoDB, deps.Config.TableName())
	var rows []jobStatus
	for _, j := range deps.Config.Jobs {
		st, err := store.Get(ctx, j.ID)
		if err != nil {
			return nil, err
		}
		r := jobStatus{Job: j.ID, Owner: st.Owner, Host: st.Host, Generation: st.Generation, Checkpoint: st.Checkpoint,
			Pending: st.Pending, Failovers: st.Failovers, Handoffs: st.Handoffs}
		switch {
		case !st.Exists || st.Owner == "":
			r.Role = "none"
		case st.Released:
			r.Role = "released"
		case st.Held(now):
			r.Role = "active"
		default:
			r.Role = "expired"
		}
		if !st.HeartbeatAt.IsZero() {
			v := now.Sub(st.HeartbeatAt).Seconds()
			r.HeartbeatAgeSeconds = &v
		}
		if !st.CheckpointAt.IsZero() {
			v := now.Sub(st.CheckpointAt).Seconds()
			r.CheckpointAgeSecs = &v
		}
		for _, o := range j.Outputs {
			os := outputStatus{Output: o.ID, Queue: deps.Config.QueueName(j, o)}
			if os.Depth, err = depth(ctx, deps, os.Queue); err != nil {
				return nil, err
			}
			if os.DLQDepth, err = depth(ctx, deps, deps.Config.DLQName(j, o)); err != nil {
				return nil, err
			}
			r.Outputs = append(r.Outputs, os)
		}
		rows = append(rows, r)
	}
	return rows, nil
}

func depth(ctx context.Context, deps *pipeline.Deps, name string) (int, error) {
	u, err := deps.SQS.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		return 0, fmt.Errorf("get queue url %s: %w", name, err)
	}
	return localrun.Depth(ctx, deps.SQS, aws.ToString(u.QueueUrl))
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
	return (time.Duration(*v * float64(time.Second))).Round(100 * time.Millisecond).String()
}

func pending(n int64) string {
	if n < 0 {
		return "?"
	}
	return fmt.Sprint(n)
}
