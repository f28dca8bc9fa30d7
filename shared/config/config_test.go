package config

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestLoadSample(t *testing.T) {
	t.Parallel()
	f, err := Load("../../localstack/jobs.json")
	if err != nil {
		t.Fatalf("load sample: %v", err)
	}
	j := f.Job("orders")
	if j == nil {
		t.Fatal("sample has no job orders")
	}
	got := map[string]string{}
	for _, o := range j.Outputs {
		got[o.ID] = f.QueueName(j, o) + " " + f.DLQName(j, o)
	}
	want := map[string]string{
		"pg":      "changes-worker-orders-pg changes-worker-orders-pg-dlq",
		"rest":    "changes-worker-orders-rest.fifo changes-worker-orders-rest-dlq.fifo",
		"archive": "changes-worker-orders-archive changes-worker-orders-archive-dlq",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("queue names (-want +got):\n%s", d)
	}
	if j.Lease.TTL.D() != 10*time.Second || j.Feed.Limit != 500 {
		t.Errorf("defaults: ttl %s limit %d", j.Lease.TTL.D(), j.Feed.Limit)
	}
	if r, ok := f.RouteByQueueName("changes-worker-orders-rest.fifo"); !ok || r.Output.ID != "rest" {
		t.Errorf("route by queue name: %v %v", r, ok)
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte(`{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"outputs":[
		{"id":"h","type":"http","http":{"url":"http://x/{doc_id}"}},
		{"id":"p","type":"postgres","postgres":{"dsn":{"env":"D"}}},
		{"id":"s","type":"s3","s3":{}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	o := f.Jobs[0].Outputs
	bp := o[0].Backpressure
	got := []string{o[0].Ordering, o[1].Ordering, o[2].Ordering, o[0].HTTP.Method, o[1].Postgres.Table, o[2].S3.Bucket, o[2].S3.KeyTemplate,
		fmt.Sprint(bp.Threshold, bp.BaselineRequests, bp.Window, bp.MinIncrease.D()), fmt.Sprint(f.Jobs[0].Feed.FloodThreshold)}
	want := []string{"per_document", "none", "none", "PUT", "p", "changes-worker-data", "{doc_id}.json", "2 50 20 10ms", "10000"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("defaults (-want +got):\n%s", d)
	}
	fd := f.Jobs[0].Feed
	if fd.MaxAnswerBytes != 32<<20 || fd.PageBytes != 16<<20 || fd.QuarantineAfter != 3 {
		t.Errorf("feed bounds %d, %d, %d; want 32 MiB, 16 MiB, 3", fd.MaxAnswerBytes, fd.PageBytes, fd.QuarantineAfter)
	}
	// Batches: PostgreSQL on a standard queue shares a transaction among a
	// hundred changes; FIFO queues and the other outputs take ten.
	if d := cmp.Diff([]int{10, 100, 10}, []int{o[0].BatchSize, o[1].BatchSize, o[2].BatchSize}); d != "" {
		t.Errorf("batch sizes (-want +got):\n%s", d)
	}
	if got := f.Jobs[0].SendConcurrency; got != DefaultSendConcurrency {
		t.Errorf("send_concurrency = %d, want %d", got, DefaultSendConcurrency)
	}
	if got := f.Jobs[0].SendDepth; got != DefaultSendDepth {
		t.Errorf("send_depth = %d, want %d", got, DefaultSendDepth)
	}
	if got := f.Jobs[0].Idle; got != IdleWatch {
		t.Errorf("idle = %q, want %q", got, IdleWatch)
	}
}

func TestIdleStay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                string
		schedule, objective time.Duration
		want                time.Duration
	}{
		{name: "the defaults", schedule: time.Minute, objective: time.Minute, want: SleepAllowance},
		{name: "an objective longer than the schedule", schedule: time.Minute, objective: 5 * time.Minute, want: SleepAllowance},
		{name: "an objective shorter than the schedule", schedule: 5 * time.Minute, objective: time.Minute, want: 4*time.Minute + SleepAllowance},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			j := &Job{Schedule: Duration(tt.schedule), LatencyObjective: Duration(tt.objective)}
			if got := j.IdleStay(); got != tt.want {
				t.Errorf("IdleStay() = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestAttachmentDefaults(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte(`{"jobs":[
		{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"outputs":[{"id":"s","type":"s3","s3":{}}],"attachments":{"enabled":true}},
		{"id":"b","source":{"type":"couchdb","url":"http://h/db"},"outputs":[{"id":"s","type":"s3","s3":{}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := &Attachments{Enabled: true, Bucket: "changes-worker-data", Prefix: "attachments/changes-worker/a/", KeyTemplate: "{digest}",
		MaxBytes: DefaultAttachmentMaxBytes, OnMissing: OnMissingFail,
		StallTimeout: Duration(DefaultAttachmentStallTimeout), MinBytesPerSecond: DefaultAttachmentMinRate, Attempts: DefaultAttachmentAttempts}
	if d := cmp.Diff(want, f.Jobs[0].Attachments); d != "" {
		t.Errorf("defaults (-want +got):\n%s", d)
	}
	if f.Jobs[1].Attachments != nil {
		t.Errorf("attachments of a job that names none = %+v, want off", f.Jobs[1].Attachments)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want []string // substrings, each must appear
	}{
		{
			name: "many problems at once",
			in: `{"jobs":[{"id":"Bad_ID","source":{"type":"mysql","url":"ftp://x"},"feed":{"limit":0,"fetch":"all"},
				"lease":{"ttl":"500ms"},"idle":"nap","outputs":[{"id":"o","type":"kafka"},{"id":"o","type":"http","http":{"url":"http://x/{doc_id}","method":"GET"}}]}]}`,
			want: []string{
				`jobs[Bad_ID].id:`, `jobs[Bad_ID].source.type: "mysql"`, `jobs[Bad_ID].source.url:`,
				`jobs[Bad_ID].feed.fetch: "all"`, `jobs[Bad_ID].lease.ttl: 500ms`, `jobs[Bad_ID].idle: "nap" is not watch or sleep`,
				`jobs[Bad_ID].outputs[o].type: "kafka"`, `jobs[Bad_ID].outputs[o].id: "o" is used by another output`,
				`jobs[Bad_ID].outputs[o].http.method: "GET"`,
			},
		},
		{
			name: "secret given inline is refused",
			in:   `{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://u:p@h/db"},"outputs":[{"id":"p","type":"postgres","postgres":{"dsn":{}}}]}]}`,
			want: []string{"source.url: must not contain credentials", "outputs[p].postgres.dsn: give env"},
		},
		{
			name: "channels need sync gateway",
			in:   `{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"feed":{"channels":["x"]},"outputs":[{"id":"s","type":"s3","s3":{"key_template":"../{doc_id}"}}]}]}`,
			want: []string{"feed.channels: channels need", "s3.key_template: \"../{doc_id}\" must not"},
		},
		{
			name: "dot segments in s3 keys",
			in:   `{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"outputs":[{"id":"s","type":"s3","s3":{"prefix":"p/./","key_template":"x/./{doc_id}"}}]}]}`,
			want: []string{`s3.prefix: "p/./" must not`, `s3.key_template: "x/./{doc_id}" must not`},
		},
		{
			name: "feed bounds",
			in: `{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"feed":{"max_answer_bytes":1000,"page_bytes":2000,"quarantine_after":-1},
				"outputs":[{"id":"p","type":"postgres","postgres":{"dsn":{"env":"D"}}}]}]}`,
			want: []string{"feed.max_answer_bytes: 1000 must be between", "feed.page_bytes: 2000 must be between 65536 (64 KiB) and max_answer_bytes (1000)",
				"feed.quarantine_after: -1 must be between 1 and 100"},
		},
		{
			name: "backpressure and flood settings",
			in: `{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"feed":{"flood_threshold":-1},"outputs":[
				{"id":"h","type":"http","http":{"url":"http://x/{doc_id}"},"backpressure":{"threshold":1,"baseline_requests":-2,"window":20000,"min_increase":"2m"}},
				{"id":"z","type":"http","http":{"url":"http://x/{doc_id}"},"backpressure":{"min_increase":0}}]}]}`,
			want: []string{"feed.flood_threshold: -1 must be", "outputs[h].backpressure.threshold: 1 must be above 1",
				"outputs[h].backpressure.baseline_requests: -2", "outputs[h].backpressure.window: 20000",
				"outputs[h].backpressure.min_increase: 2m0s must be more than 0 and at most 1m",
				"outputs[z].backpressure.min_increase: 0 is not allowed: leave the key out for the default (10ms)"},
		},
		{
			name: "attachments",
			in: `{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"outputs":[{"id":"s","type":"s3","s3":{}}],
				"attachments":{"enabled":true,"prefix":"/x/","key_template":"{name}-{rev}","max_bytes":-1,"on_missing":"ignore",
				"stall_timeout":0,"min_bytes_per_second":10,"attempts":101}}]}`,
			want: []string{`jobs[a].attachments.prefix: "/x/" must not start`, `jobs[a].attachments.key_template: "{name}-{rev}" must contain {digest}`,
				`jobs[a].attachments.key_template: "{name}-{rev}" has a placeholder other than`,
				`jobs[a].attachments.max_bytes: -1`, `jobs[a].attachments.on_missing: "ignore" is not one of fail, skip`,
				`jobs[a].attachments.stall_timeout: 0 is not allowed`, `jobs[a].attachments.min_bytes_per_second: 10 must be at least 1024`,
				`jobs[a].attachments.attempts: 101 must be between 1 and 100`},
		},
		{
			name: "batch sizes beyond the queue's",
			in: `{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"outputs":[
				{"id":"f","type":"postgres","ordering":"per_document","batch_size":11,"postgres":{"dsn":{"env":"D"}}},
				{"id":"s","type":"postgres","batch_size":10001,"postgres":{"dsn":{"env":"D"}}}]}]}`,
			want: []string{"outputs[f].batch_size: 11 must be between 1 and 10 on a FIFO queue", "outputs[s].batch_size: 10001 must be between 1 and 10000"},
		},
		{
			name: "send concurrency",
			in:   `{"jobs":[{"id":"a","send_concurrency":-1,"source":{"type":"couchdb","url":"http://h/db"},"outputs":[{"id":"s","type":"s3","s3":{}}]}]}`,
			want: []string{"jobs[a].send_concurrency: -1 must be between 1 and 512"},
		},
		{
			name: "send depth",
			in:   `{"jobs":[{"id":"a","send_depth":5,"source":{"type":"couchdb","url":"http://h/db"},"outputs":[{"id":"s","type":"s3","s3":{}}]}]}`,
			want: []string{"jobs[a].send_depth: 5 must be between 1 and 4"},
		},
		{
			// A body of SQS's whole limit leaves no room for the attributes
			// of a message held back or dead-lettered.
			name: "message bytes beyond what a held message can carry",
			in:   `{"stack":{"max_message_bytes":1048576},"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"outputs":[{"id":"s","type":"s3","s3":{}}]}]}`,
			want: []string{"stack.max_message_bytes: 1048576 must be between 1024 and"},
		},
		{
			name: "unknown key",
			in:   `{"jobs":[], "jobz": 1}`,
			want: []string{`unknown field "jobz"`},
		},
		{
			name: "no jobs",
			in:   `{"jobs":[]}`,
			want: []string{"jobs: at least one job is required"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tt.in))
			wantErrorWith(t, err, "Parse succeeded, want errors", tt.want...)
		})
	}
}

// TestStripComments: comments outside strings become spaces, their
// newlines kept, so that every line and column stays where it was.
func TestStripComments(t *testing.T) {
	t.Parallel()
	in := "{\"a\": \"http://x//y\", // comment\n /* block\n */ \"b\": \"/* not */\"} // end"
	got := string(StripComments([]byte(in)))
	want := "{\"a\": \"http://x//y\",           \n         \n    \"b\": \"/* not */\"}       "
	if got != want {
		t.Errorf("got %q want %q", got, want)
	}
}

// httpJob is a job with one http output whose settings block is httpBlock.
func httpJob(httpBlock string) string {
	return `{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"outputs":[
		{"id":"h","type":"http","http":` + httpBlock + `}]}]}`
}

func TestCredentialsOnlyByReference(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		http string
		want []string // substrings of the error; none: Parse must succeed
	}{
		{name: "literal api key", http: `{"url":"http://x/{doc_id}","headers":{"X-Api-Key":"k-123"}}`,
			want: []string{`jobs[a].outputs[h].http.headers[X-Api-Key]: `, "secret reference"}},
		{name: "literal cookie", http: `{"url":"http://x/{doc_id}","headers":{"Cookie":"session=abc"}}`,
			want: []string{`http.headers[Cookie]: `}},
		{name: "literal proxy authorization", http: `{"url":"http://x/{doc_id}","headers":{"Proxy-Authorization":"Basic eDp5"}}`,
			want: []string{`http.headers[Proxy-Authorization]: `}},
		{name: "literal token, key and secret suffixes", http: `{"url":"http://x/{doc_id}","headers":{"X-Auth-Token":"t","Ocp-Apim-Subscription-Key":"k","X-Client-Secret":"s"}}`,
			want: []string{`http.headers[X-Auth-Token]: `, `http.headers[Ocp-Apim-Subscription-Key]: `, `http.headers[X-Client-Secret]: `}},
		{name: "authorization header even by reference", http: `{"url":"http://x/{doc_id}","headers":{"authorization":{"env":"A"}}}`,
			want: []string{`http.headers[authorization]: `, "auth"}},
		{name: "header value splitting lines", http: `{"url":"http://x/{doc_id}","headers":{"X-Source":"a\r\nX-Evil: 1"}}`,
			want: []string{`http.headers[X-Source]: `, "control"}},
		{name: "header name not a token", http: `{"url":"http://x/{doc_id}","headers":{"X Source":"a"}}`,
			want: []string{`http.headers[X Source]: `}},
		{name: "reference naming both", http: `{"url":"http://x/{doc_id}","headers":{"X-Api-Key":{"env":"K","secret":"s"}}}`,
			want: []string{`http.headers[X-Api-Key]: give env or secret, not both`}},
		{name: "reference with an unknown key", http: `{"url":"http://x/{doc_id}","headers":{"X-Api-Key":{"value":"k-123"}}}`,
			want: []string{`unknown field "value"`}},
		{name: "credential in the query", http: `{"url":"http://x/{doc_id}?api_key=k-123"}`,
			want: []string{`http.url: query parameter api_key`, "{secret}"}},
		{name: "bad scheme with a literal key", http: `{"url":"ftp://x/{doc_id}?api_key=k-123"}`,
			want: []string{`http.url: "ftp://x/x" must start with http://`}},
		{name: "bad scheme with credentials", http: `{"url":"ftp://user:pw-456@x/{doc_id}"}`,
			want: []string{`http.url: `, "must start with http://", "must not contain credentials"}},
		{name: "placeholder without url_secret", http: `{"url":"http://x/hooks/{secret}/{doc_id}"}`,
			want: []string{`http.url_secret: is required`}},
		{name: "url_secret without placeholder", http: `{"url":"http://x/{doc_id}","url_secret":{"env":"HOOK"}}`,
			want: []string{`http.url: must contain {secret}`}},
		{name: "dot segment in the path", http: `{"url":"http://x/a/../{doc_id}"}`,
			want: []string{`http.url: `, `"." or ".." segment`}},
		{name: "placeholder in the host", http: `{"url":"http://{secret}.x/{doc_id}","url_secret":{"env":"HOOK"}}`,
			want: []string{`http.url: `, "path or query"}},
		{name: "references and plain headers", http: `{"url":"https://x/hooks/{secret}/{doc_id}","url_secret":{"env":"HOOK"},
			"headers":{"X-Api-Key":{"env":"K"},"Cookie":{"secret":"s","json_key":"cookie"},"X-Source":"demo","Content-Type":"application/json"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(httpJob(tt.http)))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			wantErrorWith(t, err, "Parse succeeded, want errors", tt.want...)
			for _, secret := range []string{"k-123", "session=abc", "eDp5", "pw-456"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error quotes the value %q:\n%v", secret, err)
				}
			}
		})
	}
}

func TestResourceNamesUnique(t *testing.T) {
	t.Parallel()
	job := func(id, outputs string) string {
		return `{"id":"` + id + `","source":{"type":"couchdb","url":"http://h/db"},"outputs":[` + outputs + `]}`
	}
	pg := func(id string) string {
		return `{"id":"` + id + `","type":"postgres","postgres":{"dsn":{"env":"D"}}}`
	}
	http := func(id string) string {
		return `{"id":"` + id + `","type":"http","http":{"url":"http://x/{doc_id}"}}`
	}
	tests := []struct {
		name string
		jobs []string
		want []string // substrings of the error; none: Parse must succeed
	}{
		{name: "job and output ids that join the same way", jobs: []string{job("orders-pg", pg("x")), job("orders", pg("pg-x"))},
			want: []string{"jobs[orders].outputs[pg-x]", "jobs[orders-pg].outputs[x]", "changes-worker-orders-pg-x"}},
		{name: "same join, one fifo one standard", jobs: []string{job("orders-pg", http("x")), job("orders", pg("pg-x"))},
			want: []string{"jobs[orders].outputs[pg-x]", "jobs[orders-pg].outputs[x]"}},
		{name: "a queue named like another output's DLQ", jobs: []string{job("a", pg("b")+","+pg("b-dlq"))},
			want: []string{"jobs[a].outputs[b-dlq]", "jobs[a].outputs[b]", `"changes-worker-a-b-dlq"`}},
		{name: "queue name over 80 characters", jobs: []string{job(strings.Repeat("j", 32), http(strings.Repeat("o", 32)))},
			want: []string{"80"}},
		{name: "distinct names", jobs: []string{job("orders", pg("pg")+","+http("rest")), job("orders-pg", pg("x"))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(`{"jobs":[` + strings.Join(tt.jobs, ",") + `]}`))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			wantErrorWith(t, err, "Parse succeeded, want an error", tt.want...)
		})
	}
}

func TestZeroDurationsRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
	}{
		{name: "feed timeout 0s", in: `"feed":{"timeout":"0s"}`, want: "jobs[a].feed.timeout: 0 is not allowed"},
		{name: "feed timeout 0", in: `"feed":{"timeout":0}`, want: "jobs[a].feed.timeout: 0 is not allowed"},
		{name: "lease ttl", in: `"lease":{"ttl":"0"}`, want: "jobs[a].lease.ttl: 0 is not allowed"},
		{name: "schedule", in: `"schedule":0`, want: "jobs[a].schedule: 0 is not allowed"},
		{name: "latency objective", in: `"latency_objective":"0m"`, want: "jobs[a].latency_objective: 0 is not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(`{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},` + tt.in + `,
				"outputs":[{"id":"p","type":"postgres","postgres":{"dsn":{"env":"D"}}}]}]}`))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse error = %v, want one containing %q", err, tt.want)
			}
		})
	}
	t.Run("stack and http timeouts", func(t *testing.T) {
		t.Parallel()
		_, err := Parse([]byte(`{"stack":{"poller_timeout":"0s","writer_timeout":0},"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},
			"outputs":[{"id":"h","type":"http","http":{"url":"http://x/{doc_id}","timeout":"0s"}}]}]}`))
		for _, w := range []string{"stack.poller_timeout: 0 is not allowed", "stack.writer_timeout: 0 is not allowed", "jobs[a].outputs[h].http.timeout: 0 is not allowed"} {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("Parse error = %v, want one containing %q", err, w)
			}
		}
	})
	t.Run("left out means the default", func(t *testing.T) {
		t.Parallel()
		f, err := Parse([]byte(`{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},
			"outputs":[{"id":"p","type":"postgres","postgres":{"dsn":{"env":"D"}}}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		if got := f.Jobs[0].Feed.Timeout.D(); got != DefaultFeedTimeout {
			t.Errorf("feed.timeout = %s, want the default %s", got, DefaultFeedTimeout)
		}
	})
}

