package main

import (
	"fmt"
	"regexp"
	"strings"
	"time"

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

	"github.com/changes-worker/changes-worker/shared/claimcheck"
)

// Environment the functions read.
const (
	envConfigFile   = "CHANGES_CONFIG_FILE"
	envBucket       = "CHANGES_BUCKET"
	envSecretPrefix = "CHANGES_ENV_SECRET_PREFIX"
)

const (
	pollerMemoryMB = 256
	writerMemoryMB = 512
	// pollersPerJob is the poller's reserved concurrency per job: the active
	// invocation plus the hot standby the next schedule tick starts.
	pollersPerJob = 2
	// batchingWindowSeconds lets standard-queue batches fill up a little.
	batchingWindowSeconds = 1
	// minMaxConcurrency is the lowest MaximumConcurrency Lambda accepts.
	minMaxConcurrency = 2
)

// addFunctions creates the poller and the writer, the poller's schedules, the
// writer's event sources, and grants each exactly what it calls. The local
// variant gets the functions' roles and log groups only (see variant).
func (s *changesStack) addFunctions() {
	secrets := s.newSecretGrants()

	s.poller = s.newFunction("Poller", fnPoller, functionOptions{
		description: "changes-worker poller: reads each job's _changes feed under a lease and queues the changes",
		timeout:     s.cfg.Stack.PollerTimeout.D().Seconds(),
		memoryMB:    pollerMemoryMB,
		reserved:    jsii.Number(float64(pollersPerJob * len(s.cfg.Jobs))),
	})
	s.writer = s.newFunction("Writer", fnWriter, functionOptions{
		description: "changes-worker writer: delivers queued changes to PostgreSQL, HTTP and S3 outputs",
		timeout:     s.cfg.Stack.WriterTimeout.D().Seconds(),
		memoryMB:    writerMemoryMB,
	})

	s.grantPoller()
	s.grantWriter()
	secrets.grant(s.poller.role, s.in.sourceSecrets)
	secrets.grant(s.writer.role, s.in.outputSecrets)
	if !s.in.variant.functions() {
		// The event sources grant the writer its work queues; without them,
		// the role gets the same grant directly.
		for _, r := range s.routes {
			r.queue.GrantConsumeMessages(s.writer.role)
		}
		return
	}
	s.addSchedules()
	s.addEventSources()
}

type functionOptions struct {
	description string
	timeout     float64 // seconds
	memoryMB    float64
	reserved    *float64
}

