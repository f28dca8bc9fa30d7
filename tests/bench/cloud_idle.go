package main

// cloud-idle: what an idle job asks of AWS, per minute, with each idle
// setting. A job whose source (-idle-source) has nothing new runs in the local runtime
// with the default schedule (1m), latency objective (60s) and poller
// timeout (twice the schedule plus 15s), so that with idle watch an
// invocation stands by beside the active one at every moment, as on AWS; only the pollers run (the writer's side on AWS
// is the event source mapping's long polling, which AWS documents). The
// proxy counts the requests by action over cloudIdleFor; the runtime times
// the poller invocations (what Lambda bills), and the pipeline's log and
// metric records (EMF, which CloudWatch Logs ingests too) are measured in
// bytes, and the metrics by name. The monthly figures are those rates times
// 43,200 minutes at the prices docs/scale.md lists.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/localrun"
)

func init() {
	register("cloud-idle", cloudIdle)
}

const cloudIdleFor = 3 * time.Minute

// Prices (US East, arm64) of what cloud-idle measures; docs/scale.md
// names their sources.
const (
	priceGBSecond    = 0.0000133334
	priceInvocation  = 0.20 / 1e6
	priceWriteUnit   = 0.625 / 1e6
	priceReadUnit    = 0.125 / 1e6 // strongly consistent, up to 4 KB
	priceMetricMonth = 0.30
	priceLogGB       = 0.50
	pollerMemoryGB   = 0.25 // 256 MB
	minutesPerMonth  = 43200
	// lambdaLogBytes is what Lambda itself logs per invocation (START, END
	// and REPORT lines), ingested with the function's own.
	lambdaLogBytes = 330
)

func cloudIdle(ctx context.Context, r *results) error {
	sources, err := newIdleSources(ctx)
	if err != nil {
		return err
	}
	defer sources.close()
	for _, idle := range strings.Split(*idleSettingsFlag, ",") {
		if err := cloudIdleRun(ctx, r, sources, idle); err != nil {
			return fmt.Errorf("idle %s: %w", idle, err)
		}
	}
	return nil
}

func cloudIdleRun(ctx context.Context, r *results, sources *idleSources, idle string) error {
	cw, err := newCloudAWS(*cloudLatencyFlag)
	if err != nil {
		return err
	}
	defer cw.close()
	src, remove, err := sources.next(ctx)
	if err != nil {
		return err
	}
	defer remove()
	if err := coreLoad(ctx, src.write, 10, 0); err != nil {
		return err
	}
	timeout := config.DefaultPollerTimeout(config.DefaultSchedule)
	st, err := newCoreStack(ctx, "ci", coreStackSettings{limit: 500, feedTimeout: config.DefaultFeedTimeout,
		pollerTimeout: timeout, source: src})
	if err != nil {
		return err
	}
	defer coreClose(ctx, st)
	// What a Lambda logs: info and above.
	st.Deps.Log = slog.New(slog.NewTextHandler(st.Logs(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	j := st.Deps.Config.Jobs[0]
	j.Idle = idle
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rt := &localrun.Runtime{Deps: st.Deps, Log: log, Opts: localrun.Options{NoWriter: true,
		Tick: config.DefaultSchedule, PollerTimeout: timeout}}
	// The first minute takes the ten documents and settles; then count,
	// and stop the runtime only after the count, so that no invocation
	// cut short by the stop is counted.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- rt.Run(rctx) }()
	wait := func(d time.Duration) error {
		select {
		case <-time.After(d):
			return nil
		case err := <-done:
			return fmt.Errorf("runtime stopped early: %w", err)
		}
	}
	if err := wait(time.Minute); err != nil {
		return err
	}
	cw.resetRequests()
	before := rt.Summary()
	logs0, metrics0 := len(st.Logs().String()), len(st.Metrics().String())
	if err := wait(cloudIdleFor); err != nil {
		return err
	}
	counts := cw.requests()
	after := rt.Summary()
	emf := st.Metrics().String()[metrics0:]
	logs := len(st.Logs().String()) - logs0
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("runtime: %w", err)
	}
	minutes := cloudIdleFor.Minutes()
	perMin := func(actions ...string) float64 { return float64(cloudSum(counts, actions...)) / minutes }
	// Invocations that ended in the window, the one started in the
	// minute before included; a tick starts one a minute.
	ended := after.PollerInvocations - before.PollerInvocations
	if ended == 0 {
		return errors.New("no poller invocation ended in the window")
	}
	perInvocation := (after.PollerTime - before.PollerTime).Seconds() / float64(ended)
	invocations := time.Minute.Minutes() / config.DefaultSchedule.Minutes()
	seconds := perInvocation * invocations
	writes, reads := perMin("DynamoDB.UpdateItem", "DynamoDB.PutItem"), perMin("DynamoDB.GetItem")
	names := emfNames(emf)
	logBytes := float64(logs+len(emf))/minutes + invocations*lambdaLogBytes

	p := "idle " + idle + ": "
	r.add(p+"DynamoDB writes per minute", writes,
		fmt.Sprintf("lease renewals, checkpoints, standby marks, acquire and release; over %s; all per minute: %s", cloudIdleFor, cloudPerDoc(counts, int(minutes))))
	r.add(p+"DynamoDB reads per minute", reads, "the standby's watch of the job item (strongly consistent)")
	r.add(p+"poller seconds per invocation", perInvocation, fmt.Sprintf("over the %d that ended in the window; with watch each runs its budget (%s timeout less its margin), standing by first; with sleep, its stay and a read", ended, timeout))
	r.add(p+"poller seconds per minute", seconds, "what Lambda bills: one invocation a minute")
	r.add(p+"metrics published", len(names), strings.Join(names, " "))
	r.add(p+"log bytes per minute", logBytes, fmt.Sprintf("pipeline log (info) and metric records, plus %d bytes of Lambda's own per invocation", lambdaLogBytes))
	lambda := seconds*minutesPerMonth*pollerMemoryGB*priceGBSecond + invocations*minutesPerMonth*priceInvocation
	dynamo := (writes*priceWriteUnit + reads*priceReadUnit) * minutesPerMonth
	cw1 := float64(len(names))*priceMetricMonth + logBytes*minutesPerMonth/1e9*priceLogGB
	r.add(p+"$ per month, measured part", lambda+dynamo+cw1,
		fmt.Sprintf("poller Lambda %.2f, DynamoDB %.2f, metrics and logs %.2f; alarms and the event source's polling are in docs/scale.md", lambda, dynamo, cw1))
	return nil
}

// emfNames returns the metric names EMF records carry, sorted.
func emfNames(records string) []string {
	seen := map[string]bool{}
	for _, line := range strings.Split(records, "\n") {
		for _, part := range strings.Split(line, `"Name":"`)[1:] {
			if name, _, ok := strings.Cut(part, `"`); ok {
				seen[name] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}