// TestScheduleBounds: a schedule is whole minutes from 1m to a day. The
// lease-holder alarm of a job evaluates a few schedule periods, and
// CloudWatch evaluates an alarm over at most seven days.
func TestScheduleBounds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, schedule string
		want           string // substring of the error; empty: Parse must succeed
	}{
		{name: "a minute", schedule: `"1m"`},
		{name: "a day", schedule: `"24h"`},
		{name: "a day in minutes", schedule: `"1440m"`},
		{name: "past a day", schedule: `"1441m"`, want: "jobs[a].schedule: 24h1m0s must be a whole number of minutes, from 1m to 24h"},
		{name: "three and a half days", schedule: `"84h"`, want: "jobs[a].schedule: 84h0m0s must be a whole number of minutes, from 1m to 24h"},
		{name: "not whole minutes", schedule: `"90s"`, want: "jobs[a].schedule: 1m30s must be a whole number of minutes, from 1m to 24h"},
		{name: "under a minute", schedule: `"30s"`, want: "jobs[a].schedule: 30s must be a whole number of minutes, from 1m to 24h"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(`{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"schedule":` + tt.schedule + `,
				"outputs":[{"id":"p","type":"postgres","postgres":{"dsn":{"env":"D"}}}]}]}`))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestPollerTimeout: unset, a job's poller timeout is two of its schedule
// periods plus the standby allowance, at most Lambda's 15 minutes; set, the
// stack's applies to every job. StandbyGap is the part of each period the
// timeout leaves without a standby.
func TestPollerTimeout(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, stack, schedule string
		want, gap             time.Duration
	}{
		{name: "the defaults", want: 2*time.Minute + 15*time.Second},
		{name: "a 7m schedule", schedule: `"7m"`, want: 14*time.Minute + 15*time.Second},
		{name: "an 8m schedule, past Lambda's 15 minutes", schedule: `"8m"`, want: 15 * time.Minute, gap: time.Minute + 15*time.Second},
		{name: "a day", schedule: `"24h"`, want: 15 * time.Minute, gap: 24 * time.Hour},
		{name: "set to 90s, the default schedule", stack: `"poller_timeout":"90s"`, want: 90 * time.Second, gap: 45 * time.Second},
		{name: "set, no longer than the schedule", stack: `"poller_timeout":"1m"`, schedule: `"5m"`, want: time.Minute, gap: 5 * time.Minute},
		{name: "set, long enough", stack: `"poller_timeout":"5m"`, schedule: `"2m"`, want: 5 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			schedule := ""
			if tt.schedule != "" {
				schedule = `"schedule":` + tt.schedule + `,`
			}
			f, err := Parse([]byte(`{"stack":{` + tt.stack + `},"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},` + schedule + `
				"outputs":[{"id":"p","type":"postgres","postgres":{"dsn":{"env":"D"}}}]}]}`))
			if err != nil {
				t.Fatal(err)
			}
			j := f.Jobs[0]
			if got := f.PollerTimeout(j); got != tt.want {
				t.Errorf("PollerTimeout = %s, want %s", got, tt.want)
			}
			if got := f.StandbyGap(j); got != tt.gap {
				t.Errorf("StandbyGap = %s, want %s", got, tt.gap)
			}
		})
	}
	for _, bad := range []string{`"9s"`, `"15m1s"`, `"-1s"`} {
		_, err := Parse([]byte(`{"stack":{"poller_timeout":` + bad + `},"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},
			"outputs":[{"id":"p","type":"postgres","postgres":{"dsn":{"env":"D"}}}]}]}`))
		if want := "stack.poller_timeout: "; err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "must be between 10s and 15m") {
			t.Errorf("poller_timeout %s: Parse error = %v, want %q ... must be between 10s and 15m", bad, err, want)
		}
	}
}

