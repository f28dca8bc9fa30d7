package awsconf

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	cfntypes "github.com/aws/aws-sdk-go-v2/service/cloudformation/types"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/changes-worker/changes-worker/shared/iampolicy"
	"github.com/changes-worker/changes-worker/shared/statetable"
)

// TestAuthorizations: each SDK operation the code calls maps to the IAM
// actions, resources and condition keys AWS authorises it with, including
// those authorised under another name.
func TestAuthorizations(t *testing.T) {
	t.Parallel()
	const (
		region  = "us-east-1"
		account = "111122223333"
		queue   = "https://sqs.us-east-1.amazonaws.com/111122223333/cwd-orders-pg"
		qARN    = "arn:aws:sqs:us-east-1:111122223333:cwd-orders-pg"
		dlqARN  = "arn:aws:sqs:us-east-1:111122223333:cwd-orders-pg-dlq"
		table   = "arn:aws:dynamodb:us-east-1:111122223333:table/cwd-state"
	)
	key := statetable.Key
	item := func(k string) map[string]ddbtypes.AttributeValue {
		m := key(k)
		m["lease_owner"] = &ddbtypes.AttributeValueMemberS{Value: "x"}
		return m
	}
	lk := func(keys ...string) map[string][]string { return map[string][]string{"dynamodb:LeadingKeys": keys} }
	r := func(action, resource string, ctx map[string][]string) iampolicy.Request {
		return iampolicy.Request{Action: action, Resource: resource, Context: ctx}
	}
	handle := base64.StdEncoding.EncodeToString([]byte(`{"taskId":"t-1","sourceArn":"` + dlqARN + `"}`))
	tests := []struct {
		name, service, op string
		in, out           any
		want              []iampolicy.Request
	}{
		{"SendMessageBatch is sqs:SendMessage", "SQS", "SendMessageBatch", &sqs.SendMessageBatchInput{QueueUrl: aws.String(queue)}, nil,
			[]iampolicy.Request{r("sqs:SendMessage", qARN, nil)}},
		{"DeleteMessageBatch is sqs:DeleteMessage", "SQS", "DeleteMessageBatch", &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(queue)}, nil,
			[]iampolicy.Request{r("sqs:DeleteMessage", qARN, nil)}},
		{"ChangeMessageVisibilityBatch is sqs:ChangeMessageVisibility", "SQS", "ChangeMessageVisibilityBatch", &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(queue)}, nil,
			[]iampolicy.Request{r("sqs:ChangeMessageVisibility", qARN, nil)}},
		{"queue URL of an emulator", "SQS", "ReceiveMessage", &sqs.ReceiveMessageInput{QueueUrl: aws.String("http://sqs.us-east-1.localhost.localstack.cloud:4566/000000000000/q")}, nil,
			[]iampolicy.Request{r("sqs:ReceiveMessage", "arn:aws:sqs:us-east-1:000000000000:q", nil)}},
		{"GetQueueUrl by name", "SQS", "GetQueueUrl", &sqs.GetQueueUrlInput{QueueName: aws.String("cwd-orders-pg")}, nil,
			[]iampolicy.Request{r("sqs:GetQueueUrl", qARN, nil)}},
		{"a move task needs the source's messages and the destination", "SQS", "StartMessageMoveTask", &sqs.StartMessageMoveTaskInput{SourceArn: aws.String(dlqARN), DestinationArn: aws.String(qARN)}, nil,
			[]iampolicy.Request{r("sqs:StartMessageMoveTask", dlqARN, nil), r("sqs:ReceiveMessage", dlqARN, nil), r("sqs:DeleteMessage", dlqARN, nil), r("sqs:GetQueueAttributes", dlqARN, nil), r("sqs:SendMessage", qARN, nil)}},
		{"cancelling a move task is on its source", "SQS", "CancelMessageMoveTask", &sqs.CancelMessageMoveTaskInput{TaskHandle: aws.String(handle)}, nil,
			[]iampolicy.Request{r("sqs:CancelMessageMoveTask", dlqARN, nil), r("sqs:ReceiveMessage", dlqARN, nil), r("sqs:DeleteMessage", dlqARN, nil), r("sqs:GetQueueAttributes", dlqARN, nil)}},
		{"GetItem carries the leading key", "DynamoDB", "GetItem", &dynamodb.GetItemInput{TableName: aws.String("cwd-state"), Key: key("orders")}, nil,
			[]iampolicy.Request{r("dynamodb:GetItem", table, lk("orders"))}},
		{"PutItem reads the key from the item", "DynamoDB", "PutItem", &dynamodb.PutItemInput{TableName: aws.String("cwd-state"), Item: item("quarantine/orders/a")}, nil,
			[]iampolicy.Request{r("dynamodb:PutItem", table, lk("quarantine/orders/a"))}},
		{"Query reads the key from its condition", "DynamoDB", "Query", &dynamodb.QueryInput{TableName: aws.String(table), KeyConditionExpression: aws.String("#k = :k"),
			ExpressionAttributeNames: map[string]string{"#k": statetable.KeyAttr}, ExpressionAttributeValues: map[string]ddbtypes.AttributeValue{":k": &ddbtypes.AttributeValueMemberS{Value: "orders"}}}, nil,
			[]iampolicy.Request{r("dynamodb:Query", table, lk("orders"))}},
		{"Scan has no leading key", "DynamoDB", "Scan", &dynamodb.ScanInput{TableName: aws.String("cwd-state")}, nil,
			[]iampolicy.Request{r("dynamodb:Scan", table, nil)}},
		{"TransactWriteItems is each item's operation", "DynamoDB", "TransactWriteItems", &dynamodb.TransactWriteItemsInput{TransactItems: []ddbtypes.TransactWriteItem{
			{Put: &ddbtypes.Put{TableName: aws.String("cwd-state"), Item: item("halt/orders/pg/g")}},
			{Update: &ddbtypes.Update{TableName: aws.String("cwd-state"), Key: key("halt/orders/pg")}},
			{Delete: &ddbtypes.Delete{TableName: aws.String("cwd-state"), Key: key("halt/orders/pg/h")}},
			{ConditionCheck: &ddbtypes.ConditionCheck{TableName: aws.String("cwd-state"), Key: key("orders")}},
		}}, nil, []iampolicy.Request{
			r("dynamodb:PutItem", table, lk("halt/orders/pg/g")), r("dynamodb:UpdateItem", table, lk("halt/orders/pg")),
			r("dynamodb:DeleteItem", table, lk("halt/orders/pg/h")), r("dynamodb:ConditionCheckItem", table, lk("orders"))}},
		{"BatchWriteItem per table with every key", "DynamoDB", "BatchWriteItem", &dynamodb.BatchWriteItemInput{RequestItems: map[string][]ddbtypes.WriteRequest{
			"cwd-state": {{PutRequest: &ddbtypes.PutRequest{Item: item("redrive/b")}}, {DeleteRequest: &ddbtypes.DeleteRequest{Key: key("redrive/a")}}, {DeleteRequest: &ddbtypes.DeleteRequest{Key: key("redrive/a")}}},
		}}, nil, []iampolicy.Request{r("dynamodb:BatchWriteItem", table, lk("redrive/a", "redrive/b"))}},
		{"BatchGetItem per table", "DynamoDB", "BatchGetItem", &dynamodb.BatchGetItemInput{RequestItems: map[string]ddbtypes.KeysAndAttributes{
			"cwd-state": {Keys: []map[string]ddbtypes.AttributeValue{key("redrive/a")}},
		}}, nil, []iampolicy.Request{r("dynamodb:BatchGetItem", table, lk("redrive/a"))}},
		{"HeadObject is s3:GetObject", "S3", "HeadObject", &s3.HeadObjectInput{Bucket: aws.String("data"), Key: aws.String("attachments/cwd/orders/md5-x")}, nil,
			[]iampolicy.Request{r("s3:GetObject", "arn:aws:s3:::data/attachments/cwd/orders/md5-x", nil)}},
		{"a versioned GetObject", "S3", "GetObject", &s3.GetObjectInput{Bucket: aws.String("data"), Key: aws.String("k"), VersionId: aws.String("v1")}, nil,
			[]iampolicy.Request{r("s3:GetObjectVersion", "arn:aws:s3:::data/k", nil)}},
		{"UploadPart is s3:PutObject", "S3", "UploadPart", &s3.UploadPartInput{Bucket: aws.String("data"), Key: aws.String("k")}, nil,
			[]iampolicy.Request{r("s3:PutObject", "arn:aws:s3:::data/k", nil)}},
		{"CompleteMultipartUpload is s3:PutObject", "S3", "CompleteMultipartUpload", &s3.CompleteMultipartUploadInput{Bucket: aws.String("data"), Key: aws.String("k")}, nil,
			[]iampolicy.Request{r("s3:PutObject", "arn:aws:s3:::data/k", nil)}},
		{"AbortMultipartUpload is its own action", "S3", "AbortMultipartUpload", &s3.AbortMultipartUploadInput{Bucket: aws.String("data"), Key: aws.String("k")}, nil,
			[]iampolicy.Request{r("s3:AbortMultipartUpload", "arn:aws:s3:::data/k", nil)}},
		{"ListObjectsV2 is s3:ListBucket with s3:prefix", "S3", "ListObjectsV2", &s3.ListObjectsV2Input{Bucket: aws.String("data"), Prefix: aws.String("archive/")}, nil,
			[]iampolicy.Request{r("s3:ListBucket", "arn:aws:s3:::data", map[string][]string{"s3:prefix": {"archive/"}})}},
		{"a listing without a prefix", "S3", "ListObjectsV2", &s3.ListObjectsV2Input{Bucket: aws.String("data")}, nil,
			[]iampolicy.Request{r("s3:ListBucket", "arn:aws:s3:::data", map[string][]string{"s3:prefix": {""}})}},
		{"DeleteObjects is s3:DeleteObject per key", "S3", "DeleteObjects", &s3.DeleteObjectsInput{Bucket: aws.String("data"), Delete: &s3types.Delete{Objects: []s3types.ObjectIdentifier{{Key: aws.String("a")}, {Key: aws.String("b")}}}}, nil,
			[]iampolicy.Request{r("s3:DeleteObject", "arn:aws:s3:::data/a", nil), r("s3:DeleteObject", "arn:aws:s3:::data/b", nil)}},
		{"CopyObject reads its source", "S3", "CopyObject", &s3.CopyObjectInput{Bucket: aws.String("data"), Key: aws.String("b"), CopySource: aws.String("src/a%20b")}, nil,
			[]iampolicy.Request{r("s3:PutObject", "arn:aws:s3:::data/b", nil), r("s3:GetObject", "arn:aws:s3:::src/a b", nil)}},
		{"GetBucketLifecycleConfiguration", "S3", "GetBucketLifecycleConfiguration", &s3.GetBucketLifecycleConfigurationInput{Bucket: aws.String("data")}, nil,
			[]iampolicy.Request{r("s3:GetLifecycleConfiguration", "arn:aws:s3:::data", nil)}},
		{"a secret by name resolves to name-??????", "Secrets Manager", "GetSecretValue", &secretsmanager.GetSecretValueInput{SecretId: aws.String("cwd/PG_DSN")}, nil,
			[]iampolicy.Request{r("secretsmanager:GetSecretValue", "arn:aws:secretsmanager:us-east-1:111122223333:secret:cwd/PG_DSN-??????", nil)}},
		{"a secret's ARN from the answer", "Secrets Manager", "GetSecretValue", &secretsmanager.GetSecretValueInput{SecretId: aws.String("cwd/PG_DSN")},
			&secretsmanager.GetSecretValueOutput{ARN: aws.String("arn:aws:secretsmanager:us-east-1:111122223333:secret:cwd/PG_DSN-AbCdEf")},
			[]iampolicy.Request{r("secretsmanager:GetSecretValue", "arn:aws:secretsmanager:us-east-1:111122223333:secret:cwd/PG_DSN-AbCdEf", nil)}},
		{"a stack's ARN from the answer", "CloudFormation", "DescribeStacks", &cloudformation.DescribeStacksInput{StackName: aws.String("cwd")},
			&cloudformation.DescribeStacksOutput{Stacks: []cfntypes.Stack{{StackId: aws.String("arn:aws:cloudformation:us-east-1:111122223333:stack/cwd/1")}}},
			[]iampolicy.Request{r("cloudformation:DescribeStacks", "arn:aws:cloudformation:us-east-1:111122223333:stack/cwd/1", nil)}},
		{"a stack that does not exist", "CloudFormation", "DescribeStacks", &cloudformation.DescribeStacksInput{StackName: aws.String("cwd")}, nil,
			[]iampolicy.Request{r("cloudformation:DescribeStacks", "arn:aws:cloudformation:us-east-1:111122223333:stack/cwd/*", nil)}},
		{"Invoke is lambda:InvokeFunction", "Lambda", "Invoke", &lambda.InvokeInput{FunctionName: aws.String("cwd-orders-poller")}, nil,
			[]iampolicy.Request{r("lambda:InvokeFunction", "arn:aws:lambda:us-east-1:111122223333:function:cwd-orders-poller", nil)}},
		{"an event source mapping by UUID", "Lambda", "UpdateEventSourceMapping", &lambda.UpdateEventSourceMappingInput{UUID: aws.String("e-1")}, nil,
			[]iampolicy.Request{r("lambda:UpdateEventSourceMapping", "arn:aws:lambda:us-east-1:111122223333:event-source-mapping:e-1", nil)}},
		{"a rule on the default bus", "EventBridge", "DisableRule", &eventbridge.DisableRuleInput{Name: aws.String("cwd-orders-schedule")}, nil,
			[]iampolicy.Request{r("events:DisableRule", "arn:aws:events:us-east-1:111122223333:rule/cwd-orders-schedule", nil)}},
		{"a rule on another bus, by ARN", "EventBridge", "EnableRule", &eventbridge.EnableRuleInput{Name: aws.String("nightly"),
			EventBusName: aws.String("arn:aws:events:us-east-1:111122223333:event-bus/ops")}, nil,
			[]iampolicy.Request{r("events:EnableRule", "arn:aws:events:us-east-1:111122223333:rule/ops/nightly", nil)}},
		{"describe a rule", "EventBridge", "DescribeRule", &eventbridge.DescribeRuleInput{Name: aws.String("cwd-orders-schedule"), EventBusName: aws.String("default")}, nil,
			[]iampolicy.Request{r("events:DescribeRule", "arn:aws:events:us-east-1:111122223333:rule/cwd-orders-schedule", nil)}},
		{"GetCallerIdentity needs nothing", "STS", "GetCallerIdentity", &struct{}{}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := authorizations(tt.service, tt.op, tt.in, tt.out, region, account)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s %s (-want +got):\n%s", tt.service, tt.op, diff)
			}
		})
	}
}

// TestAuthorizationsRefuse: an operation without a mapping, or an input
// the mapping cannot read, is an error naming it, never a guess.
func TestAuthorizationsRefuse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, service, op string
		in                any
		want              string
	}{
		{"unknown operation", "SQS", "ListQueues", &sqs.ListQueuesInput{}, "no IAM mapping for SQS ListQueues"},
		{"item without the partition key", "DynamoDB", "GetItem", &dynamodb.GetItemInput{TableName: aws.String("t"), Key: map[string]ddbtypes.AttributeValue{"id": &ddbtypes.AttributeValueMemberS{Value: "x"}}}, "no string job_id"},
		{"queue URL without account", "SQS", "SendMessage", &sqs.SendMessageInput{QueueUrl: aws.String("http://127.0.0.1:4566/q")}, "want .../ACCOUNT/NAME"},
		{"object without key", "S3", "PutObject", &s3.PutObjectInput{Bucket: aws.String("b")}, "no Key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := authorizations(tt.service, tt.op, tt.in, nil, "us-east-1", "111122223333")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("authorizations = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
