package main

import (
	"fmt"
	"regexp"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awseventstargets"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambdaeventsources"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/jsii-runtime-go"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/statetable/halt"
	"github.com/changes-worker/changes-worker/shared/statetable/outage"
	"github.com/changes-worker/changes-worker/shared/statetable/quarantine"
)

// Environment the functions read.
const (
	envJobConfig    = "CHANGES_CONFIG"
	envConfigFile   = "CHANGES_CONFIG_FILE"
	envBucket       = "CHANGES_BUCKET"
	envSecretPrefix = "CHANGES_ENV_SECRET_PREFIX"
	envAWSCalls     = awsconf.EnvCalls
)

const (
	// minPollers is the least reserved concurrency of a job's poller: the
	// active invocation and its standby.
	minPollers = 2
	// batchingWindowSeconds lets standard-queue batches fill up a little.
	batchingWindowSeconds = 1
	// minMaxConcurrency is the lowest MaximumConcurrency Lambda accepts.
	minMaxConcurrency = 2
)

// addFunctions creates the job's poller and writer, the poller's schedule,
// the writer's event sources, and grants each exactly what it calls for this
// job. The local variant gets the functions' roles and log groups only (see
// variant).
func (js *jobStack) addFunctions() {
	js.poller = js.newFunction("Poller", fnPoller, functionOptions{
		description: "changes-worker poller of job " + js.job.ID + ": reads its _changes feed under a lease and queues the changes",
		timeout:     js.cfg.PollerTimeout(js.job).Seconds(),
		memoryMB:    float64(js.cfg.Stack.PollerMemoryMB),
		reserved:    jsii.Number(float64(pollerConcurrency(js.cfg, js.job))),
	})
	js.writer = js.newFunction("Writer", fnWriter, functionOptions{
		description: "changes-worker writer of job " + js.job.ID + ": delivers its queued changes to the outputs",
		timeout:     js.cfg.Stack.WriterTimeout.D().Seconds(),
		memoryMB:    float64(js.cfg.Stack.WriterMemoryMB),
	})

	js.grantPoller()
	js.grantWriter()
	sources, outputs := jobSecretRefs(js.job)
	js.grantSecrets(js.poller.role, sources)
	js.grantSecrets(js.writer.role, outputs)
	if !js.app.in.variant.functions() {
		// The event sources grant the writer its work queues; without them,
		// the role gets the same grant directly.
		for _, r := range js.routes {
			r.queue.GrantConsumeMessages(js.writer.role)
		}
		return
	}
	js.addSchedule()
	js.addEventSources()
	js.addProbe()
}

type functionOptions struct {
	description string
	timeout     float64 // seconds
	memoryMB    float64
	reserved    *float64
}

// function is a Lambda function with the role and log group made for it. In
// the local variant fn is nil: only the role and the log group exist.
type function struct {
	name string // <prefix>-<job>-<poller|writer>
	fn   awslambda.Function
	role awsiam.Role
	logs awslogs.LogGroup
}

// functionName is the name of job j's function fn (fnPoller or fnWriter).
func functionName(cfg *config.File, j *config.Job, fn string) string { return cfg.FunctionName(j, fn) }

// scheduleName is the name of the rule that starts job j's poller.
func scheduleName(cfg *config.File, j *config.Job) string { return cfg.ScheduleName(j) }

