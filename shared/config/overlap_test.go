package config

import (
	"strings"
	"testing"
)

// TestOutputsKeepApart: S3 outputs, attachments, claim checks and the DLQ
// archive never share keys, two PostgreSQL outputs never share a table of
// one dsn, and an S3 prefix never widens the writer's grant; every problem
// is reported at once, each naming both owners.
func TestOutputsKeepApart(t *testing.T) {
	t.Parallel()
	job := func(id, extra string, outputs ...string) string {
		return `{"id":"` + id + `","source":{"type":"couchdb","url":"http://h/db"}` + extra + `,"outputs":[` + strings.Join(outputs, ",") + `]}`
	}
	s3 := func(id, block string) string { return `{"id":"` + id + `","type":"s3","s3":` + block + `}` }
	pg := func(id, block string) string { return `{"id":"` + id + `","type":"postgres","postgres":` + block + `}` }
	mapping := func(table string) string {
		return `"mapping":{"tables":[{"name":"` + table + `","columns":[{"name":"c","path":"c","type":"text"}]}]}`
	}
	tests := []struct {
		name  string
		jobs  []string
		want  []string // error substrings; none: valid
		check func(t *testing.T, f *File)
	}{
		{name: "two jobs, default S3 outputs", jobs: []string{job("a", "", s3("s", `{}`)), job("b", "", s3("s", `{}`))},
			check: func(t *testing.T, f *File) {
				for _, j := range f.Jobs {
					if got, want := j.Outputs[0].S3.Prefix, j.ID+"/s/"; got != want {
						t.Errorf("job %s: s3.prefix %q, want %q", j.ID, got, want)
					}
				}
			}},
		{name: "one prefix inside another", jobs: []string{job("a", "", s3("s", `{"prefix":"archive/"}`)), job("b", "", s3("t", `{"prefix":"archive/b/"}`))},
			want: []string{"jobs[b].outputs[t].s3: s3://changes-worker-data/archive/b/ overlaps s3://changes-worker-data/archive/, where jobs[a].outputs[s].s3 writes"}},
		{name: "the same prefix in one job", jobs: []string{job("a", "", s3("s", `{"prefix":"x/"}`), s3("t", `{"prefix":"x/"}`))},
			want: []string{"jobs[a].outputs[t].s3: s3://changes-worker-data/x/ overlaps s3://changes-worker-data/x/, where jobs[a].outputs[s].s3 writes"}},
		{name: "the same prefix in other buckets", jobs: []string{job("a", "", s3("s", `{"bucket":"one","prefix":"x/"}`)), job("b", "", s3("s", `{"bucket":"two","prefix":"x/"}`))}},
		{name: "under the claim checks", jobs: []string{job("a", "", s3("s", `{"prefix":"claim-check/a/"}`))},
			want: []string{"jobs[a].outputs[s].s3: s3://changes-worker-data/claim-check/a/ overlaps s3://changes-worker-data/claim-check/, where the claim checks (stack.bucket) write"}},
		{name: "the claim checks' prefix in another bucket", jobs: []string{job("a", "", s3("s", `{"bucket":"mine","prefix":"claim-check/"}`))}},
		{name: "over the DLQ archive", jobs: []string{job("a", "", s3("s", `{"prefix":"dlq-archive/"}`))},
			want: []string{"jobs[a].outputs[s].s3: s3://changes-worker-data/dlq-archive/ overlaps s3://changes-worker-data/dlq-archive/, where the DLQ archive (stack.bucket) writes"}},
		{name: "attachments under the DLQ archive", jobs: []string{job("a", `,"attachments":{"enabled":true,"prefix":"dlq-archive/files/"}`, s3("s", `{}`))},
			want: []string{"jobs[a].attachments: s3://changes-worker-data/dlq-archive/files/ overlaps s3://changes-worker-data/dlq-archive/"}},
		{name: "over a job's attachments", jobs: []string{job("a", `,"attachments":{"enabled":true}`, s3("s", `{"prefix":"attachments/"}`))},
			want: []string{"jobs[a].outputs[s].s3: s3://changes-worker-data/attachments/ overlaps s3://changes-worker-data/attachments/changes-worker/a/, where jobs[a].attachments writes"}},
		{name: "attachments under the claim checks", jobs: []string{job("a", `,"attachments":{"enabled":true,"prefix":"claim-check/files/"}`, s3("s", `{}`))},
			want: []string{"jobs[a].attachments: s3://changes-worker-data/claim-check/files/ overlaps s3://changes-worker-data/claim-check/"}},
		{name: "two jobs' attachments together", jobs: []string{job("a", `,"attachments":{"enabled":true,"prefix":"files/"}`, s3("s", `{}`)), job("b", `,"attachments":{"enabled":true,"prefix":"files/"}`, s3("s", `{}`))}},
		{name: "prefixes that would widen a grant", jobs: []string{job("a", `,"attachments":{"enabled":true,"prefix":"files"}`,
			s3("s", `{"prefix":"exports"}`), s3("t", `{"prefix":"a*/"}`), s3("u", `{"prefix":"b?/"}`), s3("v", `{"prefix":"${aws:username}/"}`))},
			want: []string{
				`jobs[a].outputs[s].s3.prefix: "exports" must end with '/'`,
				`jobs[a].outputs[t].s3.prefix: "a*/" must not contain '*', '?' or '$'`,
				`jobs[a].outputs[u].s3.prefix: "b?/" must not contain`,
				`jobs[a].outputs[v].s3.prefix: "${aws:username}/" must not contain`,
				`jobs[a].attachments.prefix: "files" must end with '/'`,
			}},
		{name: "two jobs' default tables on one dsn", jobs: []string{job("a", "", pg("pg", `{"dsn":{"env":"PG_DSN"}}`)), job("b", "", pg("pg", `{"dsn":{"env":"PG_DSN"}}`))},
			want: []string{"jobs[b].outputs[pg].postgres: writes table public.pg on the same dsn as jobs[a].outputs[pg].postgres"}},
		{name: "one table on two dsns", jobs: []string{job("a", "", pg("pg", `{"dsn":{"env":"PG_DSN"}}`)), job("b", "", pg("pg", `{"dsn":{"env":"OTHER_DSN"}}`))}},
		{name: "one table in two schemas", jobs: []string{job("a", "", pg("pg", `{"dsn":{"env":"PG_DSN"}}`)), job("b", "", pg("pg", `{"dsn":{"env":"PG_DSN"},"schema":"b"}`))}},
		{name: "one secret, two keys", jobs: []string{job("a", "", pg("pg", `{"dsn":{"secret":"db","json_key":"a"}}`)), job("b", "", pg("pg", `{"dsn":{"secret":"db","json_key":"b"}}`))}},
		{name: "a table named like another's versions table", jobs: []string{job("a", "", pg("pg", `{"dsn":{"env":"PG_DSN"},"table":"orders"}`), pg("v", `{"dsn":{"env":"PG_DSN"},"table":"orders_versions"}`))},
			want: []string{"jobs[a].outputs[v].postgres: writes table public.orders_versions on the same dsn as jobs[a].outputs[pg].postgres"}},
		{name: "two mappings into one table", jobs: []string{
			job("a", "", pg("m", `{"dsn":{"env":"PG_DSN"},"table":"a_m",`+mapping("orders")+`}`)),
			job("b", "", pg("m", `{"dsn":{"env":"PG_DSN"},"table":"b_m",`+mapping("orders")+`}`))},
			want: []string{"jobs[b].outputs[m].postgres: writes table public.orders on the same dsn as jobs[a].outputs[m].postgres"}},
		{name: "every problem at once", jobs: []string{
			job("a", "", s3("s", `{"prefix":"x/"}`), pg("pg", `{"dsn":{"env":"D"}}`)),
			job("b", "", s3("s", `{"prefix":"x/y/"}`), pg("pg", `{"dsn":{"env":"D"}}`))},
			want: []string{"jobs[b].outputs[s].s3: s3://changes-worker-data/x/y/ overlaps", "jobs[b].outputs[pg].postgres: writes table public.pg"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, err := Parse([]byte(`{"jobs":[` + strings.Join(tt.jobs, ",") + `]}`))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if tt.check != nil {
					tt.check(t, f)
				}
				return
			}
			wantErrorWith(t, err, "Parse accepted it", tt.want...)
		})
	}
}
