package writer

import (
	"strconv"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// Event builds the Lambda SQS event that the event source mapping would
// hand the writer for messages received from the queue queueARN in region:
// the processes that host the handler outside Lambda (the local runtime, the
// test stacks) call it so the handler sees what Lambda would give it.
func Event(queueARN, region string, msgs []sqstypes.Message) events.SQSEvent {
	ev := events.SQSEvent{Records: make([]events.SQSMessage, len(msgs))}
	for i, m := range msgs {
		ev.Records[i] = events.SQSMessage{
			MessageId:         aws.ToString(m.MessageId),
			ReceiptHandle:     aws.ToString(m.ReceiptHandle),
			Body:              aws.ToString(m.Body),
			Md5OfBody:         aws.ToString(m.MD5OfBody),
			Attributes:        m.Attributes,
			MessageAttributes: messageAttributes(m.MessageAttributes),
			EventSource:       "aws:sqs",
			EventSourceARN:    queueARN,
			AWSRegion:         region,
		}
	}
	return ev
}

// DeleteEntries returns the messages of an invocation that resp does not
// report failed, as DeleteMessageBatch entries (ids are the messages'
// positions in msgs): what the event source mapping deletes from the queue
// once the handler returned resp. The others stay, to be received again
// after their visibility timeout.
func DeleteEntries(msgs []sqstypes.Message, resp events.SQSEventResponse) []sqstypes.DeleteMessageBatchRequestEntry {
	failed := make(map[string]bool, len(resp.BatchItemFailures))
	for _, f := range resp.BatchItemFailures {
		failed[f.ItemIdentifier] = true
	}
	var del []sqstypes.DeleteMessageBatchRequestEntry
	for i, m := range msgs {
		if !failed[aws.ToString(m.MessageId)] {
			del = append(del, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
		}
	}
	return del
}

// messageAttributes converts SQS message attributes to their Lambda event form.
func messageAttributes(in map[string]sqstypes.MessageAttributeValue) map[string]events.SQSMessageAttribute {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]events.SQSMessageAttribute, len(in))
	for k, v := range in {
		out[k] = events.SQSMessageAttribute{StringValue: v.StringValue, BinaryValue: v.BinaryValue, DataType: aws.ToString(v.DataType)}
	}
	return out
}