// newFunction creates the job's function <prefix>-<job>-<name> with its own
// role and log group. The role starts empty: every permission is added
// explicitly. In the local variant only the role and the log group are
// created. Construct ids carry the job's id, so that ids are unique across
// the whole app.
func (js *jobStack) newFunction(kind, name string, o functionOptions) *function {
	s := js.app
	id := kind + "-" + js.job.ID
	fnName := functionName(js.cfg, js.job, name)
	logs := awslogs.NewLogGroup(js.stack, jsii.String(kind+"Logs-"+js.job.ID), &awslogs.LogGroupProps{
		LogGroupName:  jsii.String("/aws/lambda/" + fnName),
		Retention:     retention(s.cfg.Stack.LogRetentionDays),
		RemovalPolicy: s.removalPolicy(),
	})
	role := awsiam.NewRole(js.stack, jsii.String(kind+"Role-"+js.job.ID), &awsiam.RoleProps{
		AssumedBy:   awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil),
		Description: jsii.String("Execution role of " + fnName),
	})
	logs.GrantWrite(role)
	if !s.in.variant.functions() {
		return &function{name: fnName, role: role, logs: logs}
	}

	// The code is the kind's, the same for every job, and the job's
	// configuration is in the environment; a configuration too large for
	// it is in code of the job's own.
	env := map[string]*string{envBucket: js.bucket().BucketName()}
	for k, v := range s.in.environment() {
		env[k] = jsii.String(v)
	}
	code := s.in.code[name]
	if doc, ok := s.in.jobConfigs[js.job.ID]; ok {
		env[envJobConfig] = jsii.String(doc)
	} else {
		code = s.in.ownCode[js.job.ID][name]
		// Relative: the functions take it from LAMBDA_TASK_ROOT, where
		// their code is unpacked (/var/task on AWS).
		env[envConfigFile] = jsii.String(bundledConfigName)
	}
	props := &awslambda.FunctionProps{
		FunctionName: jsii.String(fnName),
		Description:  jsii.String(o.description),
		Runtime:      awslambda.Runtime_PROVIDED_AL2023(),
		Architecture: s.in.architecture(),
		Handler:      jsii.String("bootstrap"),
		Code:         awslambda.Code_FromAsset(jsii.String(code), nil),
		MemorySize:   jsii.Number(o.memoryMB),
		Timeout:      awscdk.Duration_Seconds(jsii.Number(o.timeout)),
		Role:         role,
		LogGroup:     logs,
		// JSON logs: the functions log with slog through lambdacontext, which
		// adds the request id and follows this format.
		LoggingFormat:                awslambda.LoggingFormat_JSON,
		Environment:                  &env,
		ReservedConcurrentExecutions: o.reserved,
	}
	if name == fnPoller {
		// A schedule tick is worth nothing once the next one is due: never
		// retry a failed poller invocation, drop ticks older than a minute.
		props.RetryAttempts = jsii.Number(0)
		props.MaxEventAge = awscdk.Duration_Seconds(jsii.Number(60))
	}
	js.placeInVPC(props, role)
	fn := awslambda.NewFunction(js.stack, jsii.String(id), props)
	// The function depends on its role construct, so that the role's policy
	// exists before Lambda checks it; the CDK renders that as DependsOn on the
	// role too, which the Role GetAtt already implies (cfn-lint W3005).
	fn.Node().DefaultChild().(awscdk.CfnResource).AddMetadata(jsii.String("cfn-lint"),
		map[string]any{"config": map[string]any{"ignore_checks": []string{"W3005"}}})
	return &function{name: fnName, fn: fn, role: role, logs: logs}
}

// Lambda metrics of a function, in the AWS/Lambda namespace.
const (
	lambdaInvocations = "Invocations"
	lambdaErrors      = "Errors"
	lambdaThrottles   = "Throttles"
	lambdaDuration    = "Duration"
)

// metric returns one of the function's Lambda metrics. Without the function
// (local variant) it is the same metric, named by the function's name.
func (f *function) metric(name string, opts *awscloudwatch.MetricOptions) awscloudwatch.IMetric {
	if f.fn != nil {
		switch name {
		case lambdaInvocations:
			return f.fn.MetricInvocations(opts)
		case lambdaErrors:
			return f.fn.MetricErrors(opts)
		case lambdaThrottles:
			return f.fn.MetricThrottles(opts)
		case lambdaDuration:
			return f.fn.MetricDuration(opts)
		}
		return f.fn.Metric(jsii.String(name), opts)
	}
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:     jsii.String("AWS/Lambda"),
		MetricName:    jsii.String(name),
		DimensionsMap: &map[string]*string{"FunctionName": jsii.String(f.name)},
		Period:        opts.Period,
		Statistic:     opts.Statistic,
	})
}

