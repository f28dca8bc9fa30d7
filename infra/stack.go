package main

import (
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awss3"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deployed"
)

// changesStack is the deployment of one job configuration: the stack named
// after stack.prefix holds what every job shares (the state table, the
// bucket, the alarm topic and its key, the secrets of {"env": NAME}
// references) and one nested stack per job (jobStack) with everything that
// job alone uses. A change to one job changes its nested stack and, in this
// stack, only the nested stack's template location; adding or removing a job
// adds or deletes its nested stack.
type changesStack struct {
	stack awscdk.Stack

	in  *input
	cfg *config.File

	table  awsdynamodb.Table
	bucket awss3.IBucket
	// envSecrets are the secrets of {"env": NAME} references, by NAME.
	envSecrets map[string]awssecretsmanager.Secret
	alarmTopic awssns.Topic
	jobs       []*jobStack
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
	s.addWarnings()
	s.addState()
	s.addStorage()
	s.addAlarmTopic()
	s.addEnvSecrets()
	for _, j := range s.cfg.Jobs {
		s.jobs = append(s.jobs, s.newJobStack(j))
	}
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

// addWarnings shows synth the configuration's warnings (config.Warning).
func (s *changesStack) addWarnings() {
	for _, w := range s.in.warnings {
		awscdk.Annotations_Of(s.stack).AddWarningV2(jsii.String("changes-worker:"+w.Key), jsii.String(w.String()))
	}
}

// retain reports whether stateful resources outlive the stack (stack.retain).
func (s *changesStack) retain() bool { return s.cfg.Stack.Retain == nil || *s.cfg.Stack.Retain }

// removalPolicy is the removal policy of stateful resources. Retained, they
// outlive the stack's deletion, their job's removal and a replacement, but
// not the stack operation that created them (RetainExceptOnCreate): a first
// deploy that fails and rolls back deletes them, so that the retry does not
// find the names of the table, the secrets and the log groups taken.
func (s *changesStack) removalPolicy() awscdk.RemovalPolicy {
	if s.retain() {
		return awscdk.RemovalPolicy_RETAIN_ON_UPDATE_OR_DELETE
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
