package writer

import (
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestEvent(t *testing.T) {
	t.Parallel()
	msgs := []sqstypes.Message{
		{
			MessageId: aws.String("m1"), ReceiptHandle: aws.String("rh1"), Body: aws.String(`{"v":1}`), MD5OfBody: aws.String("md5"),
			Attributes: map[string]string{"ApproximateReceiveCount": "2"},
			MessageAttributes: map[string]sqstypes.MessageAttributeValue{
				"failure_attempts": {DataType: aws.String("Number"), StringValue: aws.String("3")},
				"blob":             {DataType: aws.String("Binary"), BinaryValue: []byte{1, 2}},
			},
		},
		{MessageId: aws.String("m2"), ReceiptHandle: aws.String("rh2"), Body: aws.String(`{}`)},
	}
	got := Event("arn:aws:sqs:eu-west-1:1:q", "eu-west-1", msgs)
	want := events.SQSEvent{Records: []events.SQSMessage{
		{
			MessageId: "m1", ReceiptHandle: "rh1", Body: `{"v":1}`, Md5OfBody: "md5",
			Attributes: map[string]string{"ApproximateReceiveCount": "2"},
			MessageAttributes: map[string]events.SQSMessageAttribute{
				"failure_attempts": {DataType: "Number", StringValue: aws.String("3")},
				"blob":             {DataType: "Binary", BinaryValue: []byte{1, 2}},
			},
			EventSource: "aws:sqs", EventSourceARN: "arn:aws:sqs:eu-west-1:1:q", AWSRegion: "eu-west-1",
		},
		{MessageId: "m2", ReceiptHandle: "rh2", Body: `{}`, EventSource: "aws:sqs", EventSourceARN: "arn:aws:sqs:eu-west-1:1:q", AWSRegion: "eu-west-1"},
	}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Event (-want +got):\n%s", d)
	}
}

func TestDeleteEntries(t *testing.T) {
	t.Parallel()
	msgs := []sqstypes.Message{
		{MessageId: aws.String("m1"), ReceiptHandle: aws.String("rh1")},
		{MessageId: aws.String("m2"), ReceiptHandle: aws.String("rh2")},
		{MessageId: aws.String("m3"), ReceiptHandle: aws.String("rh3")},
	}
	tests := []struct {
		name   string
		failed []string
		want   []sqstypes.DeleteMessageBatchRequestEntry
	}{
		{name: "all handled", want: []sqstypes.DeleteMessageBatchRequestEntry{
			{Id: aws.String("0"), ReceiptHandle: aws.String("rh1")},
			{Id: aws.String("1"), ReceiptHandle: aws.String("rh2")},
			{Id: aws.String("2"), ReceiptHandle: aws.String("rh3")},
		}},
		{name: "failed ones stay", failed: []string{"m2"}, want: []sqstypes.DeleteMessageBatchRequestEntry{
			{Id: aws.String("0"), ReceiptHandle: aws.String("rh1")},
			{Id: aws.String("2"), ReceiptHandle: aws.String("rh3")},
		}},
		{name: "all failed", failed: []string{"m3", "m1", "m2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var resp events.SQSEventResponse
			for _, id := range tt.failed {
				resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: id})
			}
			got := DeleteEntries(msgs, resp)
			if d := cmp.Diff(tt.want, got, cmpopts.IgnoreUnexported(sqstypes.DeleteMessageBatchRequestEntry{})); d != "" {
				t.Errorf("DeleteEntries (-want +got):\n%s", d)
			}
		})
	}
}
