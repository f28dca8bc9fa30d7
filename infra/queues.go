package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/jsii-runtime-go"

	"github.com/changes-worker/changes-worker/shared/config"
)

const (
	// maxMessageBytes is the largest message SQS accepts (1 MiB); envelopes
	// above stack.max_message_bytes travel as claim checks anyway.
	maxMessageBytes = 1024 * 1024
	// queueRetentionDays is how long a message waits in a work queue: the
	// SQS maximum, so that a long outage of an output loses nothing. A DLQ
	// keeps its messages for stack.dlq.retention, and the poller archives
	// them before that.
	queueRetentionDays = 14
	// visibilityFactor multiplies the writer's timeout to give the work
	// queues' visibility timeout, as the Lambda SQS event source requires.
	visibilityFactor = 6
)

// addQueues creates the work queue and DLQ of every output of the job, named
// as the functions expect.
func (js *jobStack) addQueues() {
	visibility := seconds(visibilityFactor * js.cfg.Stack.WriterTimeout.D())
	for _, o := range js.job.Outputs {
		js.routes = append(js.routes, js.addRoute(js.job, o, visibility))
	}
}

func (js *jobStack) addRoute(j *config.Job, o *config.Output, visibility awscdk.Duration) *route {
	id := j.ID + "-" + o.ID
	queueName := js.cfg.QueueName(j, o)

	// The DLQ's redrive-allow policy names its source queue, which itself
	// refers to the DLQ: built from the queue's known name, the ARN breaks
	// that cycle.
	queueARN := js.stack.FormatArn(&awscdk.ArnComponents{Service: jsii.String("sqs"), Resource: jsii.String(queueName)})
	dlqProps := &awssqs.QueueProps{
		QueueName:           jsii.String(js.cfg.DLQName(j, o)),
		RetentionPeriod:     seconds(js.cfg.Stack.DLQ.Retention.D()),
		MaxMessageSizeBytes: jsii.Number(maxMessageBytes),
		Encryption:          awssqs.QueueEncryption_SQS_MANAGED,
		EnforceSSL:          jsii.Bool(true),
		RedriveAllowPolicy: &awssqs.RedriveAllowPolicy{
			RedrivePermission: awssqs.RedrivePermission_BY_QUEUE,
			SourceQueues:      &[]awssqs.IQueue{awssqs.Queue_FromQueueArn(js.stack, jsii.String("SourceOf-"+id), queueARN)},
		},
	}
	queueProps := &awssqs.QueueProps{
		QueueName:           jsii.String(queueName),
		VisibilityTimeout:   visibility,
		RetentionPeriod:     awscdk.Duration_Days(jsii.Number(queueRetentionDays)),
		MaxMessageSizeBytes: jsii.Number(maxMessageBytes),
		Encryption:          awssqs.QueueEncryption_SQS_MANAGED,
		EnforceSSL:          jsii.Bool(true),
	}
	if o.FIFO() {
		// The poller sends an explicit deduplication id per (job, output, doc,
		// seq), so content-based deduplication stays off. Throughput is
		// counted per message group (high-throughput FIFO): one group per
		// document with per_document; with total, the output's one group is
		// held to a single group's limit anyway. A halting output's redrive
		// policy allows SQS's maximum of receives (QueueMaxReceiveCount): its
		// writer keeps a halted change in the queue rather than let SQS
		// dead-letter it.
		queueProps.Fifo = jsii.Bool(true)
		queueProps.ContentBasedDeduplication = jsii.Bool(false)
		queueProps.DeduplicationScope = awssqs.DeduplicationScope_MESSAGE_GROUP
		queueProps.FifoThroughputLimit = awssqs.FifoThroughputLimit_PER_MESSAGE_GROUP_ID
		// The writer also moves permanent failures to the DLQ itself: content-
		// based deduplication there makes a send without an explicit id valid
		// and collapses a repeated move of the same message.
		dlqProps.Fifo = jsii.Bool(true)
		dlqProps.ContentBasedDeduplication = jsii.Bool(true)
		dlqProps.DeduplicationScope = awssqs.DeduplicationScope_MESSAGE_GROUP
		dlqProps.FifoThroughputLimit = awssqs.FifoThroughputLimit_PER_MESSAGE_GROUP_ID
	}
	dlq := awssqs.NewQueue(js.stack, jsii.String("DLQ-"+id), dlqProps)
	queueProps.DeadLetterQueue = &awssqs.DeadLetterQueue{Queue: dlq, MaxReceiveCount: jsii.Number(float64(o.QueueMaxReceiveCount()))}
	queue := awssqs.NewQueue(js.stack, jsii.String("Queue-"+id), queueProps)
	return &route{job: j, out: o, queue: queue, dlq: dlq}
}
