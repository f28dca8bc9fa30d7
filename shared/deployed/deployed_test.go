package deployed_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	cfntypes "github.com/aws/aws-sdk-go-v2/service/cloudformation/types"

	"github.com/changes-worker/changes-worker/shared/deployed"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// TestBucket creates small stacks through the local CloudFormation and reads
// their outputs.
func TestBucket(t *testing.T) {
	c := cloudformation.NewFromConfig(testenv.AWS(t))
	withOutput := createStack(t, c, `{"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
		"Outputs": {"BucketName": {"Value": "the-stack-bucket-1a2b3c"}, "Other": {"Value": "x"}}}`)
	withoutOutput := createStack(t, c, `{"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}}`)

	tests := []struct {
		name    string
		stack   string
		want    string
		wantErr error
	}{
		{name: "output", stack: withOutput, want: "the-stack-bucket-1a2b3c"},
		{name: "no output", stack: withoutOutput, wantErr: deployed.ErrNoOutput},
		{name: "no stack", stack: testenv.Name(t), wantErr: deployed.ErrNoStack},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := deployed.Bucket(t.Context(), c, tt.stack)
			if !errors.Is(err, tt.wantErr) || got != tt.want {
				t.Errorf("Bucket(%s) = %q, %v; want %q, %v", tt.stack, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func createStack(t *testing.T, c *cloudformation.Client, body string) string {
	t.Helper()
	ctx := t.Context()
	name := strings.ReplaceAll(testenv.Name(t), "_", "-")
	if _, err := c.CreateStack(ctx, &cloudformation.CreateStackInput{StackName: &name, TemplateBody: &body}); err != nil {
		t.Fatalf("create stack: %v", err)
	}
	t.Cleanup(func() {
		c.DeleteStack(context.WithoutCancel(ctx), &cloudformation.DeleteStackInput{StackName: &name})
	})
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := c.DescribeStacks(ctx, &cloudformation.DescribeStacksInput{StackName: &name})
		if err != nil {
			t.Fatalf("describe stack %s: %v", name, err)
		}
		st := out.Stacks[0].StackStatus
		if st == cfntypes.StackStatusCreateComplete {
			return name
		}
		if !strings.HasSuffix(string(st), "_IN_PROGRESS") || time.Now().After(deadline) {
			t.Fatalf("stack %s: %s %s", name, st, aws.ToString(out.Stacks[0].StackStatusReason))
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(300 * time.Millisecond):
		}
	}
}
