package awsconf_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/iampolicy"
	"github.com/changes-worker/changes-worker/shared/statetable"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// TestRecordCalls: with CHANGES_AWS_CALLS naming a file, every request made
// with a labelled context is appended to it, with what IAM authorises for
// it, whether it succeeded or not; unlabelled requests outside a Lambda
// function are not; without the variable nothing is recorded.
func TestRecordCalls(t *testing.T) {
	testenv.AWS(t) // the local services answer
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	t.Setenv(awsconf.EnvCalls, path)
	t.Setenv("AWS_LAMBDA_FUNCTION_NAME", "")
	cfg, err := awsconf.Load(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := awsconf.WithCaller(t.Context(), "changesctl status")
	q := sqs.NewFromConfig(cfg)
	name := testenv.Name(t)
	created, err := q.CreateQueue(t.Context(), &sqs.CreateQueueInput{QueueName: &name}) // unlabelled: not recorded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		q.DeleteQueue(context.WithoutCancel(t.Context()), &sqs.DeleteQueueInput{QueueUrl: created.QueueUrl})
	})
	if _, err := q.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name}); err != nil {
		t.Fatal(err)
	}
	// A failed call is recorded too: it was authorised (or not) first.
	table := name + "-missing"
	_, err = dynamodb.NewFromConfig(cfg).GetItem(ctx, &dynamodb.GetItemInput{TableName: &table, Key: statetable.Key("orders")})
	if err == nil {
		t.Fatalf("GetItem on table %s that does not exist succeeded", table)
	}
	_, _ = s3.NewFromConfig(cfg, awsconf.S3Options).ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(name), Prefix: aws.String("archive/")})
	_, _ = secretsmanager.NewFromConfig(cfg).GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(name + "/PG_DSN")})

	calls, err := awsconf.ReadCalls(path)
	if err != nil {
		t.Fatal(err)
	}
	region, account := cfg.Region, "000000000000"
	arn := func(service, res string) string {
		return "arn:aws:" + service + ":" + region + ":" + account + ":" + res
	}
	want := []awsconf.Call{
		{Caller: "changesctl status", Service: "SQS", Operation: "GetQueueUrl", Region: region,
			Requests: []iampolicy.Request{{Action: "sqs:GetQueueUrl", Resource: arn("sqs", name)}}},
		{Caller: "changesctl status", Service: "DynamoDB", Operation: "GetItem", Region: region,
			Requests: []iampolicy.Request{{Action: "dynamodb:GetItem", Resource: arn("dynamodb", "table/"+table), Context: map[string][]string{"dynamodb:LeadingKeys": {"orders"}}}}},
		{Caller: "changesctl status", Service: "S3", Operation: "ListObjectsV2", Region: region,
			Requests: []iampolicy.Request{{Action: "s3:ListBucket", Resource: "arn:aws:s3:::" + name, Context: map[string][]string{"s3:prefix": {"archive/"}}}}},
		{Caller: "changesctl status", Service: "Secrets Manager", Operation: "GetSecretValue", Region: region,
			Requests: []iampolicy.Request{{Action: "secretsmanager:GetSecretValue", Resource: arn("secretsmanager", "secret:"+name+"/PG_DSN-??????")}}},
	}
	if diff := cmp.Diff(want, calls); diff != "" {
		t.Errorf("recorded calls (-want +got):\n%s", diff)
	}

	// Off: the same labelled call leaves no record.
	t.Setenv(awsconf.EnvCalls, "")
	cfg, err = awsconf.Load(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sqs.NewFromConfig(cfg).GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name}); err != nil {
		t.Fatal(err)
	}
	if calls, _ := awsconf.ReadCalls(path); len(calls) != len(want) {
		t.Errorf("%d calls recorded after %s was unset, want still %d", len(calls), awsconf.EnvCalls, len(want))
	}
}

// TestRecordFunctionCalls: in a Lambda function (AWS_LAMBDA_FUNCTION_NAME)
// every request is recorded as the function's.
func TestRecordFunctionCalls(t *testing.T) {
	testenv.AWS(t)
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	t.Setenv(awsconf.EnvCalls, path)
	t.Setenv("AWS_LAMBDA_FUNCTION_NAME", "cwd-orders-writer")
	cfg, err := awsconf.Load(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	name := testenv.Name(t)
	_, _ = sqs.NewFromConfig(cfg).GetQueueUrl(t.Context(), &sqs.GetQueueUrlInput{QueueName: &name})
	calls, err := awsconf.ReadCalls(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 || calls[0].Caller != "cwd-orders-writer" || calls[0].Operation != "GetQueueUrl" || calls[0].Unmapped != "" {
		t.Errorf("recorded %+v, want one GetQueueUrl of cwd-orders-writer", calls)
	}
}
