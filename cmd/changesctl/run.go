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

// load reads the configuration and builds the shared dependencies, on the
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
	if path == "" {
		return nil, fmt.Errorf("--config is required")
	}
	lookup := func(k string) (string, bool) {
		if k == pipeline.EnvConfigFile {
			return path, true
		}
		return env.lookup(k)
	}
	cfg, err := pipeline.LoadConfig(lookup)
	if err != nil {
		return nil, err
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
func useDeployedBucket(ctx context.Context, cfg *config.File, cfn deployed.CloudFormation, log *slog.Logger) {
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

func cmdBootstrap(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "bootstrap")
	sc := scopeFlags(fs, "", "")
	remove := fs.Bool("remove", false, "delete the table and queues bootstrap created (not the bucket), unless a deployed stack owns them")
	if err := fs.Parse(args); err != nil {
		return err
	}
	deps, err := sc.load(ctx, env, false)
	if err != nil {
		return err
	}
	clients := provision.Clients{DynamoDB: deps.DynamoDB, SQS: deps.SQS, S3: deps.S3}
	if *remove {
		return removeBootstrapped(ctx, env, deps, clients)
	}
	rep, err := provision.Apply(ctx, clients, deps.Config)
	if err != nil {
		return err
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
func removeBootstrapped(ctx context.Context, env *cliEnv, deps *pipeline.Deps, c provision.Clients) error {
	prefix := deps.Config.Stack.Prefix
	_, err := deployed.Bucket(ctx, cloudformation.NewFromConfig(deps.AWS), prefix)
	switch {
	case err == nil:
		fmt.Fprintf(env.stdout, "stack %s is deployed: its table and queues are the stack's; nothing removed\n", prefix)
		return nil
	case !errors.Is(err, deployed.ErrNoStack):
		return fmt.Errorf("bootstrap --remove: %w", err)
	}
	removed, err := provision.Remove(ctx, c, deps.Config)
	for _, name := range removed {
		fmt.Fprintf(env.stdout, "removed %s\n", name)
	}
	if err != nil {
		return fmt.Errorf("bootstrap --remove: %w", err)
	}
	return nil
}

func cmdRun(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "run")
	sc := scopeFlags(fs, "", "")
	jobs := fs.String("jobs", "", "comma-separated job ids (default: every job)")
	untilIdle := fs.Bool("until-idle", false, "exit 0 once every job is caught up and every queue is drained")
	tick := fs.Duration("tick", 0, "schedule interval (default: each job's schedule)")
	pollerTimeout := fs.Duration("poller-timeout", 0, "poller invocation deadline (default: stack.poller_timeout)")
	noPoller := fs.Bool("no-poller", false, "run only the writers")
	noWriter := fs.Bool("no-writer", false, "run only the pollers")
	timeout := fs.Duration("timeout", 0, "stop after this long, with an error (0: never)")
	verbose := fs.Bool("v", false, "debug logging")
	skew := fs.Duration("clock-skew", 0, "offset this process's poller clock (fault testing)")
	receivers := fs.Int("receivers", localrun.DefaultReceivers, "concurrent receivers per work queue, each invoking the writer on what it receives")
	probeEvery := fs.Duration("probe-every", localrun.DefaultProbeEvery, "how often the writer tries an output whose intake it paused (FIFO outputs that are down)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *receivers < 1 {
		return fmt.Errorf("run: --receivers is %d, must be at least 1", *receivers)
	}
	if *probeEvery <= 0 {
		return fmt.Errorf("run: --probe-every is %s, must be above 0", *probeEvery)
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
		NoPoller: *noPoller, NoWriter: *noWriter, Concurrency: *receivers, ProbeEvery: *probeEvery,
	}
	if *jobs != "" {
		opts.Jobs = strings.Split(*jobs, ",")
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
	if *untilIdle {
		sum := rt.Summary()
		fmt.Fprintf(env.stdout, "idle after %s: %d changes read, %d queued\n", time.Since(start).Round(time.Millisecond), sum.Read, sum.Enqueued)
		keys := make([]string, 0, len(sum.Outputs))
		for k := range sum.Outputs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			st := sum.Outputs[k]
			fmt.Fprintf(env.stdout, "  %-30s delivered %d, dead-lettered %d, retried %d\n", k, st.Delivered, st.DeadLettered, st.Retried)
		}
	}
	return nil
}
