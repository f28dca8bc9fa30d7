package main

// cloud-backlog: backlogs moved end to end into PostgreSQL, every AWS call
// delayed by the cloud latency, and the same with no added latency, side by
// side: when both take about as long, the emulator, not the latency, sets
// the pace.
//
//   - in process: a source of -backlog-docs documents, one PostgreSQL
//     output (standard queue), the real local runtime (localrun.Runtime:
//     the poller on its schedule, the writer's receivers on the work queue)
//     until every document is a row; requests counted by the proxy, writer
//     invocations and their time from the runtime;
//   - the CLI: `changesctl run --until-idle` as a process of its own over a
//     source of -cli-docs documents, until every document is a row, and
//     until the process exits (idle: caught up and drained);
//   - both again with SQS replaced by the stand-in (cloud_sqs.go), which
//     answers after the same latency: the pipeline's own pace when SQS keeps up, as it does on
//     AWS (DynamoDB and S3 still the local ones, through the proxy);
//   - emulator receive: what the emulator's SQS hands out through the same
//     proxy to DefaultReceivers receivers (receive ten, delete ten), no
//     writer at all: the ceiling of the emulator figures.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
	"github.com/changes-worker/changes-worker/tests/faults"
)

var (
	cloudBacklogDocs = flag.Int("backlog-docs", 20000, "cloud-backlog: documents moved in process")
	cloudCLIDocs     = flag.Int("cli-docs", 10000, "cloud-backlog: documents moved by changesctl run")
)

const (
	cloudReceiveMsgs = 5000
	cloudBacklogWait = 10 * time.Minute
)

