package main

// many-jobs-deployed: the jobs of many-jobs (many_jobs.go) through the
// stack deployed to LocalStack by localstack/deploy.sh, its functions run
// on this machine (localstack/lambdahost). The schedule rules stay
// disabled: the benchmark starts every job's poller at once with an
// asynchronous Invoke, as EventBridge does, and again every minute, the
// jobs' schedule, so that each invocation (its timeout, 2m15s) overlaps
// the next ones as on AWS. The functions record their AWS requests
// (CHANGES_AWS_CALLS); the state table's are those to DynamoDB.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	lambdatypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deployed"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

func init() {
	register("many-jobs-deployed", manyJobsDeployed)
}

func manyJobsDeployed(ctx context.Context, r *results) error {
	f, err := newManyFleet(ctx, "mjd", *manyJobsFlag, *manyDocsFlag, nil)
	if err != nil {
		return err
	}
	defer f.close(ctx)
	tmp, err := os.MkdirTemp("", "bench-many-jobs-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	calls := filepath.Join(tmp, "aws-calls.jsonl")
	assembly := filepath.Join(tmp, "cdk.out")
	prefix := f.st.Config.Stack.Prefix
	cfn := cloudformation.NewFromConfig(f.st.Deps.AWS)
	defer func() {
		// The functions go with the stack: wait, so that none is left
		// running on the shared emulator.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
		defer cancel()
		if _, err := cfn.DeleteStack(dctx, &cloudformation.DeleteStackInput{StackName: &prefix}); err != nil {
			fmt.Printf("  cleanup: delete stack %s: %v\n", prefix, err)
			return
		}
		w := cloudformation.NewStackDeleteCompleteWaiter(cfn)
		if err := w.Wait(dctx, &cloudformation.DescribeStacksInput{StackName: &prefix}, 10*time.Minute); err != nil {
			fmt.Printf("  cleanup: delete stack %s: %v\n", prefix, err)
		}
	}()
	deployStart := time.Now()
	err = testenv.DeployLocal(ctx, testenv.LocalDeploy{ConfigPath: f.st.ConfigPath, BuildDir: filepath.Join(tmp, "build"),
		AssemblyDir: assembly, Env: []string{testenv.DSNEnv + "=" + testenv.DSN()}, AWSCalls: calls})
	if err != nil {
		return err
	}
	deployTook := time.Since(deployStart)
	assemblyBytes, err := treeSize(assembly)
	if err != nil {
		return err
	}
	bucket, err := deployed.Bucket(ctx, cfn, prefix)
	if err != nil {
		return err
	}
	// The functions write to the stack's bucket; the stack created its own.
	if _, err := f.st.Deps.S3.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: &f.st.Config.Stack.Bucket}); err != nil {
		return err
	}
	pipeline.OverrideBucket(f.st.Config, bucket)

	lc := lambda.NewFromConfig(f.st.Deps.AWS)
	before, err := tableCalls(calls)
	if err != nil {
		return err
	}
	start := time.Now()
	tctx, stopTicks := context.WithCancel(ctx)
	defer stopTicks()
	ticks := make(chan error, 1)
	go func() { ticks <- f.tick(tctx, lc, config.DefaultSchedule) }()
	idle := make(chan error, 1)
	go func() { idle <- f.waitIdle(tctx, start, manyIdleWithin) }()
	select {
	case err := <-ticks:
		return err
	case err := <-idle:
		if err != nil {
			return err
		}
	}
	catchUp := time.Since(start)
	atIdle, err := tableCalls(calls)
	if err != nil {
		return err
	}
	load := loadAverage()
	select {
	case err := <-ticks:
		return err
	case <-time.After(*manyIdleFlag):
	}
	atEnd, err := tableCalls(calls)
	if err != nil {
		return err
	}
	stopTicks()
	exact, err := f.checkExact(ctx)
	if err != nil {
		return fmt.Errorf("outputs not exact: %w", err)
	}
	f.addIdleTimes(r, "the stack deployed to LocalStack, every poller invoked at once and each minute")
	r.add("outputs exact", exact, "every output of every job at its source's winning revisions once idle")
	how := "recorded by the functions (CHANGES_AWS_CALLS), every DynamoDB operation"
	f.addTableRequests(r, "catching up", subtract(atIdle, before), catchUp, how)
	f.addTableRequests(r, "idle", subtract(atEnd, atIdle), *manyIdleFlag, how)
	r.add("load average when the last job was idle", load, "")
	r.add("deploy seconds", deployTook.Seconds(), fmt.Sprintf("localstack/deploy.sh of the %d jobs: build, cdklocal deploy, secrets, functions Active", len(f.jobs)))
	r.add("cloud assembly MB", float64(assemblyBytes)/1e6, "what the deploy's synth wrote")
	return nil
}

// tick invokes every job's poller at once, asynchronously as EventBridge
// does, and again every period, until ctx ends.
func (f *manyFleet) tick(ctx context.Context, lc *lambda.Client, period time.Duration) error {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		for _, j := range f.jobs {
			fn := f.st.Config.FunctionName(f.st.Config.Job(j.id), config.FunctionPoller)
			_, err := lc.Invoke(ctx, &lambda.InvokeInput{FunctionName: &fn, InvocationType: lambdatypes.InvocationTypeEvent,
				Payload: fmt.Appendf(nil, `{"job":%q}`, j.id)})
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("invoke %s: %w", fn, err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// tableCalls counts the DynamoDB operations recorded in path by operation.
// The functions append to it as it is read: a last line not yet complete
// is left for the next read.
func tableCalls(path string) (map[string]int64, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return map[string]int64{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read recorded calls: %w", err)
	}
	counts := map[string]int64{}
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[:i]
	} else {
		b = nil
	}
	for n, line := range bytes.Split(b, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var c awsconf.Call
		if err := json.Unmarshal(line, &c); err != nil {
			return nil, fmt.Errorf("read recorded calls: %s line %d: %w", path, n+1, err)
		}
		if c.Service == "DynamoDB" {
			counts[c.Operation]++
		}
	}
	return counts, nil
}

// subtract returns a less b, by key.
func subtract(a, b map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range a {
		if d := v - b[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// treeSize is the size in bytes of the files under dir.
func treeSize(dir string) (int64, error) {
	var size int64
	err := filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		size += info.Size()
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", dir, err)
	}
	return size, nil
}