func TestOrderingAndFailurePolicy(t *testing.T) {
	t.Parallel()
	out := func(settings string) string {
		return `{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},
			"outputs":[{"id":"p","type":"postgres","postgres":{"dsn":{"env":"D"}}` + settings + `}]}]}`
	}
	tests := []struct {
		name, settings string
		want           string // substring of the error; empty: Parse must succeed
		fifo, halts    bool
		queueReceives  int
	}{
		{name: "defaults", settings: ``, queueReceives: 5},
		{name: "total is fifo", settings: `,"ordering":"total"`, fifo: true, queueReceives: 1000},
		{name: "per_document is fifo", settings: `,"ordering":"per_document","max_receive_count":100`, fifo: true, queueReceives: 1000},
		{name: "fifo bounds receives", settings: `,"ordering":"per_document","max_receive_count":101`, want: "jobs[a].outputs[p].max_receive_count: 101: on a FIFO queue (ordering per_document) at most 100"},
		{name: "halt on total", settings: `,"ordering":"total","on_failure":"halt"`, fifo: true, halts: true, queueReceives: 1000},
		{name: "halt on per_document", settings: `,"ordering":"per_document","on_failure":"halt","max_receive_count":100`, fifo: true, halts: true, queueReceives: 1000},
		{name: "halt needs fifo", settings: `,"on_failure":"halt"`, want: "jobs[a].outputs[p].on_failure: halt needs a FIFO queue"},
		{name: "halt bounds receives", settings: `,"ordering":"total","on_failure":"halt","max_receive_count":101`, want: "jobs[a].outputs[p].max_receive_count: 101: on a FIFO queue (ordering total) at most 100"},
		{name: "unknown policy", settings: `,"on_failure":"retry"`, want: `jobs[a].outputs[p].on_failure: "retry" is not dlq or halt`},
		{name: "unknown ordering", settings: `,"ordering":"global"`, want: `jobs[a].outputs[p].ordering: "global" is not per_document, total or none`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, err := Parse([]byte(out(tt.settings)))
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("Parse error = %v, want one containing %q", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			o := f.Jobs[0].Outputs[0]
			got := []any{o.FIFO(), o.Halts(), o.QueueMaxReceiveCount()}
			if d := cmp.Diff([]any{tt.fifo, tt.halts, tt.queueReceives}, got); d != "" {
				t.Errorf("fifo, halts, queue max receives (-want +got):\n%s", d)
			}
			if tt.fifo && !strings.HasSuffix(f.QueueName(f.Jobs[0], o), ".fifo") {
				t.Errorf("queue %s is not a FIFO queue name", f.QueueName(f.Jobs[0], o))
			}
		})
	}
}

