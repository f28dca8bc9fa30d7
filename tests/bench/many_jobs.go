package main

// many-jobs: -many-jobs jobs (20) of -many-docs documents each (1,000, the
// demo's data: every 4th updated, every 10th deleted), each job reading a
// source database of its own into a PostgreSQL output and an S3 output, all
// in one configuration and started at once: one state table, one bucket,
// every job's queues. This file runs them on the workbench (`changesctl run`
// in process: the jobs' schedule, 1m, and poller timeout, 2m15s, as deployed);
// many_jobs_deployed.go through the stack deployed to LocalStack.
//
// A job is idle once its work queues hold nothing, visible or in flight,
// and its outputs hold every live document of its source (PostgreSQL at
// the winning revisions, S3 by count); its time to idle runs from the start
// of the run. Once every job is idle the run goes on for -many-idle (2m),
// and then every output must hold exactly the source's winning revisions.
//
// The state table's requests are counted where they are made: on the
// workbench by the pipeline's HTTP client (every request to DynamoDB, by
// operation), on the deployed stack by the functions' request record
// (CHANGES_AWS_CALLS, one line per SDK operation). Per job per minute, while
// the jobs catch up (from the start until the last is idle) and while they
// are idle (the lease renewals of the active pollers, the standbys of the
// next schedule tick).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"golang.org/x/sync/errgroup"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver/pgsink"
	"github.com/changes-worker/changes-worker/shared/deliver/s3sink"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
	"github.com/changes-worker/changes-worker/tests/faults"
)

func init() {
	register("many-jobs", manyJobs)
}

var (
	manyJobsFlag = flag.Int("many-jobs", 20, "the many-jobs benchmarks' number of jobs")
	manyDocsFlag = flag.Int("many-docs", 1000, "the many-jobs benchmarks' documents per job")
	manyIdleFlag = flag.Duration("many-idle", 2*time.Minute, "how long the many-jobs benchmarks count the state table's requests once every job is idle")
)

// manyJobsRows are the benchmarks page's rows of many-jobs and
// many-jobs-deployed.
var manyJobsRows = []figureRow{
	{bench: "many-jobs", what: "20 jobs of 1,000 documents each to PostgreSQL and S3, started at once through `changesctl run`: aggregate rate; each job's time to idle, median / slowest (slowest ÷ median); the outputs checked",
		goal: "every output exact", value: manyIdleValue},
	{bench: "many-jobs", what: "the same: the state table's requests per job per minute, while catching up; idle (lease renewals, standbys)",
		value: manyTableValue},
	{bench: "many-jobs-deployed", what: "the same 20 jobs through the stack deployed to LocalStack, every poller invoked at once and each minute: aggregate rate; time to idle, median / slowest (slowest ÷ median); the outputs checked",
		goal: "every output exact", value: manyIdleValue},
	{bench: "many-jobs-deployed", what: "the same: the state table's requests per job per minute, while catching up; idle",
		value: manyTableValue},
	{bench: "many-jobs-deployed", what: "`localstack/deploy.sh` of the 20 jobs: build, deploy, secrets, functions `Active`; the cloud assembly",
		value: func(f *figureReader) string {
			return f.num("deploy seconds", 0) + " s; " + f.num("cloud assembly MB", 0) + " MB"
		}},
}

func manyIdleValue(f *figureReader) string {
	return f.num("aggregate docs/s", 0) + " docs/s; " + f.num("time to idle median s", 1) + " / " + f.num("time to idle slowest s", 1) +
		" s (" + f.num("slowest / median", 2) + "×); " + f.num("outputs exact", 0) + " outputs, every one exact"
}

func manyTableValue(f *figureReader) string {
	return f.num("state table requests per job per minute, catching up", 1) + "; " + f.num("state table requests per job per minute, idle", 1)
}

// manyIdleWithin bounds a run's wait for every job to be idle.
const manyIdleWithin = 20 * time.Minute

// manyOutputs are the outputs of every job.
var manyOutputs = []string{"pg", "archive"}

// manyJob is one job of the fleet.
type manyJob struct {
	id   string
	db   string            // its source database
	want map[string]string // doc id → winning revision of every live document
	idle time.Duration     // from the start until idle; zero until then
	// queues are its outputs' work queue URLs, resolved on first use.
	queues []string
	// busy is, by output, when its work queue was last seen holding
	// messages, from the start.
	busy map[string]time.Duration
}

