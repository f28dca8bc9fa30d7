package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/jsii-runtime-go"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/metrics"
)

const (
	dashboardPeriod = time.Minute
	widgetHeight    = 6
)

// addDashboard creates one dashboard for the stack: a row for the functions,
// then two rows per job following its pipeline from source to outputs.
func (s *changesStack) addDashboard() {
	rows := [][]awscloudwatch.IWidget{s.functionsRow()}
	for _, j := range s.cfg.Jobs {
		rows = append(rows, s.jobRows(j)...)
	}
	widgets := make([]*[]awscloudwatch.IWidget, len(rows))
	for i := range rows {
		widgets[i] = &rows[i]
	}
	awscloudwatch.NewDashboard(s.stack, jsii.String("Dashboard"), &awscloudwatch.DashboardProps{
		DashboardName:   jsii.String(s.cfg.Stack.Prefix),
		DefaultInterval: awscdk.Duration_Hours(jsii.Number(3)),
		Widgets:         &widgets,
	})
}

func (s *changesStack) functionsRow() []awscloudwatch.IWidget {
	opts := &awscloudwatch.MetricOptions{Period: seconds(dashboardPeriod), Statistic: jsii.String("Sum")}
	fnGraph := func(title string, f *function) awscloudwatch.IWidget {
		return graph(title, 8,
			[]awscloudwatch.IMetric{f.metric(lambdaInvocations, opts), f.metric(lambdaErrors, opts), f.metric(lambdaThrottles, opts)},
			[]awscloudwatch.IMetric{f.metric(lambdaDuration, &awscloudwatch.MetricOptions{Period: seconds(dashboardPeriod), Statistic: jsii.String("Maximum")})})
	}
	return []awscloudwatch.IWidget{
		awscloudwatch.NewTextWidget(&awscloudwatch.TextWidgetProps{
			Markdown: jsii.String(fmt.Sprintf("# changes-worker %s\nAlarms go to SNS topic `%s-alarms`. Per job below: source lag → enqueue → queues → delivery.",
				s.cfg.Stack.Prefix, s.cfg.Stack.Prefix)),
			Width: jsii.Number(8), Height: jsii.Number(widgetHeight),
		}),
		fnGraph("poller: invocations, errors, throttles / duration", s.poller),
		fnGraph("writer: invocations, errors, throttles / duration", s.writer),
	}
}

// jobRows shows one job: source lag, rates, latency and queue depth on the
// first row; lease holder, generation and checkpoint age on the second.
func (s *changesStack) jobRows(j *config.Job) [][]awscloudwatch.IWidget {
	m := func(name, stat string) awscloudwatch.IMetric { return s.jobMetric(name, j, stat, dashboardPeriod) }
	var delivered, latency, depth []awscloudwatch.IMetric
	var failed []awscloudwatch.IMetric
	for _, r := range s.routes {
		if r.job != j {
			continue
		}
		delivered = append(delivered, s.outputMetric(metrics.Delivered, j, r.out, "Sum", dashboardPeriod))
		failed = append(failed,
			s.outputMetric(metrics.FailedTransient, j, r.out, "Sum", dashboardPeriod),
			s.outputMetric(metrics.FailedPermanent, j, r.out, "Sum", dashboardPeriod))
		latency = append(latency,
			s.outputMetric(metrics.EndToEndLatencyMs, j, r.out, "p50", dashboardPeriod).With(&awscloudwatch.MetricOptions{Label: jsii.String(r.out.ID + " p50")}),
			s.outputMetric(metrics.EndToEndLatencyMs, j, r.out, "p99", dashboardPeriod).With(&awscloudwatch.MetricOptions{Label: jsii.String(r.out.ID + " p99")}))
		depth = append(depth,
			r.queue.MetricApproximateNumberOfMessagesVisible(&awscloudwatch.MetricOptions{Period: seconds(dashboardPeriod), Statistic: jsii.String("Maximum"), Label: jsii.String(r.out.ID + " queue")}),
			r.dlq.MetricApproximateNumberOfMessagesVisible(&awscloudwatch.MetricOptions{Period: seconds(dashboardPeriod), Statistic: jsii.String("Maximum"), Label: jsii.String(r.out.ID + " DLQ")}))
	}
	header := awscloudwatch.NewTextWidget(&awscloudwatch.TextWidgetProps{
		Markdown: jsii.String(fmt.Sprintf("## job %s\nsource `%s` · every %s · latency objective %s · lease TTL %s",
			j.ID, j.Source.Type, j.Schedule.D(), j.LatencyObjective.D(), j.Lease.TTL.D())),
		Width: jsii.Number(24), Height: jsii.Number(2),
	})
	first := []awscloudwatch.IWidget{
		graph("source lag: pending changes / seconds", 6,
			[]awscloudwatch.IMetric{m(metrics.PendingChanges, "Maximum")},
			[]awscloudwatch.IMetric{m(metrics.LagSeconds, "Maximum")}),
		graph("enqueued / delivered per minute", 6,
			append([]awscloudwatch.IMetric{m(metrics.ChangesRead, "Sum"), m(metrics.DocumentsEnqueued, "Sum")}, delivered...),
			failed),
		graph("end-to-end latency (ms)", 6, latency, nil),
		graph("queue and DLQ depth", 6, depth, nil),
	}
	second := []awscloudwatch.IWidget{
		graph("lease: role (1 active) / heartbeat age (s)", 6,
			[]awscloudwatch.IMetric{s.jobMetric(metrics.Role, j, "Maximum", 10*time.Second)},
			[]awscloudwatch.IMetric{m(metrics.HeartbeatAgeSeconds, "Maximum")}),
		graph("lease events", 6,
			[]awscloudwatch.IMetric{m(metrics.LeaseAcquired, "Sum"), m(metrics.LeaseLost, "Sum"), m(metrics.Failovers, "Sum"), m(metrics.Handoffs, "Sum")},
			nil),
		graph("checkpoint age (s) / checkpoints", 6,
			[]awscloudwatch.IMetric{m(metrics.CheckpointAgeSeconds, "Maximum")},
			[]awscloudwatch.IMetric{m(metrics.Checkpoints, "Sum")}),
		awscloudwatch.NewLogQueryWidget(&awscloudwatch.LogQueryWidgetProps{
			Title:         jsii.String("lease holders and generations (poller log)"),
			LogGroupNames: &[]*string{s.poller.logs.LogGroupName()},
			QueryLines: jsii.Strings(
				"fields @timestamp, generation, owner",
				"filter msg like /lease acquired/ and job = "+strconv.Quote(j.ID),
				"sort @timestamp desc",
				"limit 20",
			),
			View:  awscloudwatch.LogQueryVisualizationType_TABLE,
			Width: jsii.Number(6), Height: jsii.Number(widgetHeight),
		}),
	}
	return [][]awscloudwatch.IWidget{{header}, first, second}
}

func graph(title string, width float64, left, right []awscloudwatch.IMetric) awscloudwatch.IWidget {
	props := &awscloudwatch.GraphWidgetProps{
		Title:  jsii.String(title),
		Width:  jsii.Number(width),
		Height: jsii.Number(widgetHeight),
		Left:   &left,
	}
	if len(right) > 0 {
		props.Right = &right
	}
	return awscloudwatch.NewGraphWidget(props)
}