// newFunction creates a function named <prefix>-<name> with its own role and
// log group. The role starts empty: every permission is added explicitly. In
// the local variant only the role and the log group are created.
func (s *changesStack) newFunction(id, name string, o functionOptions) *function {
	fnName := s.cfg.Stack.Prefix + "-" + name
	logs := awslogs.NewLogGroup(s.stack, jsii.String(id+"Logs"), &awslogs.LogGroupProps{
		LogGroupName:  jsii.String("/aws/lambda/" + fnName),
		Retention:     retention(s.cfg.Stack.LogRetentionDays),
		RemovalPolicy: s.removalPolicy(),
	})
	role := awsiam.NewRole(s.stack, jsii.String(id+"Role"), &awsiam.RoleProps{
		AssumedBy:   awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil),
		Description: jsii.String("Execution role of " + fnName),
	})
	logs.GrantWrite(role)
	if !s.in.variant.functions() {
		return &function{name: fnName, role: role, logs: logs}
	}

	props := &awslambda.FunctionProps{
		FunctionName: jsii.String(fnName),
		Description:  jsii.String(o.description),
		Runtime:      awslambda.Runtime_PROVIDED_AL2023(),
		Architecture: s.in.architecture(),
		Handler:      jsii.String("bootstrap"),
		Code:         awslambda.Code_FromAsset(jsii.String(s.in.code[name]), nil),
		MemorySize:   jsii.Number(o.memoryMB),
		Timeout:      awscdk.Duration_Seconds(jsii.Number(o.timeout)),
		Role:         role,
		LogGroup:     logs,
		// JSON logs: the functions log with slog through lambdacontext, which
		// adds the request id and follows this format.
		LoggingFormat: awslambda.LoggingFormat_JSON,
		Environment: &map[string]*string{
			// Relative: the functions take it from LAMBDA_TASK_ROOT, where
			// their code is unpacked (/var/task on AWS).
			envConfigFile:   jsii.String(bundledConfigName),
			envBucket:       s.bucket.BucketName(),
			envSecretPrefix: jsii.String(s.cfg.Stack.Prefix + "/"),
		},
		ReservedConcurrentExecutions: o.reserved,
	}
	if name == fnPoller {
		// A schedule tick is worth nothing once the next one is due: never
		// retry a failed poller invocation, drop ticks older than a minute.
		props.RetryAttempts = jsii.Number(0)
		props.MaxEventAge = awscdk.Duration_Seconds(jsii.Number(60))
	}
	s.placeInVPC(props, role)
	fn := awslambda.NewFunction(s.stack, jsii.String(id), props)
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
func (s *changesStack) placeInVPC(props *awslambda.FunctionProps, role awsiam.Role) {
	v := s.cfg.Stack.VPC
	if v == nil {
		return
	}
	var subnets []awsec2.ISubnet
	for _, id := range v.SubnetIDs {
		subnets = append(subnets, s.importOnce("Subnet-"+id, func(cid string) any {
			subnet := awsec2.Subnet_FromSubnetId(s.stack, jsii.String(cid), jsii.String(id))
			// Lambda needs only the subnet id; nothing here reads a route table.
			awscdk.Annotations_Of(subnet).AcknowledgeWarning(jsii.String("@aws-cdk/aws-ec2:noSubnetRouteTableId"),
				jsii.String("the function placement uses the subnet id only"))
			return subnet
		}).(awsec2.ISubnet))
	}
	var groups []awsec2.ISecurityGroup
	for _, id := range v.SecurityGroupIDs {
		groups = append(groups, s.importOnce("SecurityGroup-"+id, func(cid string) any {
			return awsec2.SecurityGroup_FromSecurityGroupId(s.stack, jsii.String(cid), jsii.String(id),
				&awsec2.SecurityGroupImportOptions{Mutable: jsii.Bool(false)})
		}).(awsec2.ISecurityGroup))
	}
	props.Vpc = s.importOnce("Vpc", func(cid string) any {
		return awsec2.Vpc_FromVpcAttributes(s.stack, jsii.String(cid), &awsec2.VpcAttributes{
			VpcId:             jsii.String(v.ID),
			AvailabilityZones: s.stack.AvailabilityZones(),
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
	s.suppressWildcards(role, "Lambda creates and deletes the function's network interfaces in the configured subnets with the execution role; ec2:DescribeNetworkInterfaces and ec2:DescribeSubnets support no resource-level permissions.",
		`^Resource::\*$`)
}

// importOnce returns the construct made by mk under id, making it on first use.
func (s *changesStack) importOnce(id string, mk func(id string) any) any {
	if s.imported == nil {
		s.imported = map[string]any{}
	}
	if c, ok := s.imported[id]; ok {
		return c
	}
	c := mk(id)
	s.imported[id] = c
	return c
}

// grantPoller lets the poller hold leases and checkpoints in the table, send
// to the work queues and write claim checks.
func (s *changesStack) grantPoller() {
	role := s.poller.role
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("LeaseAndCheckpoint"),
		Actions:   jsii.Strings("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:ConditionCheckItem"),
		Resources: &[]*string{s.table.TableArn()},
	}))
	var queues []*string
	for _, r := range s.routes {
		queues = append(queues, r.queue.QueueArn())
	}
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("SendToWorkQueues"),
		Actions:   jsii.Strings("sqs:SendMessage", "sqs:GetQueueUrl", "sqs:GetQueueAttributes"),
		Resources: &queues,
	}))
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("WriteClaimChecks"),
		Actions:   jsii.Strings("s3:PutObject"),
		Resources: s.claimCheckObjects(),
	}))
	patterns := s.claimCheckPatterns()
	for _, j := range s.cfg.Jobs {
		a := j.Attachments
		if a == nil || !a.Enabled {
			continue
		}
		b := s.bucketNamed(a.Bucket)
		// HEAD (s3:GetObject) finds an attachment already copied; ListBucket,
		// limited to the prefix, makes a missing one answer 404 rather than
		// 403. PutObject covers the multipart upload's calls but its abort.
		role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:       jsii.String("CopyAttachments" + sidSuffix(j.ID)),
			Actions:   jsii.Strings("s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"),
			Resources: &[]*string{b.ArnForObjects(jsii.String(a.Prefix + "*"))},
		}))
		role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:        jsii.String("ListAttachments" + sidSuffix(j.ID)),
			Actions:    jsii.Strings("s3:ListBucket"),
			Resources:  &[]*string{b.BucketArn()},
			Conditions: &map[string]any{"StringLike": map[string]any{"s3:prefix": []string{a.Prefix + "*"}}},
		}))
		patterns = append(patterns, `^Resource::.*/`+regexp.QuoteMeta(a.Prefix)+`\*$`)
	}
	s.suppressWildcards(role, "The poller writes claim-check payloads under generated keys, limited to the claim-check prefix of each configured job in the stack bucket, and copies attachments under each job's attachments prefix.",
		patterns...)
}