// placeInVPC puts the function into the VPC named by stack.vpc, if any.
func (js *jobStack) placeInVPC(props *awslambda.FunctionProps, role awsiam.Role) {
	v := js.cfg.Stack.VPC
	if v == nil {
		return
	}
	var subnets []awsec2.ISubnet
	for _, id := range v.SubnetIDs {
		subnets = append(subnets, js.importOnce("Subnet-"+id, func(cid string) any {
			subnet := awsec2.Subnet_FromSubnetId(js.stack, jsii.String(cid), jsii.String(id))
			// Lambda needs only the subnet id; nothing here reads a route table.
			awscdk.Annotations_Of(subnet).AcknowledgeWarning(jsii.String("@aws-cdk/aws-ec2:noSubnetRouteTableId"),
				jsii.String("the function placement uses the subnet id only"))
			return subnet
		}).(awsec2.ISubnet))
	}
	var groups []awsec2.ISecurityGroup
	for _, id := range v.SecurityGroupIDs {
		groups = append(groups, js.importOnce("SecurityGroup-"+id, func(cid string) any {
			return awsec2.SecurityGroup_FromSecurityGroupId(js.stack, jsii.String(cid), jsii.String(id),
				&awsec2.SecurityGroupImportOptions{Mutable: jsii.Bool(false)})
		}).(awsec2.ISecurityGroup))
	}
	props.Vpc = js.importOnce("Vpc", func(cid string) any {
		return awsec2.Vpc_FromVpcAttributes(js.stack, jsii.String(cid), &awsec2.VpcAttributes{
			VpcId:             jsii.String(v.ID),
			AvailabilityZones: js.stack.AvailabilityZones(),
		})
	}).(awsec2.IVpc)
	props.VpcSubnets = &awsec2.SubnetSelection{Subnets: &subnets}
	props.SecurityGroups = &groups
	// Lambda manages the function's network interfaces with the execution
	// role. These EC2 actions take no resource-level scope that Lambda's
	// own check accepts (DescribeNetworkInterfaces has none at all).
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid: jsii.String("VPCNetworkInterfaces"),
		Actions: jsii.Strings(
			"ec2:CreateNetworkInterface",
			"ec2:DescribeNetworkInterfaces",
			"ec2:DescribeSubnets",
			"ec2:DeleteNetworkInterface",
			"ec2:AssignPrivateIpAddresses",
			"ec2:UnassignPrivateIpAddresses",
		),
		Resources: jsii.Strings("*"),
	}))
	js.allowWildcards(nagVPCReason, `^Resource::\*$`)
}

// grantPoller lets the job's poller hold the job's lease and checkpoint and
// record its quarantine entries in the table, send to the job's work queues,
// write the job's claim checks, archive its DLQs, copy its attachments and,
// after a failover, invoke itself to start a standby.
func (js *jobStack) grantPoller() {
	j, role := js.job, js.poller.role
	if js.app.in.variant.functions() {
		role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:       jsii.String("StartStandbyAfterFailover"),
			Actions:   jsii.Strings("lambda:InvokeFunction"),
			Resources: &[]*string{js.functionARN(js.poller.name)},
		}))
	}
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("LeaseAndCheckpoint"),
		Actions:   jsii.Strings("dynamodb:GetItem", "dynamodb:UpdateItem"),
		Resources: &[]*string{js.table.TableArn()},
		Conditions: &map[string]any{
			"ForAllValues:StringLike": map[string]any{"dynamodb:LeadingKeys": []string{j.ID, quarantine.Prefix(j.ID) + "*", dlq.SweepKey(j.ID)}},
		},
	}))
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("SendToWorkQueues"),
		Actions:   jsii.Strings("sqs:SendMessage", "sqs:GetQueueUrl"),
		Resources: js.workQueueARNs(),
	}))
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("WriteClaimChecks"),
		Actions:   jsii.Strings("s3:PutObject"),
		Resources: &[]*string{js.claimCheckObjects()},
	}))
	js.allowWildcards(nagObjectsReason, js.claimCheckPattern())
	js.grantArchive()
	a := j.Attachments
	if a == nil || !a.Enabled {
		return
	}
	b := js.bucketNamed(a.Bucket)
	// HEAD (s3:GetObject) finds an attachment already copied; ListBucket,
	// limited to the prefix, makes a missing one answer 404 rather than
	// 403. PutObject covers the multipart upload's calls but its abort.
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("CopyAttachments"),
		Actions:   jsii.Strings("s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"),
		Resources: &[]*string{b.ArnForObjects(jsii.String(a.Prefix + "*"))},
	}))
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("ListAttachments"),
		Actions:    jsii.Strings("s3:ListBucket"),
		Resources:  &[]*string{b.BucketArn()},
		Conditions: &map[string]any{"StringLike": map[string]any{"s3:prefix": []string{a.Prefix + "*"}}},
	}))
	js.allowWildcards(nagObjectsReason, prefixPattern(a.Prefix))
}

