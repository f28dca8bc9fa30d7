package main

import (
	"fmt"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatchactions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssnssubscriptions"
	"github.com/aws/jsii-runtime-go"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/metrics"
)

const (
	// metricsLateBy is how late a data point may reach CloudWatch: the
	// poller's metrics are extracted from its logs (EMF), which Lambda's
	// documentation says may take 5 to 10 minutes to show up.
	metricsLateBy = 10 * time.Minute
	// progressPeriod is the window in which a job with pending changes must
	// checkpoint at least once.
	progressPeriod = 5 * time.Minute
	// errorPeriod is the period of the error and throttle alarms.
	errorPeriod = 5 * time.Minute
	// backpressurePeriods is how many error periods in a row an output must
	// hold the writer back before its alarm fires: a short slowdown is what
	// backpressure is for, a long one needs an operator.
	backpressurePeriods = 3
)

// keyAdminActions are what the account (and through its IAM policies, its
// administrators and CloudFormation) may do with the alarm topic's key:
// manage it, and publish test notifications. Listed one by one: no wildcard.
var keyAdminActions = []string{
	"kms:DescribeKey",
	"kms:GetKeyPolicy",
	"kms:PutKeyPolicy",
	"kms:GetKeyRotationStatus",
	"kms:EnableKeyRotation",
	"kms:DisableKeyRotation",
	"kms:ListKeyRotations",
	"kms:RotateKeyOnDemand",
	"kms:EnableKey",
	"kms:DisableKey",
	"kms:UpdateKeyDescription",
	"kms:ListResourceTags",
	"kms:TagResource",
	"kms:UntagResource",
	"kms:ListGrants",
	"kms:RevokeGrant",
	"kms:ScheduleKeyDeletion",
	"kms:CancelKeyDeletion",
	"kms:Encrypt",
	"kms:Decrypt",
	"kms:GenerateDataKey",
}

// addAlarms creates the job's alarms, in its stack. Each alarm notifies the
// shared alarm topic when it goes into ALARM.
func (js *jobStack) addAlarms() {
	js.addJobAlarms(js.job)
	for _, r := range js.routes {
		js.addRouteAlarms(r)
	}
	js.addFunctionAlarm()
}