// sidSuffix turns a job id into characters a statement id allows.
func sidSuffix(id string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, id)
}

// claimCheckObjects are the claim checks of the configured jobs: one object
// ARN pattern per job, claim-check/<job>/*, in the stack bucket.
func (s *changesStack) claimCheckObjects() *[]*string {
	var arns []*string
	for _, j := range s.cfg.Jobs {
		arns = append(arns, s.bucket.ArnForObjects(jsii.String(claimcheck.Prefix(j.ID)+"*")))
	}
	return &arns
}

// claimCheckPatterns match the cdk-nag findings of claimCheckObjects.
func (s *changesStack) claimCheckPatterns() []string {
	var patterns []string
	for _, j := range s.cfg.Jobs {
		patterns = append(patterns, `^Resource::.*/`+regexp.QuoteMeta(claimcheck.Prefix(j.ID))+`\*$`)
	}
	return patterns
}

// grantWriter lets the writer move failures to the DLQs, read claim checks
// and write its S3 outputs. Consuming the work queues is granted by the
// event sources.
func (s *changesStack) grantWriter() {
	role := s.writer.role
	var dlqs []*string
	for _, r := range s.routes {
		dlqs = append(dlqs, r.dlq.QueueArn())
	}
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("MovePermanentFailuresToDLQ"),
		Actions:   jsii.Strings("sqs:SendMessage", "sqs:GetQueueUrl"),
		Resources: &dlqs,
	}))
	halting := false
	for _, r := range s.routes {
		halting = halting || r.out.Halts()
	}
	if halting {
		// Outputs with on_failure halt: the writer records, reads and clears
		// the halt items of the state table, and only those.
		role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:       jsii.String("HaltRecords"),
			Actions:   jsii.Strings("dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"),
			Resources: &[]*string{s.table.TableArn()},
			Conditions: &map[string]any{
				"ForAllValues:StringLike": map[string]any{"dynamodb:LeadingKeys": []string{"halt/*"}},
			},
		}))
	}
	// Without s3:ListBucket, S3 answers a GetObject of a missing claim check
	// with 403 instead of 404; the writer counts both as permanent.
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("ReadClaimChecks"),
		Actions:   jsii.Strings("s3:GetObject"),
		Resources: s.claimCheckObjects(),
	}))
	patterns := s.claimCheckPatterns()
	n := 0
	for _, r := range s.routes {
		o := r.out
		if o.S3 == nil {
			continue
		}
		n++
		b := s.outputBucket(o)
		if o.S3.Prefix == "" {
			awscdk.Annotations_Of(s.stack).AddWarningV2(jsii.String("changes-worker:s3-output-without-prefix"),
				jsii.String(fmt.Sprintf("output %s of job %s has no s3.prefix: the writer may write anywhere in bucket %s", o.ID, r.job.ID, o.S3.Bucket)))
		}
		// HeadObject is authorised by s3:GetObject. ListBucket, limited to the
		// prefix, makes a missing object answer 404 rather than 403.
		role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:       jsii.String(fmt.Sprintf("WriteS3Output%d", n)),
			Actions:   jsii.Strings("s3:GetObject", "s3:PutObject", "s3:DeleteObject"),
			Resources: &[]*string{b.ArnForObjects(jsii.String(o.S3.Prefix + "*"))},
		}))
		role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:        jsii.String(fmt.Sprintf("ListS3Output%d", n)),
			Actions:    jsii.Strings("s3:ListBucket"),
			Resources:  &[]*string{b.BucketArn()},
			Conditions: &map[string]any{"StringLike": map[string]any{"s3:prefix": []string{o.S3.Prefix + "*"}}},
		}))
		patterns = append(patterns, `^Resource::.*/`+regexp.QuoteMeta(o.S3.Prefix)+`\*$`)
	}
	s.suppressWildcards(role, "The writer reads claim-check payloads under each configured job's claim-check prefix and writes one object per document under each S3 output's prefix; every object grant is limited to those prefixes.",
		patterns...)
}

