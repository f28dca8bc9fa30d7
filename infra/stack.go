package main

import (
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awss3"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deployed"
)

// changesStack is the whole deployment of one job configuration: the state
// table, the bucket, a work queue and a DLQ per (job, output), the poller and
// writer functions, their schedules and event sources, alarms and a dashboard.
// The local variant leaves the functions, schedules and event sources out.
type changesStack struct {
	stack awscdk.Stack

	in  *input
	cfg *config.File

	table  awsdynamodb.Table
	bucket awss3.IBucket
	// outputBuckets are the other buckets S3 outputs name, by bucket name.
	outputBuckets map[string]awss3.IBucket
	// imported holds constructs that refer to existing resources, by construct id.
	imported   map[string]any
	routes     []*route
	poller     *function
	writer     *function
	alarmTopic awssns.Topic
}

// route is one (job, output) with its queues.
type route struct {
	job   *config.Job
	out   *config.Output
	queue awssqs.Queue
	dlq   awssqs.Queue
}

// function is a Lambda function with the role and log group made for it. In
// the local variant fn is nil: only the role and the log group exist.
type function struct {
	name string // <prefix>-<poller|writer>
	fn   awslambda.Function
	role awsiam.Role
	logs awslogs.LogGroup
}

// newStack builds the stack for in. The stack is named after stack.prefix, so
// configurations with different prefixes deploy side by side.
func newStack(scope constructs.Construct, in *input, props *awscdk.StackProps) *changesStack {
	name := in.cfg.Stack.Prefix
	if props == nil {
		props = &awscdk.StackProps{}
	}
	props.StackName = jsii.String(name)
	if props.Description == nil {
		props.Description = jsii.String("changes-worker: follows CouchDB/Sync Gateway _changes feeds and delivers every change to PostgreSQL, HTTP and S3 outputs")
	}
	s := &changesStack{stack: awscdk.NewStack(scope, jsii.String(name), props), in: in, cfg: in.cfg}
	s.addState()
	s.addStorage()
	s.addQueues()
	s.addFunctions()
	s.addAlarms()
	s.addDashboard()
	s.addOutputs()
	return s
}

// addOutputs publishes what the local runtime and the operator's tools read
// from the deployed stack (package deployed): the bucket, whose name the
// stack generates.
func (s *changesStack) addOutputs() {
	awscdk.NewCfnOutput(s.stack, jsii.String(deployed.OutputBucket), &awscdk.CfnOutputProps{
		Value:       s.bucket.BucketName(),
		Description: jsii.String("The bucket of claim checks and of S3 outputs without a bucket of their own"),
	})
}

// retain reports whether stateful resources outlive the stack (stack.retain).
func (s *changesStack) retain() bool { return s.cfg.Stack.Retain == nil || *s.cfg.Stack.Retain }

// removalPolicy is the removal policy of stateful resources.
func (s *changesStack) removalPolicy() awscdk.RemovalPolicy {
	if s.retain() {
		return awscdk.RemovalPolicy_RETAIN
	}
	return awscdk.RemovalPolicy_DESTROY
}

// name prefixes a physical resource name with stack.prefix.
func (s *changesStack) name(suffix string) *string {
	return jsii.String(s.cfg.Stack.Prefix + "-" + suffix)
}

func seconds(d time.Duration) awscdk.Duration {
	return awscdk.Duration_Seconds(jsii.Number(d.Seconds()))
}