// addFunctionAlarm creates one alarm over the job's two functions: either
// failed (error or timeout) or the writer was throttled. One alarm of three
// metrics costs what three alarms would, but is one resource and one
// notification where a broken deploy fails both functions at once.
func (js *jobStack) addFunctionAlarm() {
	failed := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String("FILL(pollerErrors, 0) + FILL(writerErrors, 0) + FILL(writerThrottles, 0)"),
		UsingMetrics: &map[string]awscloudwatch.IMetric{
			"pollerErrors":    js.poller.metric(lambdaErrors, sumOver(errorPeriod)),
			"writerErrors":    js.writer.metric(lambdaErrors, sumOver(errorPeriod)),
			"writerThrottles": js.writer.metric(lambdaThrottles, sumOver(errorPeriod)),
		},
		Period: seconds(errorPeriod),
		Label:  jsii.String("function errors and writer throttles"),
	})
	j := js.job
	js.alarm("Functions-"+j.ID, j.ID+"-functions", fmt.Sprintf("A function of job %s failed (%s or %s: error or timeout; see its log group), or the writer was throttled (the account's concurrency is exhausted).",
		j.ID, js.poller.name, js.writer.name), &awscloudwatch.AlarmProps{
		Metric:             failed,
		Threshold:          jsii.Number(0),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
}

// addAlarmTopic creates the encrypted, TLS-only topic the alarms notify. The
// key is a customer managed key: CloudWatch cannot publish to a topic
// encrypted with the AWS managed SNS key.
func (s *changesStack) addAlarmTopic() {
	policy := awsiam.NewPolicyDocument(&awsiam.PolicyDocumentProps{Statements: &[]awsiam.PolicyStatement{
		awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:        jsii.String("AccountAdministersKey"),
			Principals: &[]awsiam.IPrincipal{awsiam.NewAccountRootPrincipal()},
			Actions:    jsii.Strings(keyAdminActions...),
			// In a key policy, "*" means this key.
			Resources: jsii.Strings("*"),
		}),
		awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Sid:        jsii.String("CloudWatchAlarmsPublish"),
			Principals: &[]awsiam.IPrincipal{awsiam.NewServicePrincipal(jsii.String("cloudwatch.amazonaws.com"), nil)},
			Actions:    jsii.Strings("kms:Decrypt", "kms:GenerateDataKey"),
			Resources:  jsii.Strings("*"),
		}),
	}})
	key := awskms.NewKey(s.stack, jsii.String("AlarmTopicKey"), &awskms.KeyProps{
		Description:       jsii.String("Encrypts the alarm notifications of changes-worker " + s.cfg.Stack.Prefix),
		EnableKeyRotation: jsii.Bool(true),
		Policy:            policy,
		// The key protects notifications in flight only: nothing is lost
		// when it goes with the stack.
		PendingWindow: awscdk.Duration_Days(jsii.Number(7)),
		RemovalPolicy: awscdk.RemovalPolicy_DESTROY,
	})
	s.alarmTopic = awssns.NewTopic(s.stack, jsii.String("AlarmTopic"), &awssns.TopicProps{
		TopicName:   s.name("alarms"),
		DisplayName: jsii.String("changes-worker " + s.cfg.Stack.Prefix + " alarms"),
		MasterKey:   key,
		EnforceSSL:  jsii.Bool(true),
	})
	s.alarmTopic.AddToResourcePolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("CloudWatchAlarmsPublish"),
		Principals: &[]awsiam.IPrincipal{awsiam.NewServicePrincipal(jsii.String("cloudwatch.amazonaws.com"), nil)},
		Actions:    jsii.Strings("sns:Publish"),
		Resources:  &[]*string{s.alarmTopic.TopicArn()},
		Conditions: &map[string]any{
			"StringEquals": map[string]any{"aws:SourceAccount": s.stack.Account()},
		},
	}))
	if email := s.cfg.Stack.AlarmEmail; email != "" {
		s.alarmTopic.AddSubscription(awssnssubscriptions.NewEmailSubscription(jsii.String(email), nil))
	}
}

