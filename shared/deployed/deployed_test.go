package deployed_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/cloudformation"

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
	name := strings.ReplaceAll(testenv.Name(t), "_", "-")
	testenv.CreateStack(t, c, name, body)
	return name
}