func TestFeedModeFitsSource(t *testing.T) {
	t.Parallel()
	tests := []struct {
		source, mode string
		want         string // error substring; "" means valid
	}{
		{source: "couchdb", mode: "", want: ""},
		{source: "couchdb", mode: "continuous", want: ""},
		{source: "couchdb", mode: "eventsource", want: ""},
		{source: "couchdb", mode: "websocket", want: `jobs[j].feed.mode: "websocket" needs a sync_gateway or app_services source, not couchdb`},
		{source: "sync_gateway", mode: "websocket", want: ""},
		{source: "app_services", mode: "websocket", want: ""},
		{source: "edge_server", mode: "websocket", want: `jobs[j].feed.mode: "websocket" needs a sync_gateway or app_services source, not edge_server`},
		{source: "edge_server", mode: "sse", want: ""},
		{source: "sync_gateway", mode: "sse", want: `jobs[j].feed.mode: "sse" needs an edge_server source, not sync_gateway`},
		{source: "sync_gateway", mode: "eventsource", want: `jobs[j].feed.mode: "eventsource" needs a couchdb source, not sync_gateway`},
		{source: "app_services", mode: "sse", want: `jobs[j].feed.mode: "sse" needs an edge_server source, not app_services`},
		{source: "edge_server", mode: "eventsource", want: `jobs[j].feed.mode: "eventsource" needs a couchdb source, not edge_server`},
		{source: "edge_server", mode: "continuous", want: ""},
		{source: "sync_gateway", mode: "poll", want: `feed.mode: "poll" is not one of longpoll, continuous, websocket, sse, eventsource`},
	}
	for _, tt := range tests {
		t.Run(tt.source+"/"+tt.mode, func(t *testing.T) {
			t.Parallel()
			f, err := Parse([]byte(`{"jobs":[{"id":"j","source":{"type":"` + tt.source + `","url":"http://h:4984/db"},
				"feed":{"mode":"` + tt.mode + `"},"outputs":[{"id":"pg","type":"postgres","postgres":{"dsn":{"env":"X"}}}]}]}`))
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Parse: %v", err)
			case tt.want == "" && tt.mode == "" && f.Jobs[0].Feed.Mode != ModeLongpoll:
				t.Errorf("default mode %q, want longpoll", f.Jobs[0].Feed.Mode)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Parse error %v, want %q", err, tt.want)
			}
		})
	}
}