// manyFleet is the jobs on one stack.
type manyFleet struct {
	st   *stack.Stack
	jobs []*manyJob
	hc   *http.Client
}

// newManyFleet provisions a stack of n jobs named after kind, each with a
// source database of its own loaded with docs documents, its PostgreSQL
// table and its S3 prefix. httpClient, when set, wraps the pipeline's AWS
// HTTP client.
func newManyFleet(ctx context.Context, kind string, n, docs int, httpClient func(aws.HTTPClient) aws.HTTPClient) (*manyFleet, error) {
	testenv.SetAWSEnv()
	base := testenv.UniqueName(kind)
	ident := strings.ReplaceAll(base, "-", "_")
	f := &manyFleet{hc: coreSourceClient}
	cfg := &config.File{}
	for i := range n {
		j := &manyJob{id: fmt.Sprintf("j%02d", i+1)}
		j.db = testenv.CouchBaseURL() + "/" + base + "-" + j.id
		f.jobs = append(f.jobs, j)
		cfg.Jobs = append(cfg.Jobs, &config.Job{
			ID:     j.id,
			Source: config.Source{Type: config.SourceCouchDB, URL: j.db},
			Outputs: []*config.Output{
				{ID: manyOutputs[0], Type: config.OutputPostgres, Postgres: &config.PostgresOutput{Table: ident + "_" + j.id, CreateTables: true}},
				{ID: manyOutputs[1], Type: config.OutputS3, S3: &config.S3Output{Prefix: j.id + "/"}},
			},
		})
	}
	// The databases exist before the stack, whose Close does not remove
	// them: f.close does.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for i, j := range f.jobs {
		g.Go(func() error {
			if err := sample.CreateDB(gctx, f.hc, j.db); err != nil {
				return fmt.Errorf("create source database %s (start the local services with `make up`): %w", j.db, err)
			}
			final, err := sample.Load(gctx, f.hc, j.db, sample.Options{Docs: docs, UpdateEvery: 4, DeleteEvery: 10, Seed: uint64(i + 1)})
			if err != nil {
				return fmt.Errorf("load source database %s: %w", j.db, err)
			}
			j.want = map[string]string{}
			for id, d := range final {
				if !d.Deleted {
					j.want[id] = d.Rev
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		f.close(ctx)
		return nil, err
	}
	st, err := stack.New(ctx, stack.Options{Name: "bench-" + kind, Config: cfg, LogLevel: slog.LevelWarn, HTTPClient: httpClient})
	if err != nil {
		f.close(ctx)
		return nil, err
	}
	f.st = st
	return f, nil
}

// close removes the jobs' tables and source databases and closes the
// stack, printing what it could not remove.
func (f *manyFleet) close(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if f.st != nil {
		for _, j := range f.jobs {
			_, o, err := f.st.Output(j.id, manyOutputs[0])
			if err != nil {
				continue
			}
			pool, err := f.st.Deps.Pool(ctx, o.Postgres)
			if err != nil {
				fmt.Printf("  cleanup: %v\n", err)
				break
			}
			data, versions, err := pgsink.Tables(*o.Postgres, o.ID)
			if err == nil {
				coreDropTables(ctx, pool, data, versions)
			}
		}
		coreClose(ctx, f.st)
	}
	for _, j := range f.jobs {
		if err := sample.DeleteDB(ctx, f.hc, j.db); err != nil {
			fmt.Printf("  cleanup: delete %s: %v\n", j.db, err)
		}
	}
}

// docs is the number of documents the fleet's sources hold, deleted ones
// included: the changes its jobs read.
func (f *manyFleet) docs() int { return len(f.jobs) * *manyDocsFlag }

// waitIdle waits until every job is idle, recording each one's time to
// idle from start, for at most within.
func (f *manyFleet) waitIdle(ctx context.Context, start time.Time, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		var busy []string
		for _, j := range f.jobs {
			if j.idle > 0 {
				continue
			}
			ok, err := f.idle(ctx, j, start)
			if err != nil {
				return fmt.Errorf("job %s: %w", j.id, err)
			}
			if ok {
				j.idle = time.Since(start)
				continue
			}
			busy = append(busy, j.id)
		}
		if len(busy) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("jobs %s not idle after %s: %w", strings.Join(busy, ", "), within, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// idle reports whether job j is idle: its work queues hold nothing, its
// PostgreSQL output holds its source's live documents at their winning
// revisions, and its S3 output as many documents. It records when each
// work queue is seen holding messages (j.busy).
func (f *manyFleet) idle(ctx context.Context, j *manyJob, start time.Time) (bool, error) {
	if j.queues == nil {
		j.busy = map[string]time.Duration{}
		for _, out := range manyOutputs {
			q, err := f.st.Queues(ctx, j.id, out)
			if err != nil {
				return false, err
			}
			j.queues = append(j.queues, q.WorkURL)
		}
	}
	drained := true
	for i, u := range j.queues {
		a, err := f.st.Deps.SQS.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &u,
			AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages,
				sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible, sqstypes.QueueAttributeNameApproximateNumberOfMessagesDelayed}})
		if err != nil {
			return false, fmt.Errorf("depth of %s: %w", u, err)
		}
		for _, v := range a.Attributes {
			if v != "0" {
				j.busy[manyOutputs[i]] = time.Since(start)
				drained = false
				break
			}
		}
	}
	if !drained {
		return false, nil
	}
	pg, err := f.st.Revs(ctx, j.id, manyOutputs[0])
	if err != nil {
		return false, nil // the writer creates the tables as it starts
	}
	if !maps.Equal(pg, j.want) {
		return false, nil
	}
	n, err := f.s3Count(ctx, j)
	return n == len(j.want), err
}

// s3Count counts the documents job j's S3 output holds, by listing.
func (f *manyFleet) s3Count(ctx context.Context, j *manyJob) (int, error) {
	_, o, err := f.st.Output(j.id, manyOutputs[1])
	if err != nil {
		return 0, err
	}
	n := 0
	p := s3.NewListObjectsV2Paginator(f.st.Deps.S3, &s3.ListObjectsV2Input{Bucket: &o.S3.Bucket, Prefix: &o.S3.Prefix})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return 0, fmt.Errorf("list s3://%s/%s: %w", o.S3.Bucket, o.S3.Prefix, err)
		}
		for _, obj := range page.Contents {
			if !strings.HasPrefix(aws.ToString(obj.Key), o.S3.Prefix+s3sink.TombstoneDir) {
				n++
			}
		}
	}
	return n, nil
}

