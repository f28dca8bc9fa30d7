package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/cloudformation"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// TestLoadFindsDeployedBucket: a configuration that names no bucket uses the
// bucket of the stack deployed from it (stack named after the prefix),
// unless CHANGES_BUCKET or the file names one.
func TestLoadFindsDeployedBucket(t *testing.T) {
	awsCfg := testenv.AWS(t)
	cfn := cloudformation.NewFromConfig(awsCfg)
	deployedPrefix := "cwb" + strings.ReplaceAll(testenv.Name(t), "-", "")[1:9]
	const stackBucket = "cwb-generated-bucket-4f5e6d"
	testenv.CreateStack(t, cfn, deployedPrefix, fmt.Sprintf(`{"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}, "Outputs": {"BucketName": {"Value": %q}}}`, stackBucket))

	noStack := "cwn" + strings.ReplaceAll(testenv.Name(t), "-", "")[1:9]
	tests := []struct {
		name    string
		path    string
		env     map[string]string
		want    string
		wantLog string
	}{
		{name: "deployed stack", path: writeS3Config(t, deployedPrefix, ""), want: stackBucket, wantLog: "using the deployed stack's bucket"},
		{name: "no stack", path: writeS3Config(t, noStack, ""), want: noStack + "-data"},
		{name: "bucket in the file", path: writeS3Config(t, deployedPrefix, "named-in-file"), want: "named-in-file"},
		{name: "CHANGES_BUCKET", path: writeS3Config(t, deployedPrefix, ""), env: map[string]string{"CHANGES_BUCKET": "from-env"}, want: "from-env"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			env := &cliEnv{stdout: &bytes.Buffer{}, stderr: &logs, lookup: func(k string) (string, bool) {
				if v, ok := tt.env[k]; ok {
					return v, true
				}
				if k == "CHANGES_BUCKET" {
					return "", false
				}
				return os.LookupEnv(k)
			}}
			deps, err := load(t.Context(), env, tt.path, &logs, false)
			if err != nil {
				t.Fatal(err)
			}
			defer deps.Close()
			if got := deps.Config.Stack.Bucket; got != tt.want {
				t.Errorf("stack bucket %q, want %q\nlog: %s", got, tt.want, logs.String())
			}
			if got := deps.Config.Jobs[0].Outputs[0].S3.Bucket; got != tt.want {
				t.Errorf("S3 output bucket %q, want %q (it names no bucket of its own)", got, tt.want)
			}
			if !strings.Contains(logs.String(), tt.wantLog) || (tt.wantLog == "" && strings.Contains(logs.String(), "level=WARN")) {
				t.Errorf("log %q, want %q", logs.String(), tt.wantLog)
			}
		})
	}
}

// silentCloudFormation answers no DescribeStacks: each waits for its
// context.
type silentCloudFormation struct{}

func (silentCloudFormation) DescribeStacks(ctx context.Context, _ *cloudformation.DescribeStacksInput, _ ...func(*cloudformation.Options)) (*cloudformation.DescribeStacksOutput, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestDeployedBucketLookupIsBounded: a CloudFormation that does not answer
// delays the command by the look-up's bound, then the default bucket stays
// and the warning says why.
func TestDeployedBucketLookupIsBounded(t *testing.T) {
	defer func(d time.Duration) { bucketLookupTimeout = d }(bucketLookupTimeout)
	bucketLookupTimeout = 200 * time.Millisecond
	cfg := &config.File{Stack: config.Stack{Prefix: "cws", Bucket: "cws-data"}}
	var logs bytes.Buffer
	start := time.Now()
	useDeployedBucket(t.Context(), cfg, silentCloudFormation{}, slog.New(slog.NewTextHandler(&logs, nil)))
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the look-up took %s, want about %s", took, bucketLookupTimeout)
	}
	if cfg.Stack.Bucket != "cws-data" {
		t.Errorf("bucket %q, want the default cws-data", cfg.Stack.Bucket)
	}
	if !strings.Contains(logs.String(), "cannot read the deployed stack's bucket; using the default") || !strings.Contains(logs.String(), "deadline exceeded") {
		t.Errorf("log does not warn of the look-up's timeout:\n%s", logs.String())
	}
}
