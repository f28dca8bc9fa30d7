// Package provision creates the resources a configuration needs — the state
// table, a work queue and DLQ per (job, output), the bucket — on whatever AWS
// endpoint the SDK is configured for, with the names and settings the CDK
// stack uses. It is idempotent: existing resources are kept and their queue
// attributes brought in line.
package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/statetable"
)

// Clients are the AWS clients provisioning uses.
type Clients struct {
	DynamoDB *dynamodb.Client
	SQS      *sqs.Client
	S3       *s3.Client
}

// Settings shared with the CDK stack.
const (
	// QueueRetention is how long a work queue keeps a message: SQS's
	// maximum. The DLQs keep theirs for stack.dlq.retention.
	QueueRetention = 14 * 24 * time.Hour
	// VisibilityFactor: work-queue visibility timeout = factor × writer timeout.
	VisibilityFactor = 6
)

// Report lists what was created or found.
type Report struct {
	Table  string
	Bucket string
	Queues []QueuePair
}

// QueuePair is one (job, output)'s queues.
type QueuePair struct {
	Job, Output string
	Queue, DLQ  string // URLs
	FIFO        bool
	MaxReceives int
}

// Apply creates or updates every resource of f.
func Apply(ctx context.Context, c Clients, f *config.File) (*Report, error) {
	rep := &Report{Table: f.TableName(), Bucket: f.Stack.Bucket}
	if err := statetable.Create(ctx, c.DynamoDB, rep.Table); err != nil {
		return nil, err
	}
	buckets := map[string]bool{f.Stack.Bucket: true}
	for _, j := range f.Jobs {
		for _, o := range j.Outputs {
			if o.S3 != nil {
				buckets[o.S3.Bucket] = true
			}
		}
	}
	for b := range buckets {
		if err := createBucket(ctx, c.S3, b); err != nil {
			return nil, err
		}
	}
	for _, j := range f.Jobs {
		for _, o := range j.Outputs {
			qp, err := createQueues(ctx, c.SQS, f, j, o)
			if err != nil {
				return nil, err
			}
			rep.Queues = append(rep.Queues, qp)
		}
	}
	return rep, nil
}

func createBucket(ctx context.Context, c *s3.Client, name string) error {
	_, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &name})
	var owned *s3types.BucketAlreadyOwnedByYou
	var exists *s3types.BucketAlreadyExists
	if err != nil && !errors.As(err, &owned) && !errors.As(err, &exists) {
		return fmt.Errorf("create bucket %s: %w", name, err)
	}
	return nil
}

func createQueues(ctx context.Context, c *sqs.Client, f *config.File, j *config.Job, o *config.Output) (QueuePair, error) {
	qp := QueuePair{Job: j.ID, Output: o.ID, FIFO: o.FIFO(), MaxReceives: o.QueueMaxReceiveCount()}
	fifo := map[string]string{}
	if o.FIFO() {
		fifo = map[string]string{
			string(sqstypes.QueueAttributeNameFifoQueue):                 "true",
			string(sqstypes.QueueAttributeNameContentBasedDeduplication): "false",
		}
	}
	dlqURL, dlqARN, err := upsertQueueARN(ctx, c, f.DLQName(j, o), fifo, map[string]string{
		string(sqstypes.QueueAttributeNameMessageRetentionPeriod): strconv.Itoa(int(f.Stack.DLQ.Retention.D().Seconds())),
		string(sqstypes.QueueAttributeNameSqsManagedSseEnabled):   "true",
	})
	if err != nil {
		return qp, err
	}
	redrive, _ := json.Marshal(map[string]any{"deadLetterTargetArn": dlqARN, "maxReceiveCount": o.QueueMaxReceiveCount()})
	qURL, qARN, err := upsertQueueARN(ctx, c, f.QueueName(j, o), fifo, map[string]string{
		string(sqstypes.QueueAttributeNameVisibilityTimeout):      strconv.Itoa(int(VisibilityFactor * f.Stack.WriterTimeout.D().Seconds())),
		string(sqstypes.QueueAttributeNameMessageRetentionPeriod): strconv.Itoa(int(QueueRetention.Seconds())),
		string(sqstypes.QueueAttributeNameRedrivePolicy):          string(redrive),
		string(sqstypes.QueueAttributeNameSqsManagedSseEnabled):   "true",
	})
	if err != nil {
		return qp, err
	}
	allow, _ := json.Marshal(map[string]any{"redrivePermission": "byQueue", "sourceQueueArns": []string{qARN}})
	if _, err := c.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{
		QueueUrl:   &dlqURL,
		Attributes: map[string]string{string(sqstypes.QueueAttributeNameRedriveAllowPolicy): string(allow)},
	}); err != nil {
		return qp, fmt.Errorf("set redrive allow policy on %s: %w", f.DLQName(j, o), err)
	}
	qp.Queue, qp.DLQ = qURL, dlqURL
	return qp, nil
}