// wantErrorWith fails the test unless err is an error whose text holds every
// one of wants; ifNil is the failure to report when err is nil.
func wantErrorWith(t *testing.T, err error, ifNil string, wants ...string) {
	t.Helper()
	if err == nil {
		t.Fatal(ifNil)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}

// The outage settings: defaults, and every problem named by its field.
func TestOutageSettings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		outage string
		want   Outage
		errs   []string
	}{
		{name: "defaults", outage: `{}`, want: Outage{Retry: Duration(DefaultOutageRetry), MaxRetry: Duration(DefaultOutageMaxRetry)}},
		{name: "short", outage: `{"retry":"1s","max_retry":"3s","max_hold":"1h"}`, want: Outage{Retry: Duration(time.Second), MaxRetry: Duration(3 * time.Second), MaxHold: Duration(time.Hour)}},
		{name: "long first retry raises the default bound", outage: `{"retry":"1m"}`, want: Outage{Retry: Duration(time.Minute), MaxRetry: Duration(time.Minute)}},
		{name: "bad", outage: `{"retry":"100ms","max_retry":"1h","max_hold":0}`, errs: []string{
			"outputs[o].outage.retry: 100ms must be between 1s and 15m0s",
			"outputs[o].outage.max_retry: 1h0m0s must be at least retry (100ms) and at most 15m0s",
			"outputs[o].outage.max_hold: 0 is not allowed: leave the key out to hold changes for as long as the output is down"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, err := Parse([]byte(`{"jobs":[{"id":"j","source":{"type":"couchdb","url":"http://h/db"},
				"outputs":[{"id":"o","type":"http","outage":` + tt.outage + `,"http":{"url":"http://x/{doc_id}"}}]}]}`))
			if tt.errs != nil {
				for _, want := range tt.errs {
					if err == nil || !strings.Contains(err.Error(), want) {
						t.Errorf("error %v, want it to contain %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, f.Jobs[0].Outputs[0].Outage); d != "" {
				t.Errorf("outage (-want +got):\n%s", d)
			}
		})
	}
}

// TestAlarmEmail: stack.alarm_email is one bare e-mail address, which the
// alarm topic can subscribe.
func TestAlarmEmail(t *testing.T) {
	t.Parallel()
	tests := []struct {
		email string
		ok    bool
	}{
		{email: "ops@example.com", ok: true},
		{email: "ops+alarms@mail.example.co.uk", ok: true},
		{email: "not-an-email"},
		{email: "ops@localhost"},
		{email: "Ops <ops@example.com>"},
		{email: "ops@example.com, dev@example.com"},
		{email: " ops@example.com"},
	}
	for _, tt := range tests {
		t.Run(tt.email, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(fmt.Appendf(nil, `{"stack":{"alarm_email":%q},"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},
				"outputs":[{"id":"s","type":"s3","s3":{}}]}]}`, tt.email))
			switch {
			case tt.ok && err != nil:
				t.Errorf("Parse: %v", err)
			case !tt.ok:
				wantErrorWith(t, err, "Parse succeeded, want an error", fmt.Sprintf("stack.alarm_email: %q is not one e-mail address (name@example.com)", tt.email))
			}
		})
	}
}

// TestSourceURLQueryRefused: a source URL has no query or fragment (the
// feed client refuses them), so no credential can hide there; the error
// does not quote it.
func TestSourceURLQueryRefused(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"https://h/db?password=pw-456", "https://h/db?access_token=pw-456", "https://h/db#pw-456", "https://h/db?"} {
		t.Run(u, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(fmt.Appendf(nil, `{"jobs":[{"id":"a","source":{"type":"couchdb","url":%q},"outputs":[{"id":"s","type":"s3","s3":{}}]}]}`, u))
			wantErrorWith(t, err, "Parse succeeded, want an error",
				"jobs[a].source.url: must not have a query or fragment: credentials go in source.auth, by reference (the URL is not shown)")
			if strings.Contains(err.Error(), "pw-456") {
				t.Errorf("the error quotes the URL: %v", err)
			}
		})
	}
}