// claimCheckObjects are the claim checks the job's poller writes:
// claim-check/<job>/<prefix>/* in the stack bucket.
// workQueueARNs are the ARNs of the job's work queues.
func (js *jobStack) workQueueARNs() *[]*string {
	queues := make([]*string, 0, len(js.routes))
	for _, r := range js.routes {
		queues = append(queues, r.queue.QueueArn())
	}
	return &queues
}

func (js *jobStack) claimCheckObjects() *string {
	return js.bucket().ArnForObjects(jsii.String(js.claimCheckPrefix() + "*"))
}

func (js *jobStack) claimCheckPrefix() string {
	return claimcheck.Prefix(js.cfg.Stack.Prefix, js.job.ID)
}

// claimCheckPattern matches the cdk-nag finding of claimCheckObjects.
func (js *jobStack) claimCheckPattern() string { return prefixPattern(js.claimCheckPrefix()) }

// prefixPattern matches the cdk-nag finding of an object grant on prefix*.
func prefixPattern(prefix string) string {
	return `^Resource::.*/` + regexp.QuoteMeta(prefix) + `\*$`
}

// grantWriter lets the job's writer send to the job's work queues and DLQs,
// keep the halt records of the job's outputs, read the job's claim checks,
// write its S3 outputs and turn its own event source mappings off and on.
// Consuming the work queues is granted by the event sources.
func (js *jobStack) grantWriter() {
	j, role := js.job, js.writer.role
	// The writer moves failures to the DLQs, and sends a message of a
	// standard queue it holds back for an output that is down or asks it to
	// slow down to the work queue again, with a fresh receive count
	// (writer.deferMessage): without that send, SQS would dead-letter the
	// held messages.
	var queues []*string
	for _, r := range js.routes {
		queues = append(queues, r.queue.QueueArn(), r.dlq.QueueArn())
	}
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("SendToQueuesAndDLQs"),
		Actions:   jsii.Strings("sqs:SendMessage", "sqs:GetQueueUrl"),
		Resources: &queues,
	}))
	// The writer records, reads and clears the outage items of this job's
	// outputs (an output that is down) and, for outputs with on_failure
	// halt, their halt items; no other item of the table.
	keys := []string{outage.JobPrefix(j.ID) + "*"}
	for _, r := range js.routes {
		if r.out.Halts() {
			keys = append(keys, halt.JobPrefix(j.ID)+"*")
			break
		}
	}
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("OutputRecords"),
		Actions:   jsii.Strings("dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"),
		Resources: &[]*string{js.table.TableArn()},
		Conditions: &map[string]any{
			"ForAllValues:StringLike": map[string]any{"dynamodb:LeadingKeys": keys},
		},
	}))
	// Without s3:ListBucket, S3 answers a GetObject of a missing claim check
	// with 403 instead of 404; the writer counts both as permanent. The job's
	// prefix claim-check/<job>/ holds the poller's (claim-check/<job>/<prefix>/)
	// and those that messages queued by a release before 1.0.0 may point at
	// (claimcheck.UnscopedPrefix).
	unscoped := claimcheck.UnscopedPrefix(j.ID)
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("ReadClaimChecks"),
		Actions:   jsii.Strings("s3:GetObject"),
		Resources: &[]*string{js.bucket().ArnForObjects(jsii.String(unscoped + "*"))},
	}))
	js.allowWildcards(nagObjectsReason, prefixPattern(unscoped))
	for n, r := range js.routes {
		o := r.out
		if o.S3 == nil {
			continue
		}
		// HeadObject is authorised by s3:GetObject.
		js.grantS3Output(role, n, o, "WriteS3Output", "s3:GetObject", "s3:PutObject", "s3:DeleteObject")
	}
	if js.app.in.variant.functions() && js.pausesIntake() {
		// While it holds a FIFO output's changes, the writer turns its own
		// event source mapping of the output's queue off, and its probe
		// turns it on again (writer.Mappings). It finds the mapping among
		// its function's (ListEventSourceMappings takes no resource) and
		// may update the mappings of its own function only.
		fn := js.functionARN(js.writer.name)
		role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:       jsii.String("FindOwnEventSourceMappings"),
			Actions:   jsii.Strings("lambda:ListEventSourceMappings"),
			Resources: jsii.Strings("*"),
		}))
		role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:     jsii.String("SwitchOwnEventSourceMappings"),
			Actions: jsii.Strings("lambda:UpdateEventSourceMapping"),
			Resources: &[]*string{js.stack.FormatArn(&awscdk.ArnComponents{Service: jsii.String("lambda"), Resource: jsii.String("event-source-mapping"),
				ResourceName: jsii.String("*"), ArnFormat: awscdk.ArnFormat_COLON_RESOURCE_NAME})},
			Conditions: &map[string]any{"StringEquals": map[string]any{"lambda:FunctionArn": fn}},
		}))
		js.allowWildcards(nagMappingsReason, `^Resource::\*$`)
		js.allowWildcards(nagMappingsReason, `^Resource::arn:.*:event-source-mapping:\*$`)
	}
}

