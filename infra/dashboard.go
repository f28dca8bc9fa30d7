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

// addDashboard creates the job's dashboard <prefix>-<job>-<region>: a row for
// its functions, then rows following its pipeline from source to outputs.
// Dashboard names are global, not regional as every other name of the
// stack: the region keeps a copy of the stack in another region (staging,
// disaster recovery) from taking or replacing this one.
func (js *jobStack) addDashboard() {
	rows := append([][]awscloudwatch.IWidget{js.functionsRow()}, js.jobRows(js.job)...)
	widgets := make([]*[]awscloudwatch.IWidget, len(rows))
	for i := range rows {
		widgets[i] = &rows[i]
	}
	awscloudwatch.NewDashboard(js.stack, jsii.String("Dashboard-"+js.job.ID), &awscloudwatch.DashboardProps{
		DashboardName:   jsii.String(*js.name(js.job.ID) + "-" + *js.stack.Region()),
		DefaultInterval: awscdk.Duration_Hours(jsii.Number(3)),
		Widgets:         &widgets,
	})
}

func (js *jobStack) functionsRow() []awscloudwatch.IWidget {
	opts := &awscloudwatch.MetricOptions{Period: seconds(dashboardPeriod), Statistic: jsii.String("Sum")}
	fnGraph := func(title string, f *function) awscloudwatch.IWidget {
		return graph(title, 8,
			[]awscloudwatch.IMetric{f.metric(lambdaInvocations, opts), f.metric(lambdaErrors, opts), f.metric(lambdaThrottles, opts)},
			[]awscloudwatch.IMetric{f.metric(lambdaDuration, &awscloudwatch.MetricOptions{Period: seconds(dashboardPeriod), Statistic: jsii.String("Maximum")})})
	}
	return []awscloudwatch.IWidget{
		awscloudwatch.NewTextWidget(&awscloudwatch.TextWidgetProps{
			Markdown: jsii.String(fmt.Sprintf("# changes-worker %s: job %s\nAlarms go to SNS topic `%s-alarms`. Below: source lag → enqueue → queues → delivery.",
				js.cfg.Stack.Prefix, js.job.ID, js.cfg.Stack.Prefix)),
			Width: jsii.Number(8), Height: jsii.Number(widgetHeight),
		}),
		fnGraph("poller: invocations, errors, throttles / duration", js.poller),
		fnGraph("writer: invocations, errors, throttles / duration", js.writer),
	}
}

// jobRows shows one job: source lag, rates, latency and queue depth on the
// first row; lease holder, generation and checkpoint age on the second.
func (js *jobStack) jobRows(j *config.Job) [][]awscloudwatch.IWidget {
	m := func(name, stat string) awscloudwatch.IMetric { return jobMetric(name, j, stat, dashboardPeriod) }
	var delivered, latency, depth []awscloudwatch.IMetric
	var failed []awscloudwatch.IMetric
	for _, r := range js.routes {
		if r.job != j {
			continue
		}
		delivered = append(delivered, outputMetric(metrics.Delivered, j, r.out, "Sum", dashboardPeriod))
		failed = append(failed,
			outputMetric(metrics.FailedTransient, j, r.out, "Sum", dashboardPeriod),
			outputMetric(metrics.FailedPermanent, j, r.out, "Sum", dashboardPeriod))
		latency = append(latency,
			outputMetric(metrics.EndToEndLatencyMs, j, r.out, "p50", dashboardPeriod).With(&awscloudwatch.MetricOptions{Label: jsii.String(r.out.ID + " p50")}),
			outputMetric(metrics.EndToEndLatencyMs, j, r.out, "p99", dashboardPeriod).With(&awscloudwatch.MetricOptions{Label: jsii.String(r.out.ID + " p99")}))
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
			[]awscloudwatch.IMetric{jobMetric(metrics.Role, j, "Maximum", 10*time.Second)},
			[]awscloudwatch.IMetric{m(metrics.HeartbeatAgeSeconds, "Maximum")}),
		graph("lease events", 6,
			[]awscloudwatch.IMetric{m(metrics.LeaseAcquired, "Sum"), m(metrics.LeaseLost, "Sum"), m(metrics.Failovers, "Sum"), m(metrics.Handoffs, "Sum")},
			nil),
		graph("checkpoint age (s) / checkpoints", 6,
			[]awscloudwatch.IMetric{m(metrics.CheckpointAgeSeconds, "Maximum")},
			[]awscloudwatch.IMetric{m(metrics.Checkpoints, "Sum")}),
		awscloudwatch.NewLogQueryWidget(&awscloudwatch.LogQueryWidgetProps{
			Title:         jsii.String("lease holders and generations (poller log)"),
			LogGroupNames: &[]*string{js.poller.logs.LogGroupName()},
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
	return [][]awscloudwatch.IWidget{{header}, first, second, js.healthRow(j)}
}

// healthRow shows whose credentials fail (the source's: ours; an output's:
// theirs), request times, floods and output backpressure.
func (js *jobStack) healthRow(j *config.Job) []awscloudwatch.IWidget {
	m := func(name, stat string) awscloudwatch.Metric { return jobMetric(name, j, stat, dashboardPeriod) }
	auth := []awscloudwatch.IMetric{m(metrics.SourceAuthFailures, "Sum").With(&awscloudwatch.MetricOptions{Label: jsii.String("source auth failures")})}
	requests := []awscloudwatch.IMetric{m(metrics.SourceRequests, "Sum").With(&awscloudwatch.MetricOptions{Label: jsii.String("source requests")})}
	times := []awscloudwatch.IMetric{m(metrics.SourceRequestTime, "p90").With(&awscloudwatch.MetricOptions{Label: jsii.String("source p90")})}
	var active, delays []awscloudwatch.IMetric
	for _, r := range js.routes {
		if r.job != j {
			continue
		}
		o := func(name, stat string) awscloudwatch.Metric {
			return outputMetric(name, j, r.out, stat, dashboardPeriod)
		}
		auth = append(auth, o(metrics.OutputAuthFailures, "Sum"))
		requests = append(requests, o(metrics.OutputRequests, "Sum"))
		times = append(times, o(metrics.OutputRequestTime, "p90").With(&awscloudwatch.MetricOptions{Label: jsii.String(r.out.ID + " p90")}))
		active = append(active, o(metrics.BackpressureActive, "Maximum"))
		delays = append(delays, o(metrics.BackpressureDelays, "Sum"), o(metrics.BackpressureDelaySeconds, "Sum"))
	}
	return []awscloudwatch.IWidget{
		graph("auth failures: source (ours) / outputs (theirs) · requests", 6, auth, requests),
		graph("request time (ms): source / outputs", 6, times, nil),
		graph("flood: largest batch / flood batches", 6,
			[]awscloudwatch.IMetric{m(metrics.LargestBatch, "Maximum"), m(metrics.PendingChanges, "Maximum")},
			[]awscloudwatch.IMetric{m(metrics.FloodBatches, "Sum")}),
		graph("backpressure: active / delays, delay seconds", 6, active, delays),
	}
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