// addSchedules creates one EventBridge rule per job that invokes the poller
// with {"job": "<id>"}.
func (s *changesStack) addSchedules() {
	for _, j := range s.cfg.Jobs {
		if s.cfg.Stack.PollerTimeout.D() < j.Schedule.D()+15*time.Second {
			// Not an error, but the pipeline pauses every cycle: the next
			// invocation starts only after this one has released the lease.
			awscdk.Annotations_Of(s.stack).AddWarningV2(jsii.String("changes-worker:no-standby-"+j.ID), jsii.String(fmt.Sprintf(
				"stack.poller_timeout (%s) should exceed job %s's schedule (%s) by at least 15s so that a standby is always waiting",
				s.cfg.Stack.PollerTimeout.D(), j.ID, j.Schedule.D())))
		}
		awsevents.NewRule(s.stack, jsii.String("Schedule-"+j.ID), &awsevents.RuleProps{
			RuleName:    s.name(j.ID + "-schedule"),
			Description: jsii.String("Starts the changes-worker poller for job " + j.ID),
			Schedule:    awsevents.Schedule_Rate(awscdk.Duration_Minutes(jsii.Number(j.Schedule.D().Minutes()))),
			Enabled:     jsii.Bool(!s.in.schedulesDisabled),
			Targets: &[]awsevents.IRuleTarget{awseventstargets.NewLambdaFunction(s.poller.fn, &awseventstargets.LambdaFunctionProps{
				Event:         awsevents.RuleTargetInput_FromObject(map[string]any{"job": j.ID}),
				MaxEventAge:   awscdk.Duration_Seconds(jsii.Number(60)),
				RetryAttempts: jsii.Number(2),
			})},
		})
	}
}

// addEventSources subscribes the writer to every work queue.
func (s *changesStack) addEventSources() {
	for _, r := range s.routes {
		props := &awslambdaeventsources.SqsEventSourceProps{
			BatchSize:               jsii.Number(float64(r.out.BatchSize)),
			ReportBatchItemFailures: jsii.Bool(true),
			MaxConcurrency:          jsii.Number(float64(max(minMaxConcurrency, r.out.MaxConcurrency))),
		}
		if !r.out.FIFO() {
			props.MaxBatchingWindow = awscdk.Duration_Seconds(jsii.Number(batchingWindowSeconds))
		}
		s.writer.fn.AddEventSource(awslambdaeventsources.NewSqsEventSource(r.queue, props))
	}
}

// retention converts a number of days (checked by checkRetention) to the
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
