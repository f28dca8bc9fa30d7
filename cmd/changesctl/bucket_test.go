package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/cloudformation"

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