func cloudBacklog(ctx context.Context, r *results) error {
	cw, err := newCloudAWS(*cloudLatencyFlag)
	if err != nil {
		return err
	}
	defer cw.close()
	bin, remove, err := faults.Build(ctx)
	if err != nil {
		return err
	}
	defer remove()
	pool, err := coreOpenPool(ctx, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	r.add("docs", *cloudBacklogDocs, fmt.Sprintf("in process; %d through the CLI; small orders; %s added to every AWS request",
		*cloudCLIDocs, cw.latency))

	run := 0
	for _, latency := range []time.Duration{cw.latency, 0} {
		cw.setLatency(latency)
		at := fmt.Sprintf(" at %s", latency)
		kinds := []bool{false, true} // the emulator's SQS, the stand-in
		if latency == 0 {
			kinds = kinds[:1]
		}
		for _, standIn := range kinds {
			sqsName := "emulator SQS"
			if standIn {
				sqsName = "stand-in SQS"
			}
			run++
			in, err := cloudInProcess(ctx, cw, pool, *cloudBacklogDocs, standIn)
			if err != nil {
				return fmt.Errorf("in process, %s%s: %w", sqsName, at, err)
			}
			fmt.Printf("  in process, %s%s: %d docs in PostgreSQL after %s, idle after %s\n", sqsName, at, *cloudBacklogDocs, in.rows.Round(time.Millisecond), in.idle.Round(time.Millisecond))
			r.add(fmt.Sprintf("in-process backlog docs/s, %s%s", sqsName, at), coreRate(*cloudBacklogDocs, in.rows),
				fmt.Sprintf("%d docs, source to PostgreSQL rows; %.0f docs/s to idle; writer %s", *cloudBacklogDocs, coreRate(*cloudBacklogDocs, in.idle), cloudOutcome(in.sum)))
			if latency == cw.latency && !standIn {
				n := float64(*cloudBacklogDocs)
				r.add("requests per doc, in-process backlog", float64(cloudSum(in.counts, "SQS.SendMessageBatch", "SQS.ReceiveMessage", "SQS.DeleteMessageBatch"))/n,
					"SQS sends+receives+deletes; all: "+cloudPerDoc(in.counts, *cloudBacklogDocs))
				r.add("writer invocations per doc", float64(in.sum.WriterInvocations)/n,
					fmt.Sprintf("%d invocations, %.1f ms each on average (the handler's time, what Lambda bills)",
						in.sum.WriterInvocations, coreMillis(in.sum.WriterTime)/float64(max(1, in.sum.WriterInvocations))))
			}

			run++
			env := cw.env()
			if standIn {
				env = cw.standInEnv()
			}
			cli, err := cloudCLI(ctx, pool, bin, *cloudCLIDocs, env)
			if err != nil {
				return fmt.Errorf("changesctl run, %s%s: %w", sqsName, at, err)
			}
			fmt.Printf("  changesctl run, %s%s: %d docs in PostgreSQL after %s, exited after %s (%s)\n", sqsName, at, *cloudCLIDocs, cli.rows.Round(time.Millisecond), cli.idle.Round(time.Millisecond), strings.TrimSpace(cli.summary))
			r.add(fmt.Sprintf("changesctl run --until-idle docs/s, %s%s", sqsName, at), coreRate(*cloudCLIDocs, cli.rows),
				fmt.Sprintf("goal >= 2000 at 15ms; %d docs, process start to PostgreSQL rows; %.0f docs/s to exit", *cloudCLIDocs, coreRate(*cloudCLIDocs, cli.idle)))
		}
		rate, err := cloudReceiveRate(ctx, cloudReceiveMsgs)
		if err != nil {
			return fmt.Errorf("emulator receive rate%s: %w", at, err)
		}
		r.add("emulator's receive+delete rate msgs/s"+at, rate, fmt.Sprintf("%d receivers, %d messages, no writer: the ceiling of the emulator figures", localrun.DefaultReceivers, cloudReceiveMsgs))
	}
	cw.setLatency(cw.latency)
	return nil
}

// cloudRun is what one backlog run measured.
type cloudRun struct {
	rows, idle time.Duration // until every document was a row; until the run ended
	counts     map[string]int64
	sum        localrun.Summary
	summary    string // the CLI's output
}

// cloudBacklogStack returns a stack of one PostgreSQL output, named after
// kind, whose source holds docs documents, and the output's data table.
func cloudBacklogStack(ctx context.Context, kind string, docs int) (*stack.Stack, pgx.Identifier, error) {
	st, _, err := coreLoaded(ctx, func() (*stack.Stack, error) {
		return newCloudStack(ctx, kind, 500, cloudOutput{id: "pg", kind: config.OutputPostgres})
	}, coreLoad, docs, 0)
	if err != nil {
		return nil, nil, err
	}
	table, _, err := st.PostgresTables("bench", "pg")
	if err != nil {
		coreClose(ctx, st)
		return nil, nil, err
	}
	return st, table, nil
}

// cloudInProcess moves a backlog of docs into PostgreSQL with the local
// runtime in this process, SQS being the emulator's or the stand-in.
func cloudInProcess(ctx context.Context, cw *cloudAWS, pool *pgxpool.Pool, docs int, standIn bool) (cloudRun, error) {
	var res cloudRun
	st, table, err := cloudBacklogStack(ctx, "cb", docs)
	if err != nil {
		return res, err
	}
	defer coreClose(ctx, st)
	if standIn {
		emulator := st.Deps.SQS
		st.Deps.SQS = cw.standInSQS(st.Deps.AWS)
		defer func() { st.Deps.SQS = emulator }()
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rt := &localrun.Runtime{Deps: st.Deps, Log: log, Opts: localrun.Options{UntilIdle: true}}
	rctx, cancel := context.WithTimeout(ctx, cloudBacklogWait)
	defer cancel()
	cw.resetRequests()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- rt.Run(rctx) }()
	rows, err := cloudWaitRows(rctx, pool, table, docs, done)
	if err != nil {
		return res, fmt.Errorf("%w (runtime: %+v)", err, rt.Summary())
	}
	res.rows = rows.Sub(start)
	if err := <-done; err != nil {
		return res, fmt.Errorf("runtime: %w", err)
	}
	res.idle = time.Since(start)
	res.counts = cw.requests()
	res.sum = rt.Summary()
	return res, nil
}

// cloudCLI moves a backlog of docs into PostgreSQL with `changesctl run
// --until-idle` as a process of its own, its environment env.
func cloudCLI(ctx context.Context, pool *pgxpool.Pool, bin string, docs int, env []string) (cloudRun, error) {
	var res cloudRun
	st, table, err := cloudBacklogStack(ctx, "cc", docs)
	if err != nil {
		return res, err
	}
	defer coreClose(ctx, st)
	rctx, cancel := context.WithTimeout(ctx, cloudBacklogWait)
	defer cancel()
	args := []string{"run", "--config", st.ConfigPath, "--until-idle", "--timeout", cloudBacklogWait.String()}
	if os.Getenv("BENCH_VERBOSE") != "" {
		args = append(args, "-v")
	}
	cmd := exec.CommandContext(rctx, bin, args...)
	cmd.Env = append(append(os.Environ(), env...), testenv.DSNEnv+"="+testenv.DSN())
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("start changesctl: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	rows, err := cloudWaitRows(rctx, pool, table, docs, done)
	if err != nil {
		return res, fmt.Errorf("%w\n%s", err, cloudTail(errOut.String(), 10))
	}
	res.rows = rows.Sub(start)
	if err := <-done; err != nil {
		return res, fmt.Errorf("changesctl run: %w\n%s", err, cloudTail(errOut.String(), 10))
	}
	res.idle = time.Since(start)
	res.summary = strings.SplitN(out.String(), "\n", 2)[0]
	if os.Getenv("BENCH_VERBOSE") != "" {
		fmt.Println(cloudTail(errOut.String(), 40))
	}
	return res, nil
}

// cloudOutcome summarises what the writer did.
func cloudOutcome(s localrun.Summary) string {
	var d, dead, retried int64
	for _, o := range s.Outputs {
		d, dead, retried = d+o.Delivered, dead+o.DeadLettered, retried+o.Retried
	}
	return fmt.Sprintf("delivered %d, dead-lettered %d, retried %d, %d invocations", d, dead, retried, s.WriterInvocations)
}

// cloudWaitRows returns when table holds want rows, or fails when done
// delivers first (the run ended) or ctx ends.
func cloudWaitRows(ctx context.Context, pool *pgxpool.Pool, table pgx.Identifier, want int, done <-chan error) (time.Time, error) {
	q := "SELECT count(*) FROM " + table.Sanitize()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	n := 0
	for {
		// The table appears when the writer first opens the output.
		if err := pool.QueryRow(ctx, q).Scan(&n); err == nil && n >= want {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%d of %d rows: %w", n, want, ctx.Err())
		case err := <-done:
			if err == nil {
				err = errors.New("ended")
			}
			return time.Time{}, fmt.Errorf("run stopped with %d of %d rows: %w", n, want, err)
		case <-t.C:
		}
	}
}

// cloudReceiveRate queues n messages on a fresh queue, then receives and
// deletes them with localrun.DefaultReceivers receivers, and returns the
// messages per second of that second part.
func cloudReceiveRate(ctx context.Context, n int) (float64, error) {
	st, err := newCloudStack(ctx, "cr", 500, cloudOutput{id: "pg", kind: config.OutputPostgres})
	if err != nil {
		return 0, err
	}
	defer coreClose(ctx, st)
	base, err := st.Deps.Poller(ctx, "bench")
	if err != nil {
		return 0, err
	}
	if _, err := cloudSendRate(ctx, base.Sender, base.Targets, n); err != nil {
		return 0, err
	}
	url := aws.String(base.Targets[0].QueueURL)
	var got atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, localrun.DefaultReceivers)
	start := time.Now()
	for range localrun.DefaultReceivers {
		wg.Go(func() {
			for got.Load() < int64(n) && ctx.Err() == nil {
				out, err := st.Deps.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
				if err != nil {
					errs <- err
					return
				}
				if len(out.Messages) == 0 {
					continue
				}
				del := make([]sqstypes.DeleteMessageBatchRequestEntry, len(out.Messages))
				for i, m := range out.Messages {
					del[i] = sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
				}
				if _, err := st.Deps.SQS.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: url, Entries: del}); err != nil {
					errs <- err
					return
				}
				got.Add(int64(len(out.Messages)))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return 0, fmt.Errorf("receive: %w", err)
	}
	return coreRate(int(got.Load()), time.Since(start)), nil
}

// cloudTail returns the last n lines of s.
func cloudTail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
