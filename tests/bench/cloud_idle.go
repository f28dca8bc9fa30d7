package main

// cloud-idle: what an idle job asks of AWS, per minute. A job whose source
// has nothing new runs in the local runtime with the default schedule (1m)
// and poller timeout (90s), so that each invocation overlaps the next one's
// standby as on AWS; only the pollers run (the writer's side on AWS is the
// event source mapping's long polling, which AWS documents). The proxy
// counts the requests by action over cloudIdleFor.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

func init() {
	register("cloud-idle", cloudIdle)
}

const cloudIdleFor = 3 * time.Minute

func cloudIdle(ctx context.Context, r *results) error {
	cw, err := newCloudAWS(*cloudLatencyFlag)
	if err != nil {
		return err
	}
	defer cw.close()
	st, _, err := coreLoaded(ctx, func() (*stack.Stack, error) {
		return newCloudStack(ctx, "ci", 500, cloudOutput{id: "pg", kind: config.OutputPostgres})
	}, coreLoad, 10, 0)
	if err != nil {
		return err
	}
	defer coreClose(ctx, st)
	st.Deps.Config.Stack.PollerTimeout = config.Duration(config.DefaultPollerTimeout)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rt := &localrun.Runtime{Deps: st.Deps, Log: log, Opts: localrun.Options{NoWriter: true,
		Tick: config.DefaultSchedule, PollerTimeout: config.DefaultPollerTimeout}}
	// The first minute takes the ten documents and settles; then count.
	rctx, cancel := context.WithTimeout(ctx, time.Minute+cloudIdleFor)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- rt.Run(rctx) }()
	select {
	case <-time.After(time.Minute):
	case err := <-done:
		return fmt.Errorf("runtime stopped early: %w", err)
	}
	cw.resetRequests()
	if err := <-done; err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("runtime: %w", err)
	}
	counts := cw.requests()
	minutes := cloudIdleFor.Minutes()
	perMin := func(actions ...string) float64 { return float64(cloudSum(counts, actions...)) / minutes }
	r.add("DynamoDB writes per idle minute", perMin("DynamoDB.UpdateItem", "DynamoDB.PutItem"),
		fmt.Sprintf("lease renewals, checkpoints, standby marks, acquire and release; over %s; all per minute: %s", cloudIdleFor, cloudPerDoc(counts, int(minutes))))
	r.add("DynamoDB reads per idle minute", perMin("DynamoDB.GetItem"), "the standby's watch of the job item (strongly consistent)")
	r.add("poller invocations per idle minute", 1.0, fmt.Sprintf("the schedule; each runs its budget (%s timeout minus its margin)", config.DefaultPollerTimeout))
	return nil
}
