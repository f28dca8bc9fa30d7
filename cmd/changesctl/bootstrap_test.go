package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"
)

// TestBootstrapRemove: bootstrap --remove deletes the table and the queues
// bootstrap made (a stack of the same prefix can then be deployed), and a
// second run finds nothing to delete.
func TestBootstrapRemove(t *testing.T) {
	ctx, s := parallelStack(t, outPG, outPGFIFO)
	s.mustCLI(ctx, "bootstrap")
	cfg := s.Config
	j := cfg.Jobs[0]
	var want []string
	want = append(want, "removed "+cfg.TableName())
	for _, o := range j.Outputs {
		want = append(want, "removed "+cfg.QueueName(j, o), "removed "+cfg.DLQName(j, o))
	}
	got := strings.Split(strings.TrimSpace(s.mustCLI(ctx, "bootstrap", "--remove")), "\n")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("bootstrap --remove (-want +got):\n%s", diff)
	}
	if out := s.mustCLI(ctx, "bootstrap", "--remove"); out != "" {
		t.Errorf("second bootstrap --remove printed %q, want nothing", out)
	}
	_, err := s.Deps.DynamoDB.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(cfg.TableName())})
	var noTable *ddbtypes.ResourceNotFoundException
	if !errors.As(err, &noTable) {
		t.Errorf("describe table %s after --remove: %v, want ResourceNotFoundException", cfg.TableName(), err)
	}
	for _, o := range j.Outputs {
		_, err := s.Deps.SQS.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(cfg.QueueName(j, o))})
		var noQueue *sqstypes.QueueDoesNotExist
		if !errors.As(err, &noQueue) {
			t.Errorf("queue %s after --remove: %v, want QueueDoesNotExist", cfg.QueueName(j, o), err)
		}
	}
}