// checkExact requires every output of every job to hold exactly its
// source's live documents at their winning revisions, as the output's
// state reader reads it; it returns the number of outputs checked.
func (f *manyFleet) checkExact(ctx context.Context) (int, error) {
	var errs []error
	n := 0
	for _, j := range f.jobs {
		for _, out := range manyOutputs {
			got, err := f.st.Revs(ctx, j.id, out)
			if err != nil {
				errs = append(errs, fmt.Errorf("job %s output %s: %w", j.id, out, err))
				continue
			}
			n++
			if d := revsDiff(got, j.want); d != "" {
				errs = append(errs, fmt.Errorf("job %s output %s: %s", j.id, out, d))
			}
		}
	}
	return n, errors.Join(errs...)
}

// revsDiff describes how got differs from want, "" when it does not.
func revsDiff(got, want map[string]string) string {
	var missing, stale, extra []string
	for id, rev := range want {
		switch g, ok := got[id]; {
		case !ok:
			missing = append(missing, id)
		case g != rev:
			stale = append(stale, id)
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			extra = append(extra, id)
		}
	}
	if len(missing)+len(stale)+len(extra) == 0 {
		return ""
	}
	example := func(ids []string) string {
		if len(ids) == 0 {
			return ""
		}
		slices.Sort(ids)
		return " (" + ids[0] + ")"
	}
	return fmt.Sprintf("%d of %d documents missing%s, %d at another revision%s, %d deleted or unknown in the source%s",
		len(missing), len(want), example(missing), len(stale), example(stale), len(extra), example(extra))
}