// upsertQueueARN upserts the queue with attrs and fifo's attributes, and
// returns its URL and ARN.
func upsertQueueARN(ctx context.Context, c *sqs.Client, name string, fifo, attrs map[string]string) (string, string, error) {
	maps.Copy(attrs, fifo)
	url, err := upsertQueue(ctx, c, name, attrs)
	if err != nil {
		return "", "", err
	}
	arn, err := queueARN(ctx, c, url)
	if err != nil {
		return "", "", err
	}
	return url, arn, nil
}

// upsertQueue creates the queue, or updates the mutable attributes of an
// existing one (FIFO-ness cannot change).
func upsertQueue(ctx context.Context, c *sqs.Client, name string, attrs map[string]string) (string, error) {
	out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: &name, Attributes: attrs})
	if err == nil {
		return aws.ToString(out.QueueUrl), nil
	}
	got, gerr := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
	if gerr != nil {
		return "", fmt.Errorf("create queue %s: %w", name, err)
	}
	url := aws.ToString(got.QueueUrl)
	mutable := map[string]string{}
	for k, v := range attrs {
		if k != string(sqstypes.QueueAttributeNameFifoQueue) {
			mutable[k] = v
		}
	}
	if _, err := c.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{QueueUrl: &url, Attributes: mutable}); err != nil {
		return "", fmt.Errorf("update queue %s: %w", name, err)
	}
	return url, nil
}

func queueARN(ctx context.Context, c *sqs.Client, url string) (string, error) {
	out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: &url, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn},
	})
	if err != nil {
		return "", fmt.Errorf("get queue arn %s: %w", url, err)
	}
	return out.Attributes[string(sqstypes.QueueAttributeNameQueueArn)], nil
}

// Remove deletes what Apply creates but the bucket (it holds outputs):
// the state table, with the jobs' leases and checkpoints, and every work
// queue and DLQ, with their messages. It reports the names it deleted;
// what does not exist is skipped, so it is idempotent.
func Remove(ctx context.Context, c Clients, f *config.File) ([]string, error) {
	var removed []string
	table := f.TableName()
	_, err := c.DynamoDB.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: &table})
	var missing *ddbtypes.ResourceNotFoundException
	switch {
	case err == nil:
		removed = append(removed, table)
	case !errors.As(err, &missing):
		return removed, fmt.Errorf("delete table %s: %w", table, err)
	}
	for _, j := range f.Jobs {
		for _, o := range j.Outputs {
			for _, name := range []string{f.QueueName(j, o), f.DLQName(j, o)} {
				gone, err := deleteQueue(ctx, c.SQS, name)
				if err != nil {
					return removed, err
				}
				if gone {
					removed = append(removed, name)
				}
			}
		}
	}
	return removed, nil
}

// deleteQueue deletes the queue name, reporting whether it existed.
func deleteQueue(ctx context.Context, c *sqs.Client, name string) (bool, error) {
	got, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
	var missing *sqstypes.QueueDoesNotExist
	if errors.As(err, &missing) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("delete queue %s: %w", name, err)
	}
	if _, err := c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: got.QueueUrl}); err != nil {
		return false, fmt.Errorf("delete queue %s: %w", name, err)
	}
	return true, nil
}
