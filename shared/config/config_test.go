package config

import (
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
	got := []string{o[0].Ordering, o[1].Ordering, o[2].Ordering, o[0].HTTP.Method, o[1].Postgres.Table, o[2].S3.Bucket, o[2].S3.KeyTemplate}
	want := []string{"per_document", "none", "none", "PUT", "p", "changes-worker-data", "{doc_id}.json"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("defaults (-want +got):\n%s", d)
	}
	// Batches: PostgreSQL on a standard queue shares a transaction among a
	// hundred changes; FIFO queues and the other outputs take ten.
	if d := cmp.Diff([]int{10, 100, 10}, []int{o[0].BatchSize, o[1].BatchSize, o[2].BatchSize}); d != "" {
		t.Errorf("batch sizes (-want +got):\n%s", d)
	}
	if got := f.Jobs[0].SendConcurrency; got != DefaultSendConcurrency {
		t.Errorf("send_concurrency = %d, want %d", got, DefaultSendConcurrency)
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
				"lease":{"ttl":"1s"},"outputs":[{"id":"o","type":"kafka"},{"id":"o","type":"http","http":{"url":"http://x/{doc_id}","method":"GET"}}]}]}`,
			want: []string{
				`jobs[Bad_ID].id:`, `jobs[Bad_ID].source.type: "mysql"`, `jobs[Bad_ID].source.url:`,
				`jobs[Bad_ID].feed.fetch: "all"`, `jobs[Bad_ID].lease.ttl: 1s`,
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
			if err == nil {
				t.Fatal("Parse succeeded, want errors")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestStripComments(t *testing.T) {
	t.Parallel()
	in := "{\"a\": \"http://x//y\", // comment\n /* block */ \"b\": \"/* not */\"}"
	got := string(StripComments([]byte(in)))
	want := "{\"a\": \"http://x//y\", \n   \"b\": \"/* not */\"}"
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
		{name: "placeholder without url_secret", http: `{"url":"http://x/hooks/{secret}/{doc_id}"}`,
			want: []string{`http.url_secret: is required`}},
		{name: "url_secret without placeholder", http: `{"url":"http://x/{doc_id}","url_secret":{"env":"HOOK"}}`,
			want: []string{`http.url: must contain {secret}`}},
		{name: "dot segment in the path", http: `{"url":"http://x/a/../{doc_id}"}`,
			want: []string{`http.url: `, `"." or ".." segment`}},
		{name: "placeholder in the host", http: `{"url":"http://{secret}.x/{doc_id}","url_secret":{"env":"HOOK"}}`,
			want: []string{`http.url: `, "path or query"}},
		{name: "references and plain headers", http: `{"url":"http://x/hooks/{secret}/{doc_id}","url_secret":{"env":"HOOK"},
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
			if err == nil {
				t.Fatal("Parse succeeded, want errors")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			for _, secret := range []string{"k-123", "session=abc", "eDp5"} {
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
		return `{"id":"` + id + `","type":"postgres","postgres":{"dsn":{"env":"D"},"table":"t"}}`
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
			if err == nil {
				t.Fatal("Parse succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
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