// TestFunctionMemory: the functions' memory defaults to 256 MB (poller)
// and 512 MB (writer) and takes what Lambda allows.
func TestFunctionMemory(t *testing.T) {
	t.Parallel()
	parse := func(stack string) (*File, error) {
		return Parse([]byte(`{"stack":{` + stack + `},"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"outputs":[{"id":"s","type":"s3","s3":{}}]}]}`))
	}
	f, err := parse(``)
	if err != nil {
		t.Fatal(err)
	}
	if got := []int{f.Stack.PollerMemoryMB, f.Stack.WriterMemoryMB}; got[0] != 256 || got[1] != 512 {
		t.Errorf("poller, writer memory = %v, want [256 512]", got)
	}
	f, err = parse(`"poller_memory_mb":1769,"writer_memory_mb":10240`)
	if err != nil {
		t.Fatal(err)
	}
	if got := []int{f.Stack.PollerMemoryMB, f.Stack.WriterMemoryMB}; got[0] != 1769 || got[1] != 10240 {
		t.Errorf("poller, writer memory = %v, want [1769 10240]", got)
	}
	_, err = parse(`"poller_memory_mb":127,"writer_memory_mb":10241`)
	wantErrorWith(t, err, "Parse succeeded, want errors",
		"stack.poller_memory_mb: 127 must be between 128 and 10240 (MB, what Lambda allows)",
		"stack.writer_memory_mb: 10241 must be between 128 and 10240 (MB, what Lambda allows)")
}