// addIdleTimes records the aggregate rate and the jobs' times to idle.
func (f *manyFleet) addIdleTimes(r *results, where string) {
	var times []float64
	for _, j := range f.jobs {
		times = append(times, j.idle.Seconds())
	}
	slices.Sort(times)
	slowest, med := times[len(times)-1], median(slices.Clone(times))
	r.add("jobs", len(f.jobs), fmt.Sprintf("%d documents each (every 4th updated, every 10th deleted), to %s; %s", *manyDocsFlag, strings.Join(manyOutputs, " and "), where))
	r.add("aggregate docs/s", float64(f.docs())/slowest, "every job's documents over the time until the last job was idle")
	r.add("time to idle median s", med, "")
	r.add("time to idle slowest s", slowest, "")
	r.add("time to idle fastest s", times[0], "")
	r.add("slowest / median", slowest/med, "each job's time to idle, s: "+coreJoin(times, "%.1f"))
	for _, out := range manyOutputs {
		var last []float64
		for _, j := range f.jobs {
			last = append(last, j.busy[out].Seconds())
		}
		r.add("work queue last held messages, median s, "+out, median(last), "what paced the jobs: when each job's "+out+" queue was last seen holding messages")
	}
}

// addTableRequests records the state table's requests per job per minute
// in one window of the run.
func (f *manyFleet) addTableRequests(r *results, window string, counts map[string]int64, d time.Duration, how string) {
	var total int64
	for _, n := range counts {
		total += n
	}
	perJobMinute := float64(total) / float64(len(f.jobs)) / d.Minutes()
	keys := slices.Sorted(maps.Keys(counts))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.1f", k, float64(counts[k])/float64(len(f.jobs))/d.Minutes()))
	}
	r.add("state table requests per job per minute, "+window, perJobMinute,
		fmt.Sprintf("%d requests over %.0f s, %s; per job per minute: %s", total, d.Seconds(), how, strings.Join(parts, ", ")))
	r.add("state table requests per second, "+window, float64(total)/d.Seconds(), "the whole table")
}

// tableCounter counts the requests to DynamoDB that pass through it, by
// operation. Safe for concurrent use.
type tableCounter struct {
	next   aws.HTTPClient
	mu     sync.Mutex
	counts map[string]int64
}

func (c *tableCounter) Do(req *http.Request) (*http.Response, error) {
	if a := faults.Action(req); strings.HasPrefix(a, "DynamoDB.") {
		c.mu.Lock()
		c.counts[strings.TrimPrefix(a, "DynamoDB.")]++
		c.mu.Unlock()
	}
	return c.next.Do(req)
}

// take returns the counts so far and starts again from none.
func (c *tableCounter) take() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.counts
	c.counts = map[string]int64{}
	return out
}

func manyJobs(ctx context.Context, r *results) error {
	counter := &tableCounter{counts: map[string]int64{}}
	f, err := newManyFleet(ctx, "mj", *manyJobsFlag, *manyDocsFlag, func(next aws.HTTPClient) aws.HTTPClient {
		counter.next = next
		return counter
	})
	if err != nil {
		return err
	}
	defer f.close(ctx)
	// What `changesctl run` logs by default would fill the output: warnings only.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rt := &localrun.Runtime{Deps: f.st.Deps, Log: log}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	counter.take()
	start := time.Now()
	go func() { done <- rt.Run(rctx) }()
	idle := make(chan error, 1)
	go func() { idle <- f.waitIdle(rctx, start, manyIdleWithin) }()
	select {
	case err := <-done:
		return fmt.Errorf("changesctl run ended before the jobs were idle: %v", err)
	case err := <-idle:
		if err != nil {
			return err
		}
	}
	catchUp := time.Since(start)
	busy := counter.take()
	load := loadAverage()
	select {
	case err := <-done:
		return fmt.Errorf("changesctl run ended while the jobs were idle: %v", err)
	case <-time.After(*manyIdleFlag):
	}
	quiet := counter.take()
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("changesctl run: %w", err)
	}
	exact, err := f.checkExact(ctx)
	if err != nil {
		return fmt.Errorf("outputs not exact: %w", err)
	}
	f.addIdleTimes(r, "`changesctl run` in process, the jobs' schedule (1m) and poller timeout (2m15s)")
	r.add("outputs exact", exact, "every output of every job at its source's winning revisions once idle")
	how := "counted by the pipeline's HTTP client, every request to DynamoDB"
	f.addTableRequests(r, "catching up", busy, catchUp, how)
	f.addTableRequests(r, "idle", quiet, *manyIdleFlag, how)
	r.add("load average when the last job was idle", load, "")
	return nil
}
