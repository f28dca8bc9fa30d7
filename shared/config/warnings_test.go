package config

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

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
				"jobs[a].schedule: with a poller timeout of 1m10s and a schedule of 1m0s, up to 1m0s of every period has no invocation standing by, and a poller that crashes then is replaced only at the next tick; a standby at every moment needs a poller timeout of twice the schedule plus 15s (2m15s), which stack.poller_timeout left unset gives",
				"jobs[b].schedule: with a poller timeout of 1m10s and a schedule of 5m0s, up to 5m0s of every period has no invocation standing by, and a poller that crashes then is replaced only at the next tick; a standby at every moment needs a poller timeout of twice the schedule plus 15s (10m15s), which stack.poller_timeout left unset gives",
			},
		},
		{
			name: "a schedule too long for Lambda's longest timeout to outlast twice",
			in:   `{"jobs":[` + job("a", `,"schedule":"10m"`) + `]}`,
			want: []string{
				"jobs[a].schedule: with a poller timeout of 15m0s and a schedule of 10m0s, up to 5m15s of every period has no invocation standing by, and a poller that crashes then is replaced only at the next tick; a standby at every moment needs a schedule of at most 7m22.5s, since Lambda allows no timeout over 15m",
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
