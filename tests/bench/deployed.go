package main

// deployed-stack: the demo's 1,000 documents (every 4th updated, every 10th
// deleted) to three outputs (PostgreSQL, the reference HTTP receiver, S3)
// through the stack deployed to LocalStack by localstack/deploy.sh, its
// functions run on this machine (the poller invoked once through the Lambda
// API, the writer by the event source mappings), against the same load
// through the local runtime (`changesctl run --until-idle`) on a stack of
// its own. Then each function's cold starts and median invocation time from
// the REPORT lines of its log group.

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/demo/receiver"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/deployed"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

func init() {
	register("deployed-stack", deployedStack)
}

const deployedDocs = 1000

// deployedBench is one stack of the comparison with its HTTP receiver.
type deployedBench struct {
	st   *stack.Stack
	recv *receiver.Server
	srv  *httptest.Server
}

func newDeployedBench(ctx context.Context, kind string) (*deployedBench, error) {
	dir, err := os.MkdirTemp("", "bench-receiver-")
	if err != nil {
		return nil, err
	}
	recv, err := receiver.New(dir)
	if err != nil {
		return nil, err
	}
	srv := httptest.NewServer(recv)
	cfg := &config.File{
		// The demo's timeouts (localstack/jobs.json).
		Stack: config.Stack{PollerTimeout: config.Duration(90 * time.Second), WriterTimeout: config.Duration(30 * time.Second), LogRetentionDays: 1},
		Jobs: []*config.Job{{
			ID:       "orders",
			Schedule: config.Duration(time.Minute),
			Feed:     config.Feed{Limit: 500, Timeout: config.Duration(10 * time.Second)},
			Lease:    config.Lease{TTL: config.Duration(10 * time.Second)},
			Outputs: []*config.Output{
				{ID: "pg", Type: config.OutputPostgres, Postgres: &config.PostgresOutput{CreateTables: true}},
				{ID: "rest", Type: config.OutputHTTP, HTTP: &config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}", Timeout: config.Duration(5 * time.Second)}},
				{ID: "archive", Type: config.OutputS3, S3: &config.S3Output{Prefix: "archive/"}},
			},
		}},
	}
	st, err := stack.New(ctx, stack.Options{Name: "bench-" + kind, Config: cfg})
	if err != nil {
		srv.Close()
		return nil, err
	}
	if _, err := sample.Load(ctx, coreSourceClient, st.SourceURL, sample.Options{Docs: deployedDocs, UpdateEvery: 4, DeleteEvery: 10}); err != nil {
		coreClose(ctx, st)
		srv.Close()
		return nil, fmt.Errorf("load source db: %w", err)
	}
	return &deployedBench{st: st, recv: recv, srv: srv}, nil
}

func (b *deployedBench) close(ctx context.Context) {
	coreClose(ctx, b.st)
	b.srv.Close()
	os.RemoveAll(b.recv.Dir)
}

// complete reports whether all three outputs hold every live document of
// the source: PostgreSQL at the winning revisions, the receiver and S3 by
// count.
func (b *deployedBench) complete(ctx context.Context) (bool, error) {
	want, err := b.st.SourceWinners(ctx)
	if err != nil {
		return false, err
	}
	pg, err := b.st.Revs(ctx, "orders", "pg")
	if err != nil || len(pg) != len(want) {
		return false, nil // the table may not exist yet
	}
	for id, rev := range want {
		if pg[id] != rev {
			return false, nil
		}
	}
	docs, err := b.recv.Docs()
	if err != nil || len(docs) != len(want) {
		return false, err
	}
	archive, err := b.st.Revs(ctx, "orders", "archive")
	if err != nil {
		return false, err
	}
	return len(archive) == len(want), nil
}