// grantS3Output grants role actions on the objects of the n-th route's S3
// output o, under the statement id sid<n+1>, and the listing of its prefix:
// ListBucket, limited to the prefix, makes a missing object answer 404
// rather than 403. The prefix ends with '/' and holds no wildcard (config
// checks it), so <prefix>* covers the output's keys and nothing beside them.
func (js *jobStack) grantS3Output(role awsiam.Role, n int, o *config.Output, sid string, actions ...string) {
	b := js.bucketNamed(o.S3.Bucket)
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String(fmt.Sprintf("%s%d", sid, n+1)),
		Actions:   jsii.Strings(actions...),
		Resources: &[]*string{b.ArnForObjects(jsii.String(o.S3.Prefix + "*"))},
	}))
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String(fmt.Sprintf("ListS3Output%d", n+1)),
		Actions:    jsii.Strings("s3:ListBucket"),
		Resources:  &[]*string{b.BucketArn()},
		Conditions: &map[string]any{"StringLike": map[string]any{"s3:prefix": []string{o.S3.Prefix + "*"}}},
	}))
	js.allowWildcards(nagObjectsReason, prefixPattern(o.S3.Prefix))
}

// functionARN is the ARN of the function named name in the stack's account
// and region, built from the name: in a policy of the function's own role,
// a reference to the function would make the two depend on each other.
func (js *jobStack) functionARN(name string) *string {
	return js.stack.FormatArn(&awscdk.ArnComponents{Service: jsii.String("lambda"), Resource: jsii.String("function"),
		ResourceName: jsii.String(name), ArnFormat: awscdk.ArnFormat_COLON_RESOURCE_NAME})
}

// pausesIntake reports whether the job has an output on a FIFO queue, whose
// intake the writer pauses while it holds the output's changes.
func (js *jobStack) pausesIntake() bool {
	for _, r := range js.routes {
		if r.out.FIFO() {
			return true
		}
	}
	return false
}

// probeName is the name of the rule that runs job j's writer probe.
func probeName(cfg *config.File, j *config.Job) string {
	return cfg.Stack.Prefix + "-" + j.ID + "-probe"
}

// addProbe creates, for a job with an output on a FIFO queue, the
// EventBridge rule that invokes the job's writer every minute with
// {"probe": {"job": "<id>"}}: the writer tries the outputs whose intake it
// paused and resumes them once they take a change (writer.Handler.Probe).
// The rule is enabled even when the schedules are not: it queues nothing,
// and an intake paused during a deploy must come back.
func (js *jobStack) addProbe() {
	if !js.pausesIntake() {
		return
	}
	j := js.job
	awsevents.NewRule(js.stack, jsii.String("Probe-"+j.ID), &awsevents.RuleProps{
		RuleName:    jsii.String(probeName(js.cfg, j)),
		Description: jsii.String("Has the changes-worker writer of job " + j.ID + " try the outputs whose intake it paused"),
		Schedule:    awsevents.Schedule_Rate(awscdk.Duration_Minutes(jsii.Number(1))),
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(js.writer.fn, &awseventstargets.LambdaFunctionProps{
			Event:         awsevents.RuleTargetInput_FromObject(map[string]any{"probe": map[string]any{"job": j.ID}}),
			MaxEventAge:   awscdk.Duration_Seconds(jsii.Number(60)),
			RetryAttempts: jsii.Number(0),
		})},
	})
}