// addJobAlarms creates the alarms of one job's poller.
func (js *jobStack) addJobAlarms(j *config.Job) {
	js.alarmAbove("PollerErrors-"+j.ID, j.ID+"-poller-errors", fmt.Sprintf("The poller of job %s reported errors (PollerErrors).", j.ID), jobMetric(metrics.PollerErrors, j, "Sum", errorPeriod), 0)

	js.alarmAbove("SourceAuthFailures-"+j.ID, j.ID+"-source-auth-failures", fmt.Sprintf("The source of job %s refused our credentials (401/403, SourceAuthFailures). Check the job's source credentials.", j.ID), jobMetric(metrics.SourceAuthFailures, j, "Sum", errorPeriod), 0)
	js.alarmAbove("Flood-"+j.ID, j.ID+"-flood", fmt.Sprintf("A poller invocation of job %s read more than %d changes (feed.flood_threshold, FloodBatches): the source is spiking.", j.ID, j.Feed.FloodThreshold), jobMetric(metrics.FloodBatches, j, "Sum", errorPeriod), 0)

	// Feed rows that name no document were skipped (each one recorded), or
	// a page the poller cannot read holds the job at one position.
	js.alarmAbove("MalformedRows-"+j.ID, j.ID+"-malformed-rows", fmt.Sprintf("The poller of job %s skipped feed rows that name no document (MalformedRows); each is recorded with its reason and bytes in the job's quarantine: see changesctl status.", j.ID), jobMetric(metrics.MalformedRows, j, "Sum", errorPeriod), 0)
	js.alarmAbove("BlockedPage-"+j.ID, j.ID+"-blocked-page", fmt.Sprintf("The poller of job %s is blocked on a page of the feed it cannot read (MalformedPages) and does not move past it; the position and the reason are in the job's quarantine: see changesctl status.", j.ID), jobMetric(metrics.MalformedPages, j, "Sum", errorPeriod), 0)

	// Documents delivered without the copy of an attachment that cannot be
	// made (each one recorded).
	if a := j.Attachments; a != nil && a.Enabled {
		js.alarmAbove("AttachmentsNotCopied-"+j.ID, j.ID+"-attachments-not-copied", fmt.Sprintf("The poller of job %s delivered documents without the copy of an attachment that cannot be made (AttachmentsQuarantined): content that does not match its entry, an invalid entry, an object S3 refuses, or a transfer that failed attachments.attempts times; each is recorded with its reason in the job's quarantine: see changesctl status.", j.ID), jobMetric(metrics.AttachmentsQuarantined, j, "Sum", errorPeriod), 0)
	}

	// No checkpoint in a whole window while the source reports pending changes.
	stalled := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String("IF(pending > 0 AND FILL(checkpoints, 0) == 0, 1, 0)"),
		UsingMetrics: &map[string]awscloudwatch.IMetric{
			"pending":     jobMetric(metrics.PendingChanges, j, "Maximum", progressPeriod),
			"checkpoints": jobMetric(metrics.Checkpoints, j, "Sum", progressPeriod),
		},
		Period: seconds(progressPeriod),
		Label:  jsii.String("stalled (1) while changes are pending"),
	})
	js.alarm("NoProgress-"+j.ID, j.ID+"-no-progress", fmt.Sprintf("Job %s has pending changes at its source but made no checkpoint in %s.", j.ID, progressPeriod), &awscloudwatch.AlarmProps{
		Metric:             stalled,
		Threshold:          jsii.Number(1),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		EvaluationPeriods:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})

	js.addLeaseHolderAlarm(j)
}

// addLeaseHolderAlarm creates the alarm that fires when no poller holds the
// job's lease. Both metrics it reads arrive late: the poller's Role is
// extracted from its logs (EMF), and Lambda reports an invocation, and so
// its Invocations, when the invocation ends. A period breaches when the
// poller was not invoked in it, or when only standbys reported Role (0); a
// period without Role is no breach by itself while the poller is invoked,
// and no data at all means nothing runs. The alarm fires only when every
// one of its periods breaches, so the latest ones, whose metrics may still
// be on their way (leaseAlarmPeriods), never fire it alone. Its periods are
// the job's schedule: whole minutes, a standard-resolution alarm.
func (js *jobStack) addLeaseHolderAlarm(j *config.Job) {
	period, timeout := j.Schedule.D(), js.cfg.PollerTimeout(j)
	held, late := leaseAlarmPeriods(j, timeout)
	noHolder := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String("IF(FILL(invocations, 0) < 1 OR FILL(role, 1) < 1, 1, 0)"),
		UsingMetrics: &map[string]awscloudwatch.IMetric{
			"role":        jobMetric(metrics.Role, j, "Maximum", period),
			"invocations": js.poller.metric(lambdaInvocations, sumOver(period)),
		},
		Period: seconds(period),
		Label:  jsii.String("no lease holder (1)"),
	})
	n := float64(held + late)
	js.alarm("NoLeaseHolder-"+j.ID, j.ID+"-no-lease-holder", fmt.Sprintf(
		"No poller of job %s held its lease for %s: none was invoked (%s Invocations) or none took the lease (Role). "+
			"The alarm judges the %s that ended %s ago: an invocation is reported when it ends, and the poller's metrics come from its logs, minutes late.",
		j.ID, time.Duration(held)*period, js.poller.name, time.Duration(held)*period, time.Duration(late)*period), &awscloudwatch.AlarmProps{
		Metric:             noHolder,
		Threshold:          jsii.Number(1),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		EvaluationPeriods:  jsii.Number(n),
		DatapointsToAlarm:  jsii.Number(n),
		TreatMissingData:   awscloudwatch.TreatMissingData_BREACHING,
	})
}

