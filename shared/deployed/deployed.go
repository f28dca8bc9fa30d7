// Package deployed reads what a deployed stack says about itself: the
// outputs of the CloudFormation stack the CDK app names after stack.prefix.
// The local runtime and the operator's tools use it to find resources whose
// names the stack generates, such as its bucket.
package deployed

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	cfntypes "github.com/aws/aws-sdk-go-v2/service/cloudformation/types"
	"github.com/aws/smithy-go"
)

// OutputBucket is the stack output holding the name of the stack's bucket
// (claim checks and S3 outputs without a bucket of their own).
const OutputBucket = "BucketName"

// CloudFormation is the part of the CloudFormation client this package calls.
type CloudFormation interface {
	DescribeStacks(ctx context.Context, in *cloudformation.DescribeStacksInput, optFns ...func(*cloudformation.Options)) (*cloudformation.DescribeStacksOutput, error)
}

var (
	// ErrNoStack: no stack of that name exists (or it was deleted, or its
	// creation failed and was rolled back).
	ErrNoStack = errors.New("no deployed stack")
	// ErrNoOutput: the stack exists but does not have the output.
	ErrNoOutput = errors.New("stack has no such output")
)

// Output returns the value of the output key of the stack named stack.
func Output(ctx context.Context, c CloudFormation, stack, key string) (string, error) {
	out, err := c.DescribeStacks(ctx, &cloudformation.DescribeStacksInput{StackName: &stack})
	if err != nil {
		if missingStack(err) {
			return "", fmt.Errorf("read outputs of stack %s: %w", stack, ErrNoStack)
		}
		return "", fmt.Errorf("read outputs of stack %s: %w", stack, err)
	}
	if len(out.Stacks) == 0 {
		return "", fmt.Errorf("read outputs of stack %s: %w", stack, ErrNoStack)
	}
	st := out.Stacks[0]
	switch st.StackStatus {
	case cfntypes.StackStatusDeleteComplete, cfntypes.StackStatusRollbackComplete, cfntypes.StackStatusReviewInProgress:
		return "", fmt.Errorf("read outputs of stack %s: %w (status %s)", stack, ErrNoStack, st.StackStatus)
	}
	for _, o := range st.Outputs {
		if aws.ToString(o.OutputKey) == key {
			return aws.ToString(o.OutputValue), nil
		}
	}
	return "", fmt.Errorf("read output %s of stack %s: %w", key, stack, ErrNoOutput)
}

// Bucket returns the bucket of the stack named stack.
func Bucket(ctx context.Context, c CloudFormation, stack string) (string, error) {
	return Output(ctx, c, stack, OutputBucket)
}

// missingStack reports whether err is CloudFormation's answer for a stack
// that does not exist: a ValidationError saying so (the API has no error
// type of its own for it).
func missingStack(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && ae.ErrorCode() == "ValidationError" && strings.Contains(ae.ErrorMessage(), "does not exist")
}
