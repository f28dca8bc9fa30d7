package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/aws-cdk-go/awscdk/v2/awss3"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/jsii-runtime-go"

	"github.com/changes-worker/changes-worker/shared/config"
)

// jobStack is the nested stack of one job: its work queues and DLQs, its own
// poller and writer functions with their roles, log groups, schedule and
// event sources (in the full variant), its verify function, its alarms and
// its dashboard. Each
// role is granted this job's resources only, so a policy's size follows the
// job's outputs, not the number of jobs.
//
// It refers to the shared resources by their names (the table, the alarm
// topic, the secrets of env references) or, for the bucket whose name is
// generated, through a parameter of the nested stack; nothing else crosses
// between the stacks.
type jobStack struct {
	app   *changesStack
	stack awscdk.NestedStack
	job   *config.Job
	cfg   *config.File

	table  awsdynamodb.ITable
	topic  awssns.ITopic
	routes []*route
	poller *function
	writer *function
	verify *function
	// imported holds constructs that refer to existing resources, by construct id.
	imported map[string]any
	// wildcards are the cdk-nag IAM5 patterns accepted, by reason.
	wildcards map[string][]string
}

// route is one (job, output) with its queues.
type route struct {
	job   *config.Job
	out   *config.Output
	queue awssqs.Queue
	dlq   awssqs.Queue
}

// jobStackID is the construct id of job j's nested stack.
func jobStackID(j *config.Job) string { return "Job-" + j.ID }

// newJobStack builds the nested stack of job j.
func (s *changesStack) newJobStack(j *config.Job) *jobStack {
	ns := awscdk.NewNestedStack(s.stack, jsii.String(jobStackID(j)), &awscdk.NestedStackProps{
		Description:   jsii.String("changes-worker " + s.cfg.Stack.Prefix + ": job " + j.ID),
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	js := &jobStack{app: s, stack: ns, job: j, cfg: s.cfg}
	js.table = awsdynamodb.Table_FromTableName(ns, jsii.String("State"), jsii.String(s.cfg.TableName()))
	js.topic = awssns.Topic_FromTopicArn(ns, jsii.String("AlarmTopic"),
		ns.FormatArn(&awscdk.ArnComponents{Service: jsii.String("sns"), Resource: s.name("alarms")}))
	// Named, not referred to: the job's stack is created after them.
	ns.Node().AddDependency(s.table, s.alarmTopic)
	sources, outputs := jobSecretRefs(j)
	for _, name := range envSecretNames(sources, outputs) {
		ns.Node().AddDependency(s.envSecrets[name])
	}
	js.addQueues()
	js.addFunctions()
	js.addVerify()
	js.addAlarms()
	if d := s.cfg.Stack.Dashboards; d == nil || *d {
		js.addDashboard()
	}
	js.suppressFindings()
	return js
}

// bucket is the stack bucket.
func (js *jobStack) bucket() awss3.IBucket { return js.app.bucket }

// name prefixes a physical resource name with stack.prefix.
func (js *jobStack) name(suffix string) *string { return js.app.name(suffix) }

// importOnce returns the construct made by mk under id, making it on first use.
func (js *jobStack) importOnce(id string, mk func(id string) any) any {
	if js.imported == nil {
		js.imported = map[string]any{}
	}
	if c, ok := js.imported[id]; ok {
		return c
	}
	c := mk(id)
	js.imported[id] = c
	return c
}

// bucketNamed returns the stack bucket for "" or its own name, otherwise the
// named bucket, imported once by name.
func (js *jobStack) bucketNamed(name string) awss3.IBucket {
	if name == "" || name == js.cfg.Stack.Bucket {
		return js.bucket()
	}
	return js.importOnce("OutputBucket-"+name, func(id string) any {
		return awss3.Bucket_FromBucketName(js.stack, jsii.String(id), jsii.String(name))
	}).(awss3.IBucket)
}
