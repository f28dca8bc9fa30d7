package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/cloudformation"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deployed"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/provision"
)

// load reads the configuration file path names (empty: the one
// CHANGESCTL_CONFIG names) and builds the shared dependencies, on the
// bucket of the stack deployed from the configuration (when it names none).
func load(ctx context.Context, env *cliEnv, path string, logOut io.Writer, verbose bool) (*pipeline.Deps, error) {
	deps, err := loadConfig(ctx, env, path, logOut, verbose)
	if err != nil {
		return nil, err
	}
	cfg := deps.Config
	if b, ok := env.lookup(pipeline.EnvBucket); (!ok || b == "") && cfg.Stack.Bucket == cfg.Stack.Prefix+"-data" {
		useDeployedBucket(ctx, cfg, cloudformation.NewFromConfig(deps.AWS), deps.Log)
	}
	return deps, nil
}

// loadConfig is load without looking the deployed stack's bucket up: for a
// command that only invokes the stack's functions, which know it.
func loadConfig(ctx context.Context, env *cliEnv, path string, logOut io.Writer, verbose bool) (*pipeline.Deps, error) {
	file, err := findConfig(env, path)
	if err != nil {
		return nil, err
	}
	lookup := func(k string) (string, bool) {
		if k == pipeline.EnvConfigFile {
			return file.path, true
		}
		return env.lookup(k)
	}
	cfg, err := pipeline.LoadConfig(lookup)
	if err != nil {
		return nil, file.wrap(err)
	}
	log := newLogger(logOut, verbose)
	awsCfg, err := awsconf.Load(ctx, log)
	if err != nil {
		return nil, err
	}
	announceAWS(ctx, env.stderr, awsCfg, env.lookup)
	return pipeline.New(cfg, awsCfg, env.lookup, log, io.Discard), nil
}

// useDeployedBucket points the configuration at the bucket of the stack
// deployed from it, when there is one: the stack generates its bucket's name,
// while a configuration that names no bucket assumes <prefix>-data. Without a
// stack the default stays; a failed look-up is logged and the default stays.
// The look-up has bucketLookupTimeout: a CloudFormation that does not answer
// (a local setup without it, a slow emulator) delays the command that long
// and no longer.
func useDeployedBucket(ctx context.Context, cfg *config.File, cfn deployed.CloudFormation, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, bucketLookupTimeout)
	defer cancel()
	b, err := deployed.Bucket(ctx, cfn, cfg.Stack.Prefix)
	switch {
	case err == nil:
		log.Info("using the deployed stack's bucket", "stack", cfg.Stack.Prefix, "bucket", b)
		pipeline.OverrideBucket(cfg, b)
	case errors.Is(err, deployed.ErrNoStack):
		log.Debug("no deployed stack; using the default bucket", "stack", cfg.Stack.Prefix, "bucket", cfg.Stack.Bucket)
	default:
		log.Warn("cannot read the deployed stack's bucket; using the default", "stack", cfg.Stack.Prefix, "bucket", cfg.Stack.Bucket, "error", err)
	}
}

// bucketLookupTimeout bounds useDeployedBucket's look-up.
var bucketLookupTimeout = 10 * time.Second

// bootstrapped is what `bootstrap -o json` prints.
type bootstrapped struct {
	Table  string        `json:"table"`
	Bucket string        `json:"bucket"`
	Queues []queuesShown `json:"queues"`
}

type queuesShown struct {
	Job         string `json:"job"`
	Output      string `json:"output"`
	FIFO        bool   `json:"fifo"`
	MaxReceives int    `json:"max_receive_count"`
	Queue       string `json:"queue_url"`
	DLQ         string `json:"dlq_url"`
}

// removed is what `bootstrap --remove -o json` prints: what was deleted,
// or that a deployed stack owns the resources (nothing deleted).
type removed struct {
	Removed  []string `json:"removed"`
	Deployed bool     `json:"deployed"`
}

func cmdBootstrap(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "bootstrap")
	sc := scopeFlags(fs, "", "")
	remove := fs.Bool("remove", false, "delete the table and queues bootstrap created (not the bucket), unless a deployed stack owns them")
	asJSON := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	deps, err := sc.load(ctx, env, false)
	if err != nil {
		return err
	}
	clients := provision.Clients{DynamoDB: deps.DynamoDB, SQS: deps.SQS, S3: deps.S3}
	if *remove {
		return removeBootstrapped(ctx, env, deps, clients, *asJSON)
	}
	rep, err := provision.Apply(ctx, clients, deps.Config)
	if err != nil {
		return err
	}
	if *asJSON {
		b := bootstrapped{Table: rep.Table, Bucket: rep.Bucket, Queues: []queuesShown{}}
		for _, q := range rep.Queues {
			b.Queues = append(b.Queues, queuesShown{Job: q.Job, Output: q.Output, FIFO: q.FIFO, MaxReceives: q.MaxReceives, Queue: q.Queue, DLQ: q.DLQ})
		}
		return writeJSON(env.stdout, b)
	}
	fmt.Fprintf(env.stdout, "table   %s\nbucket  %s\n", rep.Table, rep.Bucket)
	for _, q := range rep.Queues {
		kind := "standard"
		if q.FIFO {
			kind = "fifo"
		}
		fmt.Fprintf(env.stdout, "queue   %s/%s (%s, max receives %d)\n        %s\n  dlq   %s\n", q.Job, q.Output, kind, q.MaxReceives, q.Queue, q.DLQ)
	}
	return nil
}

