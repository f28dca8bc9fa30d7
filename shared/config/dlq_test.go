package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestDLQSettings: stack.dlq's defaults follow the retention and the jobs'
// invocations, and every problem is named by its key.
func TestDLQSettings(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	job := func(extra string) string {
		return `{"id":"j","source":{"type":"couchdb","url":"http://h/db"}` + extra + `,"outputs":[{"id":"o","type":"s3","s3":{}}]}`
	}
	type got struct{ Retention, ArchiveAfter, AlarmAfter, SweepEvery, Gap time.Duration }
	tests := []struct {
		name  string
		stack string // the members of stack.dlq
		job   string // extra members of the job
		want  got
		errs  []string
	}{
		{name: "defaults", want: got{14 * day, 12 * day, day, 15 * time.Minute, 15 * time.Minute}},
		{name: "two minutes", stack: `"retention":"2m"`, want: got{2 * time.Minute, time.Minute, day, 15 * time.Second, 15 * time.Second}},
		{name: "three days", stack: `"retention":"72h","alarm_after":"1h"`, want: got{3 * day, 36 * time.Hour, time.Hour, 15 * time.Minute, 15 * time.Minute}},
		{name: "a daily job that sleeps", job: `,"schedule":"24h","idle":"sleep"`,
			want: got{14 * day, 14*day - 2*(day+15*time.Minute), day, 15 * time.Minute, day + 15*time.Minute}},
		{name: "archive_after set", stack: `"archive_after":"24h"`, want: got{14 * day, day, day, 15 * time.Minute, 15 * time.Minute}},
		{name: "retention out of SQS's bounds", stack: `"retention":"59s"`, errs: []string{"stack.dlq.retention: 59s must be whole seconds from 1m0s to 336h0m0s"}},
		{name: "retention too long", stack: `"retention":"337h"`, errs: []string{"stack.dlq.retention: 337h0m0s must be whole seconds"}},
		{name: "retention in fractions of a second", stack: `"retention":"90.5s"`, errs: []string{"stack.dlq.retention: 1m30.5s must be whole seconds"}},
		{name: "zeros", stack: `"retention":0,"archive_after":0,"alarm_after":0`, errs: []string{
			"stack.dlq.retention: 0 is not allowed", "stack.dlq.archive_after: 0 is not allowed", "stack.dlq.alarm_after: 0 is not allowed"}},
		{name: "alarm_after too short", stack: `"alarm_after":"30s"`, errs: []string{"stack.dlq.alarm_after: 30s must be at least 1m"}},
		{name: "archive_after at the retention", stack: `"retention":"2m","archive_after":"110s"`,
			errs: []string{"stack.dlq.archive_after: 1m50s must be at least 20s shorter than retention (2m0s)"}},
		{name: "archive_after under a second", stack: `"archive_after":"0.5s"`, errs: []string{"stack.dlq.archive_after: 500ms must be at least 1s"}},
		{name: "a job that sweeps only at its ticks", stack: `"retention":"2m"`, job: `,"idle":"sleep"`,
			errs: []string{"stack.dlq.archive_after: 1s leaves 1m59s before SQS drops a DLQ message, less than twice the 1m29.75s jobs[j] may go between two archive sweeps"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, err := Parse([]byte(`{"stack":{"poller_timeout":"90s","dlq":{` + tt.stack + `}},"jobs":[` + job(tt.job) + `]}`))
			if len(tt.errs) > 0 {
				wantErrorWith(t, err, "Parse accepted it", tt.errs...)
				if err != nil && strings.Count(err.Error(), "stack.dlq.") != len(tt.errs) {
					t.Errorf("want %d stack.dlq problems, got:\n%v", len(tt.errs), err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			d := f.Stack.DLQ
			g := got{d.Retention.D(), d.ArchiveAfter.D(), d.AlarmAfter.D(), d.SweepEvery(), f.SweepGap(f.Jobs[0])}
			if diff := cmp.Diff(tt.want, g); diff != "" {
				t.Errorf("stack.dlq (-want +got):\n%s", diff)
			}
		})
	}
}
