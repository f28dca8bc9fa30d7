package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	cfntypes "github.com/aws/aws-sdk-go-v2/service/cloudformation/types"
)

// CreateStack creates the CloudFormation stack name from the template body,
// waits up to a minute for it to be CREATE_COMPLETE, failing the test when
// it settles otherwise, and deletes it when the test ends.
func CreateStack(t testing.TB, c *cloudformation.Client, name, body string) {
	t.Helper()
	ctx := t.Context()
	if _, err := c.CreateStack(ctx, &cloudformation.CreateStackInput{StackName: &name, TemplateBody: &body}); err != nil {
		t.Fatalf("create stack %s: %v", name, err)
	}
	t.Cleanup(func() { c.DeleteStack(context.WithoutCancel(ctx), &cloudformation.DeleteStackInput{StackName: &name}) })
	var last cfntypes.Stack
	err := Poll(ctx, time.Minute, 300*time.Millisecond, func(ctx context.Context) (bool, error) {
		out, err := c.DescribeStacks(ctx, &cloudformation.DescribeStacksInput{StackName: &name})
		if err != nil {
			return false, fmt.Errorf("describe stack: %w", err)
		}
		last = out.Stacks[0]
		if last.StackStatus == cfntypes.StackStatusCreateComplete {
			return true, nil
		}
		if !strings.HasSuffix(string(last.StackStatus), "_IN_PROGRESS") {
			return false, fmt.Errorf("%s %s", last.StackStatus, aws.ToString(last.StackStatusReason))
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("stack %s (last status %s): %v", name, last.StackStatus, err)
	}
}