// removeBootstrapped deletes what bootstrap created, so that a stack of the
// same prefix can be deployed: CloudFormation creates its table and queues
// itself and fails on names that exist. Where the stack is deployed, the
// resources are the stack's and nothing is deleted.
func removeBootstrapped(ctx context.Context, env *cliEnv, deps *pipeline.Deps, c provision.Clients, asJSON bool) error {
	prefix := deps.Config.Stack.Prefix
	_, err := deployed.Bucket(ctx, cloudformation.NewFromConfig(deps.AWS), prefix)
	switch {
	case err == nil:
		if asJSON {
			return writeJSON(env.stdout, removed{Removed: []string{}, Deployed: true})
		}
		fmt.Fprintf(env.stdout, "stack %s is deployed: its table and queues are the stack's; nothing removed\n", prefix)
		return nil
	case !errors.Is(err, deployed.ErrNoStack):
		return fmt.Errorf("bootstrap --remove: %w", err)
	}
	names, err := provision.Remove(ctx, c, deps.Config)
	if asJSON {
		if jerr := writeJSON(env.stdout, removed{Removed: append([]string{}, names...)}); jerr != nil && err == nil {
			err = jerr
		}
	} else {
		for _, name := range names {
			fmt.Fprintf(env.stdout, "removed %s\n", name)
		}
	}
	if err != nil {
		return fmt.Errorf("bootstrap --remove: %w", err)
	}
	return nil
}

// jobList is --job of run: repeated, or ids separated by commas.
type jobList []string

func (l *jobList) String() string { return strings.Join(*l, ",") }

func (l *jobList) Set(s string) error {
	for id := range strings.SplitSeq(s, ",") {
		if id = strings.TrimSpace(id); id != "" {
			*l = append(*l, id)
		}
	}
	return nil
}

// idleSummary is what `run --until-idle -o json` prints.
type idleSummary struct {
	Seconds  float64                 `json:"seconds"`
	Read     int64                   `json:"read"`
	Enqueued int64                   `json:"enqueued"`
	Outputs  map[string]outputCounts `json:"outputs"`
}

type outputCounts struct {
	Delivered    int64 `json:"delivered"`
	DeadLettered int64 `json:"dead_lettered"`
	Retried      int64 `json:"retried"`
}

func cmdRun(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "run")
	sc := scopeFlags(fs, "", "")
	var jobs jobList
	fs.Var(&jobs, "job", "run this job `id` only; repeat it, or separate ids with commas, for several (default: every job)")
	renamedFlag(env, fs, "jobs", "job")
	untilIdle := fs.Bool("until-idle", false, "exit 0 once every job is caught up and every queue is drained; 1 once three of a job's poller invocations in a row failed")
	tick := fs.Duration("tick", 0, "schedule interval (default: each job's schedule)")
	pollerTimeout := fs.Duration("poller-timeout", 0, "poller invocation deadline (default: each job's, stack.poller_timeout or two schedule periods plus 15s)")
	noPoller := fs.Bool("no-poller", false, "run only the writers")
	noWriter := fs.Bool("no-writer", false, "run only the pollers")
	timeout := fs.Duration("timeout", 0, "stop after this long, with an error (0: never)")
	verbose := fs.Bool("v", false, "debug logging")
	skew := fs.Duration("clock-skew", 0, "offset this process's poller clock (fault testing)")
	receivers := fs.Int("receivers", localrun.DefaultReceivers, "concurrent receivers per work queue, each invoking the writer on what it receives")
	probeEvery := fs.Duration("probe-every", localrun.DefaultProbeEvery, "how often the writer tries an output whose intake it paused (FIFO outputs that are down)")
	asJSON := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *receivers < 1 {
		return usagef("run: --receivers is %d, must be at least 1", *receivers)
	}
	if *probeEvery <= 0 {
		return usagef("run: --probe-every is %s, must be above 0", *probeEvery)
	}
	deps, err := sc.load(ctx, env, *verbose)
	if err != nil {
		return err
	}
	defer deps.Close()
	if *skew != 0 {
		deps.Now = func() time.Time { return time.Now().Add(*skew) }
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	opts := localrun.Options{
		Tick: *tick, PollerTimeout: *pollerTimeout, UntilIdle: *untilIdle,
		NoPoller: *noPoller, NoWriter: *noWriter, Concurrency: *receivers, Jobs: jobs, ProbeEvery: *probeEvery,
	}
	rt := &localrun.Runtime{Deps: deps, Opts: opts, Log: deps.Log}
	start := time.Now()
	err = rt.Run(ctx)
	if err != nil {
		if ctx.Err() != nil && !*untilIdle {
			return nil // stopped by signal
		}
		return err
	}
	if !*untilIdle {
		return nil
	}
	sum := rt.Summary()
	took := time.Since(start)
	keys := make([]string, 0, len(sum.Outputs))
	for k := range sum.Outputs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if *asJSON {
		out := idleSummary{Seconds: took.Seconds(), Read: sum.Read, Enqueued: sum.Enqueued, Outputs: map[string]outputCounts{}}
		for _, k := range keys {
			st := sum.Outputs[k]
			out.Outputs[k] = outputCounts{Delivered: st.Delivered, DeadLettered: st.DeadLettered, Retried: st.Retried}
		}
		return writeJSON(env.stdout, out)
	}
	fmt.Fprintf(env.stdout, "idle after %s: %d changes read, %d queued\n", took.Round(time.Millisecond), sum.Read, sum.Enqueued)
	for _, k := range keys {
		st := sum.Outputs[k]
		fmt.Fprintf(env.stdout, "  %-30s delivered %d, dead-lettered %d, retried %d\n", k, st.Delivered, st.DeadLettered, st.Retried)
	}
	return nil
}