// pollerConcurrency is the reserved concurrency of job j's poller: every
// invocation that may run at once, from its tick (up to
// config.PollerStandbyAllowance late) to its timeout, so that no tick's
// invocation is throttled, and the one that a failover starts to stand by
// beside the new holder (pipeline), while the holder it replaced may still
// run, hung; four with the defaults (the active one, its standby, the next
// tick's for the seconds they overlap, and a failover's).
func pollerConcurrency(cfg *config.File, j *config.Job) int {
	s := j.Schedule.D()
	return max(minPollers, int((cfg.PollerTimeout(j)+config.PollerStandbyAllowance+s-1)/s)) + 1
}

// addSchedule creates the EventBridge rule that invokes the job's poller
// with {"job": "<id>"}.
func (js *jobStack) addSchedule() {
	j := js.job
	awsevents.NewRule(js.stack, jsii.String("Schedule-"+j.ID), &awsevents.RuleProps{
		RuleName:    jsii.String(scheduleName(js.cfg, j)),
		Description: jsii.String("Starts the changes-worker poller for job " + j.ID),
		Schedule:    awsevents.Schedule_Rate(awscdk.Duration_Minutes(jsii.Number(j.Schedule.D().Minutes()))),
		Enabled:     jsii.Bool(!js.app.in.schedulesDisabled),
		Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(js.poller.fn, &awseventstargets.LambdaFunctionProps{
			Event:         awsevents.RuleTargetInput_FromObject(map[string]any{"job": j.ID}),
			MaxEventAge:   awscdk.Duration_Seconds(jsii.Number(60)),
			RetryAttempts: jsii.Number(2),
		})},
	})
}

// addEventSources subscribes the job's writer to each of its work queues.
func (js *jobStack) addEventSources() {
	for _, r := range js.routes {
		props := &awslambdaeventsources.SqsEventSourceProps{
			BatchSize:               jsii.Number(float64(r.out.BatchSize)),
			ReportBatchItemFailures: jsii.Bool(true),
			MaxConcurrency:          jsii.Number(float64(max(minMaxConcurrency, r.out.MaxConcurrency))),
		}
		if !r.out.FIFO() {
			props.MaxBatchingWindow = awscdk.Duration_Seconds(jsii.Number(batchingWindowSeconds))
		}
		js.writer.fn.AddEventSource(awslambdaeventsources.NewSqsEventSource(r.queue, props))
	}
}

// retention converts a number of days (checked by config.ParseForDeploy) to the
// CDK's enumeration.
func retention(days int) awslogs.RetentionDays {
	switch days {
	case 1:
		return awslogs.RetentionDays_ONE_DAY
	case 3:
		return awslogs.RetentionDays_THREE_DAYS
	case 5:
		return awslogs.RetentionDays_FIVE_DAYS
	case 7:
		return awslogs.RetentionDays_ONE_WEEK
	case 14:
		return awslogs.RetentionDays_TWO_WEEKS
	case 30:
		return awslogs.RetentionDays_ONE_MONTH
	case 60:
		return awslogs.RetentionDays_TWO_MONTHS
	case 90:
		return awslogs.RetentionDays_THREE_MONTHS
	case 120:
		return awslogs.RetentionDays_FOUR_MONTHS
	case 150:
		return awslogs.RetentionDays_FIVE_MONTHS
	case 180:
		return awslogs.RetentionDays_SIX_MONTHS
	case 365:
		return awslogs.RetentionDays_ONE_YEAR
	case 400:
		return awslogs.RetentionDays_THIRTEEN_MONTHS
	case 545:
		return awslogs.RetentionDays_EIGHTEEN_MONTHS
	case 731:
		return awslogs.RetentionDays_TWO_YEARS
	case 1096:
		return awslogs.RetentionDays_THREE_YEARS
	case 1827:
		return awslogs.RetentionDays_FIVE_YEARS
	case 2192:
		return awslogs.RetentionDays_SIX_YEARS
	case 2557:
		return awslogs.RetentionDays_SEVEN_YEARS
	case 2922:
		return awslogs.RetentionDays_EIGHT_YEARS
	case 3288:
		return awslogs.RetentionDays_NINE_YEARS
	default:
		return awslogs.RetentionDays_TEN_YEARS
	}
}
