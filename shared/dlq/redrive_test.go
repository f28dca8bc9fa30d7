package dlq

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/fanout"
)

// fakeSQS answers the calls a redrive's send makes; the others are not
// called.
type fakeSQS struct {
	SQS
	sent []sqstypes.SendMessageBatchRequestEntry
}

func (f *fakeSQS) GetQueueUrl(_ context.Context, in *sqs.GetQueueUrlInput, _ ...func(*sqs.Options)) (*sqs.GetQueueUrlOutput, error) {
	return &sqs.GetQueueUrlOutput{QueueUrl: aws.String("http://sqs/" + aws.ToString(in.QueueName))}, nil
}

func (f *fakeSQS) GetQueueAttributes(_ context.Context, in *sqs.GetQueueAttributesInput, _ ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error) {
	return &sqs.GetQueueAttributesOutput{Attributes: map[string]string{"QueueArn": "arn:" + aws.ToString(in.QueueUrl)}}, nil
}

func (f *fakeSQS) SendMessageBatch(_ context.Context, in *sqs.SendMessageBatchInput, _ ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	f.sent = append(f.sent, in.Entries...)
	out := &sqs.SendMessageBatchOutput{}
	for _, e := range in.Entries {
		out.Successful = append(out.Successful, sqstypes.SendMessageBatchResultEntry{Id: e.Id, MessageId: aws.String("w-" + aws.ToString(e.Id))})
	}
	return out, nil
}

// TestRedriveGroup: a redriven message goes back to the message group the
// poller gives the route: the output's single group on a total-order
// output, the document's on a per-document one.
func TestRedriveGroup(t *testing.T) {
	t.Parallel()
	last := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name     string
		ordering string
		msg      sqstypes.Message
		want     string
	}{
		{"total", config.OrderingTotal, failed("m-1", "doc-a", "permanent", "bad", 0, "", last), fanout.GroupID("pg")},
		{"total without an envelope", config.OrderingTotal, sqstypes.Message{MessageId: aws.String("m-2"), Body: aws.String("not json"), Attributes: map[string]string{"MessageGroupId": "doc-b"}}, fanout.GroupID("pg")},
		{"per document", config.OrderingPerDocument, failed("m-3", "doc-a", "permanent", "bad", 0, "", last), fanout.GroupID("doc-a")},
		{"per document without an envelope", config.OrderingPerDocument, sqstypes.Message{MessageId: aws.String("m-4"), Body: aws.String("not json"), Attributes: map[string]string{"MessageGroupId": "doc-b"}}, "doc-b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := &config.File{Stack: config.Stack{Prefix: "cw"}}
			j := &config.Job{ID: "orders"}
			o := &config.Output{ID: "pg", Ordering: tt.ordering}
			c := &fakeSQS{}
			q, err := Resolve(t.Context(), c, f, j, o)
			if err != nil {
				t.Fatal(err)
			}
			run := &copyRun{r: &Redriver{SQS: c, Queues: q}}
			if _, _, err := run.send(t.Context(), []Message{Decode(tt.msg)}); err != nil {
				t.Fatal(err)
			}
			if len(c.sent) != 1 {
				t.Fatalf("sent %d entries, want 1", len(c.sent))
			}
			if got := aws.ToString(c.sent[0].MessageGroupId); got != tt.want {
				t.Errorf("message group = %q, want %q", got, tt.want)
			}
		})
	}
}