// leaseAlarmPeriods returns, in schedule periods, how long job j's
// lease-holder alarm must see no holder (held) and how many of the latest
// periods it cannot judge yet (late), for pollers with the given timeout.
//
// late: a period's metrics are complete once its last invocation has ended
// (within the poller's timeout) and its records have reached CloudWatch
// (metricsLateBy), and the period under way counts too. held: two periods
// at least; long enough to hold an invocation whatever moment of its run
// Lambda stamps it with (a schedule period plus the timeout), and a
// failover (twice the TTL, then the new holder's first batch, within the
// feed's timeout), during which an active poller reports no Role.
func leaseAlarmPeriods(j *config.Job, pollerTimeout time.Duration) (held, late int) {
	s := j.Schedule.D()
	periods := func(d time.Duration) int { return int((d + s - 1) / s) }
	held = max(2, periods(s+pollerTimeout), periods(2*j.Lease.TTL.D()+j.Feed.Timeout.D()))
	late = periods(pollerTimeout+metricsLateBy) + 1
	return held, late
}

// addRouteAlarms creates the alarms of one (job, output).
func (js *jobStack) addRouteAlarms(r *route) {
	id := r.job.ID + "-" + r.out.ID
	js.alarmAbove("DLQNotEmpty-"+id, id+"-dlq-not-empty", dlqAlarmDescription(js.cfg, r), r.dlq.MetricApproximateNumberOfMessagesVisible(maxOver(time.Minute)), 0)
	js.addArchiveAlarm(r)
	js.alarmAbove("OutputAuthFailures-"+id, id+"-output-auth-failures", fmt.Sprintf("Output %s of job %s refused our credentials (HTTP 401/403, S3 AccessDenied, PostgreSQL 28P01/28000; OutputAuthFailures). Check the output's credentials.", r.out.ID, r.job.ID), outputMetric(metrics.OutputAuthFailures, r.job, r.out, "Sum", errorPeriod), 0)
	js.alarm("Backpressure-"+id, id+"-backpressure", fmt.Sprintf("Output %s of job %s has been slow or refusing (429/503, too many connections) for %s; the writer is holding its changes back (BackpressureActive).", r.out.ID, r.job.ID, backpressurePeriods*errorPeriod), &awscloudwatch.AlarmProps{
		Metric:             outputMetric(metrics.BackpressureActive, r.job, r.out, "Minimum", errorPeriod),
		Threshold:          jsii.Number(1),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		EvaluationPeriods:  jsii.Number(backpressurePeriods),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	// The writer reports 1 for every batch it finds the output down (its
	// held messages come back at least every outage.max_retry) and 0 when
	// the output takes changes again; missing data keeps the state.
	js.alarm("OutputDown-"+id, id+"-output-down", fmt.Sprintf("Output %s of job %s is down (unreachable, refusing our credentials, its secret unusable, or failing every request; OutputDown). The writer holds its changes, dead-letters none, and delivers them when it is back. See changesctl status --job %s.", r.out.ID, r.job.ID, r.job.ID), &awscloudwatch.AlarmProps{
		Metric:             outputMetric(metrics.OutputDown, r.job, r.out, "Maximum", time.Minute),
		Threshold:          jsii.Number(1),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		EvaluationPeriods:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_IGNORE,
	})
	objective := r.job.LatencyObjective.D()
	js.alarmAbove("QueueAge-"+id, id+"-latency", fmt.Sprintf("The oldest change queued for job %s output %s is older than the job's latency objective (%s).", r.job.ID, r.out.ID, objective), r.queue.MetricApproximateAgeOfOldestMessage(maxOver(time.Minute)), objective.Seconds())
	if r.out.Halts() {
		// The writer reports 1 on every failed attempt of a halted change
		// (at most about an hour apart), and 0 once no group of the output
		// is halted: after the blocked change was delivered or skipped, or
		// after changesctl halt clear (halt.Store.Check); missing data keeps
		// the state, so the alarm stays on while the output waits.
		js.alarm("Halted-"+id, id+"-halted", fmt.Sprintf("Job %s output %s (on_failure halt) stopped at a change it cannot deliver; nothing after it is delivered. See changesctl halt show --job %s --output %s, then retry or skip it.", r.job.ID, r.out.ID, r.job.ID, r.out.ID), &awscloudwatch.AlarmProps{
			Metric:             outputMetric(metrics.OutputHalted, r.job, r.out, "Maximum", time.Minute),
			Threshold:          jsii.Number(1),
			ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
			EvaluationPeriods:  jsii.Number(1),
			TreatMissingData:   awscloudwatch.TreatMissingData_IGNORE,
		})
	}
}

// dlqAlarmDescription says what to do when r's DLQ holds messages. The
// console's redrive to the source queue cannot return the messages the
// writer moved to the DLQ itself (they have no source queue), and a FIFO DLQ
// is redriven by changesctl only (docs/operations.md says why).
func dlqAlarmDescription(cfg *config.File, r *route) string {
	redrive := fmt.Sprintf("changesctl dlq redrive --job %s --output %s", r.job.ID, r.out.ID)
	if !r.out.FIFO() {
		redrive += fmt.Sprintf(" (or the SQS console's DLQ redrive, to the custom destination %s)", cfg.QueueName(r.job, r.out))
	}
	return fmt.Sprintf("Messages of job %s output %s failed permanently or too often and wait in the DLQ %s. Fix the cause, then move them back to the work queue with %s.",
		r.job.ID, r.out.ID, cfg.DLQName(r.job, r.out), redrive)
}

// alarmAbove creates an alarm that fires when metric is above threshold
// in one period; no data is not a breach.
func (js *jobStack) alarmAbove(id, suffix, description string, metric awscloudwatch.IMetric, threshold float64) {
	js.alarm(id, suffix, description, &awscloudwatch.AlarmProps{
		Metric:             metric,
		Threshold:          jsii.Number(threshold),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
}

// alarm creates an alarm named <prefix>-<suffix> that notifies the topic.
func (js *jobStack) alarm(id, suffix, description string, props *awscloudwatch.AlarmProps) {
	props.AlarmName = js.name(suffix)
	props.AlarmDescription = jsii.String(description)
	a := awscloudwatch.NewAlarm(js.stack, jsii.String(id), props)
	a.AddAlarmAction(awscloudwatchactions.NewSnsAction(js.topic))
}

// sumOver and maxOver are the metric options of a sum and of a maximum over
// period.
func sumOver(period time.Duration) *awscloudwatch.MetricOptions {
	return &awscloudwatch.MetricOptions{Period: seconds(period), Statistic: jsii.String("Sum")}
}

func maxOver(period time.Duration) *awscloudwatch.MetricOptions {
	return &awscloudwatch.MetricOptions{Period: seconds(period), Statistic: jsii.String("Maximum")}
}

// jobMetric is one of the poller's metrics for job j.
func jobMetric(name string, j *config.Job, stat string, period time.Duration) awscloudwatch.Metric {
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:     jsii.String(metrics.Namespace),
		MetricName:    jsii.String(name),
		DimensionsMap: &map[string]*string{"Job": jsii.String(j.ID)},
		Statistic:     jsii.String(stat),
		Period:        seconds(period),
	})
}

// outputMetric is one of the writer's metrics for output o of job j.
func outputMetric(name string, j *config.Job, o *config.Output, stat string, period time.Duration) awscloudwatch.Metric {
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:     jsii.String(metrics.Namespace),
		MetricName:    jsii.String(name),
		DimensionsMap: &map[string]*string{"Job": jsii.String(j.ID), "Output": jsii.String(o.ID)},
		Statistic:     jsii.String(stat),
		Period:        seconds(period),
		Label:         jsii.String(o.ID + " " + name),
	})
}
