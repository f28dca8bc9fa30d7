package main

import (
	"fmt"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/jsii-runtime-go"

	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/metrics"
)

// archiveWindows are the periods the dlq-waiting alarm may use: the
// shortest whose window (at most a day of periods under an hour, at most
// seven days of longer ones, as CloudWatch allows) holds a sweep of the
// archive and the delay of its metric.
var archiveWindows = []struct {
	period, most time.Duration
}{{5 * time.Minute, 24 * time.Hour}, {time.Hour, 7 * 24 * time.Hour}}

// archivePrefix is where the job's DLQ messages are archived in the stack
// bucket: dlq-archive/<stack prefix>/<job>/, one folder per output below.
func (js *jobStack) archivePrefix() string {
	return config.ArchivePrefix + js.cfg.Stack.Prefix + "/" + js.job.ID + "/"
}

// grantArchive lets the job's poller archive its DLQs (dlq.Sweeper): read
// their depth, receive their messages, delete those it archived and make
// the others visible again; write and list the job's archive prefix; and
// read the job's claim checks, whose content an archived message keeps
// (the claim checks expire from the bucket, an archived message does not).
// The claim on the sweep (dlq.SweepKey) is in the poller's table grant.
func (js *jobStack) grantArchive() {
	role := js.poller.role
	var dlqs []*string
	for _, r := range js.routes {
		dlqs = append(dlqs, r.dlq.QueueArn())
	}
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("ArchiveDLQs"),
		Actions:   jsii.Strings("sqs:GetQueueUrl", "sqs:GetQueueAttributes", "sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"),
		Resources: &dlqs,
	}))
	prefix := js.archivePrefix()
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("WriteDLQArchive"),
		Actions:   jsii.Strings("s3:PutObject"),
		Resources: &[]*string{js.bucket().ArnForObjects(jsii.String(prefix + "*"))},
	}))
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:        jsii.String("ListDLQArchive"),
		Actions:    jsii.Strings("s3:ListBucket"),
		Resources:  &[]*string{js.bucket().BucketArn()},
		Conditions: &map[string]any{"StringLike": map[string]any{"s3:prefix": []string{prefix + "*"}}},
	}))
	unscoped := claimcheck.UnscopedPrefix(js.job.ID)
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("ReadClaimChecksToArchive"),
		Actions:   jsii.Strings("s3:GetObject"),
		Resources: &[]*string{js.bucket().ArnForObjects(jsii.String(unscoped + "*"))},
	}))
	js.allowWildcards(nagObjectsReason, prefixPattern(prefix))
	js.allowWildcards(nagObjectsReason, prefixPattern(unscoped))
}

// addArchiveAlarm creates the alarm on how long r's failed changes wait, in
// the DLQ (SQS's age of its oldest message) or in its archive (the poller's
// ArchiveOldestAge): it fires when either is above stack.dlq.alarm_after in
// a period of its window. The archive's metric comes with each sweep of the
// DLQ, from the poller's logs, and only while the archive holds something,
// so the window holds the longest the job's DLQs go unswept and the
// metric's delay: a period without it counts as an empty archive, and the
// alarm clears once a whole window saw nothing wait too long.
func (js *jobStack) addArchiveAlarm(r *route) {
	id := r.job.ID + "-" + r.out.ID
	d := js.cfg.Stack.DLQ
	after := d.AlarmAfter.D()
	period, periods := archiveWindow(js.cfg.SweepGap(r.job) + metricsLateBy)
	waiting := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String(fmt.Sprintf("IF(FILL(dlq, 0) > %[1]d OR FILL(archive, 0) > %[1]d, 1, 0)", int64(after.Seconds()))),
		UsingMetrics: &map[string]awscloudwatch.IMetric{
			"dlq":     r.dlq.MetricApproximateAgeOfOldestMessage(maxOver(period)),
			"archive": outputMetric(metrics.ArchiveOldestAge, r.job, r.out, "Maximum", period),
		},
		Period: seconds(period),
		Label:  jsii.String("a failed change waited longer than stack.dlq.alarm_after (1)"),
	})
	js.alarm("DLQWaiting-"+id, id+"-dlq-waiting", fmt.Sprintf(
		"A failed change of job %s output %s has waited more than %s (stack.dlq.alarm_after) in its DLQ %s or in the DLQ's archive s3://<bucket>/%s%s/ "+
			"(where the poller moves what waited %s, before SQS's retention of %s ends). See changesctl dlq list --job %s --output %s; fix the cause, "+
			"then changesctl dlq redrive --job %s --output %s, which sends back both (or purge them).",
		r.job.ID, r.out.ID, after, js.cfg.DLQName(r.job, r.out), js.archivePrefix(), r.out.ID, d.ArchiveAfter.D(), d.Retention.D(),
		r.job.ID, r.out.ID, r.job.ID, r.out.ID), &awscloudwatch.AlarmProps{
		Metric:             waiting,
		Threshold:          jsii.Number(1),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
		EvaluationPeriods:  jsii.Number(float64(periods)),
		DatapointsToAlarm:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
}

// archiveWindow returns the period of the dlq-waiting alarm and how many of
// them make a window at least span long (see archiveWindows).
func archiveWindow(span time.Duration) (period time.Duration, periods int) {
	for _, w := range archiveWindows {
		period = w.period
		periods = int((span+period-1)/period) + 1
		if time.Duration(periods)*period <= w.most {
			return period, periods
		}
	}
	return period, int(archiveWindows[len(archiveWindows)-1].most / period)
}
