package config

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestStandby: the next tick's invocation stands by when the one before it
// runs on for at least StandbyMargin after that tick, whatever the two
// settings are.
func TestStandby(t *testing.T) {
	t.Parallel()
	tests := []struct {
		schedule, timeout time.Duration
		want              bool
	}{
		{schedule: time.Minute, timeout: 90 * time.Second, want: true},
		{schedule: time.Minute, timeout: 75 * time.Second, want: true},
		{schedule: time.Minute, timeout: 74 * time.Second, want: false},
		{schedule: time.Minute, timeout: time.Minute, want: false},
		{schedule: 5 * time.Minute, timeout: 90 * time.Second, want: false},
		{schedule: 10 * time.Minute, timeout: 15 * time.Minute, want: true},
	}
	for _, tt := range tests {
		if got := Standby(tt.schedule, tt.timeout); got != tt.want {
			t.Errorf("Standby(%s, %s) = %v, want %v", tt.schedule, tt.timeout, got, tt.want)
		}
	}
}

// TestDeployWarnings: CheckForDeploy names what a deploy accepts but its
// operator should act on: a job whose poller has no standby, an existing
// bucket whose claim checks the stack cannot expire. An S3 output without
// a prefix needs none: it gets "<job>/<output>/".
func TestDeployWarnings(t *testing.T) {
	t.Parallel()
	job := func(id, extra string) string {
		return fmt.Sprintf(`{"id":%q,"source":{"type":"couchdb","url":"http://h/db"},"outputs":[{"id":"s","type":"s3","s3":{}}]%s}`, id, extra)
	}
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{name: "the defaults", in: `{"jobs":[` + job("a", "") + `]}`},
		{
			name: "a schedule the poller does not outlast",
			in:   `{"stack":{"poller_timeout":"70s"},"jobs":[` + job("a", "") + `,` + job("b", `,"schedule":"5m"`) + `]}`,
			want: []string{
				"jobs[a].schedule: stack.poller_timeout (1m10s) does not outlast the schedule (1m0s) by 15s: no invocation stands by to take over, so a busy feed waits for the next tick after each invocation and a crashed poller is replaced only then; make stack.poller_timeout at least 1m15s, or the schedule shorter",
				"jobs[b].schedule: stack.poller_timeout (1m10s) does not outlast the schedule (5m0s) by 15s: no invocation stands by to take over, so a busy feed waits for the next tick after each invocation and a crashed poller is replaced only then; make stack.poller_timeout at least 5m15s, or the schedule shorter",
			},
		},
		{
			name: "an existing bucket",
			in:   `{"stack":{"bucket":"existing-data"},"jobs":[` + job("a", "") + `]}`,
			want: []string{
				"stack.bucket: existing-data is an existing bucket, whose lifecycle configuration the stack leaves as it is: add a rule that expires the objects under claim-check/ (docs/deploy.md shows it) and check it with `changesctl bucket check --config FILE`; without it, claim checks are never deleted",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, warnings, err := CheckForDeploy([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, w := range warnings {
				got = append(got, w.String())
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("warnings (-want +got):\n%s", d)
			}
			if p := f.Jobs[0].Outputs[0].S3.Prefix; p != f.Jobs[0].ID+"/s/" {
				t.Errorf("s3.prefix = %q, want the output's own %q", p, f.Jobs[0].ID+"/s/")
			}
		})
	}
}