func deployedStack(ctx context.Context, r *results) error {
	local, err := newDeployedBench(ctx, "run")
	if err != nil {
		return err
	}
	defer local.close(ctx)
	start := time.Now()
	sum, err := local.st.RunUntilIdle(ctx, localrun.Options{})
	if err != nil {
		return fmt.Errorf("changesctl run: %w", err)
	}
	ran := time.Since(start)
	if ok, err := local.complete(ctx); !ok || err != nil {
		return fmt.Errorf("changesctl run left the outputs incomplete (%v): %+v", err, sum)
	}
	r.add("run_seconds", ran.Seconds(), fmt.Sprintf("changesctl run --until-idle: %d documents to pg, rest and archive", deployedDocs))

	dep, err := newDeployedBench(ctx, "deployed")
	if err != nil {
		return err
	}
	defer dep.close(ctx)
	prefix := dep.st.Config.Stack.Prefix
	cfn := cloudformation.NewFromConfig(dep.st.Deps.AWS)
	defer func() {
		if _, err := cfn.DeleteStack(context.WithoutCancel(ctx), &cloudformation.DeleteStackInput{StackName: &prefix}); err != nil {
			fmt.Printf("  cleanup: delete stack %s: %v\n", prefix, err)
		}
	}()
	deployTook, err := deployedDeploy(ctx, dep.st)
	if err != nil {
		return err
	}
	r.add("deploy_seconds", deployTook.Seconds(), "localstack/deploy.sh: build, cdklocal deploy, secrets, functions Active")
	bucket, err := deployed.Bucket(ctx, cfn, prefix)
	if err != nil {
		return err
	}
	// The functions write to the stack's bucket; the stack created its own.
	if _, err := dep.st.Deps.S3.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: &dep.st.Config.Stack.Bucket}); err != nil {
		return err
	}
	pipeline.OverrideBucket(dep.st.Config, bucket)

	// The poller runs for its whole budget; the outputs are complete before it returns.
	fn := prefix + "-orders-poller"
	invoked := make(chan error, 1)
	lc := lambda.NewFromConfig(dep.st.Deps.AWS)
	start = time.Now()
	go func() {
		out, err := lc.Invoke(ctx, &lambda.InvokeInput{FunctionName: &fn, Payload: []byte(`{"job":"orders"}`)},
			func(o *lambda.Options) { o.RetryMaxAttempts = 1 })
		if err == nil && out.FunctionError != nil {
			err = fmt.Errorf("poller: %s: %s", aws.ToString(out.FunctionError), out.Payload)
		}
		invoked <- err
	}()
	err = testenv.Poll(ctx, 5*time.Minute, 250*time.Millisecond, dep.complete)
	took := time.Since(start)
	if err != nil {
		return fmt.Errorf("deployed stack: outputs incomplete: %w", err)
	}
	r.add("deployed_seconds", took.Seconds(), fmt.Sprintf("deployed stack, from the poller's Invoke until all three outputs were complete (%.1fx changesctl run)", took.Seconds()/ran.Seconds()))
	if err := <-invoked; err != nil {
		return err
	}
	return deployedReports(ctx, r, dep.st, prefix)
}

// deployedDeploy deploys st's configuration with localstack/deploy.sh, the
// schedule rules left disabled, and returns how long it took.
func deployedDeploy(ctx context.Context, st *stack.Stack) (time.Duration, error) {
	tmp, err := os.MkdirTemp("", "bench-deploy-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	ctl := filepath.Join(tmp, "changesctl")
	if b, err := exec.CommandContext(ctx, "go", "build", "-o", ctl, "./cmd/changesctl").CombinedOutput(); err != nil {
		return 0, fmt.Errorf("build changesctl: %w\n%s", err, b)
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, "bash", "localstack/deploy.sh", ctl, st.ConfigPath)
	// A cloud assembly of its own, so that deploys run side by side.
	cmd.Env = append(os.Environ(), "SCHEDULES=disabled", "BUILD_DIR="+filepath.Join(tmp, "build"), "CDK_OUT="+filepath.Join(tmp, "cdk.out"),
		testenv.DSNEnv+"="+testenv.DSN())
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("localstack/deploy.sh: %w\n%s", err, out)
	}
	return time.Since(start), nil
}

var reportField = regexp.MustCompile(`(Init Duration|Duration): ([\d.]+) ms`)

// deployedReports adds each function's invocations, median duration and
// cold starts, read from the REPORT lines of its log group.
func deployedReports(ctx context.Context, r *results, st *stack.Stack, prefix string) error {
	logs := cloudwatchlogs.NewFromConfig(st.Deps.AWS)
	for _, fn := range []string{"poller", "writer"} {
		group := "/aws/lambda/" + prefix + "-orders-" + fn
		var durations, inits, firsts []float64
		p := cloudwatchlogs.NewFilterLogEventsPaginator(logs, &cloudwatchlogs.FilterLogEventsInput{LogGroupName: &group, FilterPattern: aws.String("REPORT")})
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				return fmt.Errorf("read %s: %w", group, err)
			}
			for _, ev := range page.Events {
				fields := map[string]float64{}
				for _, m := range reportField.FindAllStringSubmatch(aws.ToString(ev.Message), -1) {
					fields[m[1]], _ = strconv.ParseFloat(m[2], 64)
				}
				d, ok := fields["Duration"]
				if !ok {
					continue
				}
				durations = append(durations, d)
				if init, ok := fields["Init Duration"]; ok {
					inits = append(inits, init)
					firsts = append(firsts, d)
				}
			}
		}
		if len(durations) == 0 {
			return errors.New(group + ": no REPORT lines")
		}
		r.add(fn+"_invocations", len(durations), "")
		r.add(fn+"_median_ms", median(durations), "median Duration of the REPORT lines")
		r.add(fn+"_cold_starts", coreJoin(firsts, "%.0f"), fmt.Sprintf("Duration of each environment's first invocation, ms (RIE's Init Duration, which ends before the runtime's own start, was %s ms)", coreJoin(inits, "%.2f")))
	}
	return nil
}
