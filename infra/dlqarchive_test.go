package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
)

// TestDLQAgeAlarms: every output has an alarm that fires while a failed
// change has waited longer than stack.dlq.alarm_after in its DLQ (the age of
// the DLQ's oldest message) or in its archive (the oldest archived change's
// age, which the poller reports at each sweep while the archive holds
// something); the DLQs keep their messages for stack.dlq.retention. With the
// defaults (testdata) and with both set.
func TestDLQAgeAlarms(t *testing.T) {
	const custom = `{"stack": {"prefix": "cwdlq", "dlq": {"retention": "5m", "alarm_after": "90m"}},
  "jobs": [{"id": "orders", "source": {"type": "couchdb", "url": "https://couch.example.com/a"},
    "outputs": [{"id": "rest", "type": "http", "http": {"url": "https://example.com/{doc_id}"}},
                {"id": "files", "type": "s3", "s3": {}}]}]}`
	for _, c := range []struct {
		name       string
		doc        string // "": testdata
		retention  time.Duration
		alarmAfter time.Duration
	}{
		{"defaults", "", 14 * 24 * time.Hour, 24 * time.Hour},
		{"set", custom, 5 * time.Minute, 90 * time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			syn := synthesized(t) // one synthesis at a time through the jsii runtime
			if c.doc != "" {
				var err error
				if syn, err = synthesizeDoc(t, c.doc); err != nil {
					t.Fatalf("synthesize a configuration with stack.dlq: %v", err)
				}
			}
			prefix := syn.cfg.Stack.Prefix
			alarms := map[string]map[string]any{}
			for _, r := range syn.resources("AWS::CloudWatch::Alarm") {
				p := props(r)
				name, _ := p["AlarmName"].(string)
				alarms[name] = p
			}
			for _, j := range syn.cfg.Jobs {
				for _, o := range j.Outputs {
					id := j.ID + "-" + o.ID
					dlqID, dlq := syn.resource(t, "AWS::SQS::Queue", "QueueName", syn.cfg.DLQName(j, o))
					if got := props(dlq)["MessageRetentionPeriod"]; got != c.retention.Seconds() {
						t.Errorf("%s DLQ MessageRetentionPeriod = %v, want %v", id, got, c.retention.Seconds())
					}

					a, ok := alarms[prefix+"-"+id+"-dlq-waiting"]
					if !ok {
						t.Errorf("no alarm %s-%s-dlq-waiting", prefix, id)
						continue
					}
					checkWaitingAlarm(t, syn, j, o, dlqID, a, c.alarmAfter)
				}
			}
		})
	}
}

// checkWaitingAlarm checks the dlq-waiting alarm a of output o of job j: one
// metric-math alarm over the DLQ's ApproximateAgeOfOldestMessage and the
// archive's ArchiveOldestAge, each filled with 0 where it has no data (an
// inactive queue, an empty archive), breaching above after in any period of
// a window that holds the longest the job's DLQs go unswept plus the ten
// minutes the poller's metrics may take to arrive.
func checkWaitingAlarm(t *testing.T, syn *synthesis, j *config.Job, o *config.Output, dlqID string, a map[string]any, after time.Duration) {
	t.Helper()
	expr, stats := mathAlarm(a)
	secs := int64(after.Seconds())
	if want := fmt.Sprintf("IF(FILL(dlq, 0) > %d OR FILL(archive, 0) > %d, 1, 0)", secs, secs); expr != want || len(stats) != 2 {
		t.Errorf("%s/%s dlq-waiting alarm = %s, want %s over two metrics", j.ID, o.ID, compact(a), want)
		return
	}
	period, _ := stats["ArchiveOldestAge"]["Period"].(float64)
	dlq, archive := compact(stats["ApproximateAgeOfOldestMessage"]), compact(stats["ArchiveOldestAge"])
	if !strings.Contains(dlq, dlqID) || !strings.Contains(dlq, `"Stat":"Maximum"`) || stats["ApproximateAgeOfOldestMessage"]["Period"] != period {
		t.Errorf("%s/%s dlq-waiting alarm's DLQ metric = %s, want the maximum age of %s's oldest message", j.ID, o.ID, dlq, dlqID)
	}
	if want := fmt.Sprintf(`"Dimensions":[{"Name":"Job","Value":%q},{"Name":"Output","Value":%q}],"MetricName":"ArchiveOldestAge"`, j.ID, o.ID); !strings.Contains(archive, want) ||
		!strings.Contains(archive, `"Stat":"Maximum"`) {
		t.Errorf("%s/%s dlq-waiting alarm's archive metric = %s, want the output's ArchiveOldestAge maximum", j.ID, o.ID, archive)
	}
	n, _ := a["EvaluationPeriods"].(float64)
	window := time.Duration(n * period * float64(time.Second))
	if need := syn.cfg.SweepGap(j) + 10*time.Minute; window < need || a["DatapointsToAlarm"] != float64(1) ||
		a["Threshold"] != float64(1) || a["ComparisonOperator"] != "GreaterThanOrEqualToThreshold" || a["TreatMissingData"] != "notBreaching" {
		t.Errorf("%s/%s dlq-waiting alarm = %s, want >= 1 in any period of a window of at least %s (the job's sweep gap and the metric's delay), missing data not breaching",
			j.ID, o.ID, compact(a), need)
	}
	if !strings.Contains(fmt.Sprint(a["AlarmDescription"]), "changesctl dlq redrive --job "+j.ID+" --output "+o.ID) {
		t.Errorf("%s/%s dlq-waiting alarm description = %q, want it to name changesctl dlq redrive", j.ID, o.ID, a["AlarmDescription"])
	}
}
