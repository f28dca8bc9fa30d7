package config

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// parseProblems returns the lines of Parse's error for in, one a problem.
func parseProblems(t *testing.T, in string) []string {
	t.Helper()
	_, err := Parse([]byte(in))
	if err == nil {
		t.Fatalf("Parse succeeded, want problems")
	}
	return strings.Split(err.Error(), "\n")
}

// TestTypeErrorsByKey: a value of the wrong type is reported under its key,
// in the file's terms, with what the key takes, and the file is read on:
// every other problem comes with it, none twice. A secret given as a
// string is never quoted.
func TestTypeErrorsByKey(t *testing.T) {
	t.Parallel()
	got := parseProblems(t, `{"stack": {"prefix": "shop", "retain": "yes"},
 "jobs": [{"id": "orders", "schedule": "5 minutes",
   "source": {"type": "sync_gateway", "url": "https://h/db"},
   "feed": {"limit": "500", "channels": ["a", 2]},
   "outputs": [{"id": "pg", "type": "postgres", "postgres": {"dsn": "postgres://u:pw-456@db/x?sslmode=disable"}},
     {"id": "hook", "type": "http", "http": {"url": "https://x/{doc_id}", "headers": {"X-Source": 5}, "method": "GET"}},
     {"id": "s", "type": "s3", "batch_size": 2.5, "s3": []}]}]}`)
	want := []string{
		`jobs[orders].feed.channels[1]: a number, want a string`,
		`jobs[orders].feed.limit: a string, want a whole number`,
		`jobs[orders].outputs[pg].postgres.dsn: a string, want a secret reference {"secret": NAME} or {"env": NAME} (the value itself goes in Secrets Manager or an environment variable, never in this file)`,
		`jobs[orders].outputs[hook].http.headers[X-Source]: a number, want a string or a secret reference {"secret": NAME} or {"env": NAME}`,
		`jobs[orders].outputs[s].batch_size: 2.5, want a whole number`,
		`jobs[orders].outputs[s].s3: a list, want an object`,
		`jobs[orders].schedule: "5 minutes", want a duration: a string like "90s" or "1m30s", or a number of seconds`,
		`stack.retain: a string, want true or false`,
		`jobs[orders].outputs[hook].http.method: "GET" is not PUT, POST or PATCH`,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("problems (-want +got):\n%s", d)
	}
	if s := strings.Join(got, "\n"); strings.Contains(s, "pw-456") {
		t.Errorf("the problems quote the DSN:\n%s", s)
	}
}

// TestTypeErrorsEveryKind: each kind of key says what it takes.
func TestTypeErrorsEveryKind(t *testing.T) {
	t.Parallel()
	job := func(s string) string {
		return `{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"outputs":[{"id":"p","type":"postgres","postgres":{"dsn":{"env":"D"}}}]` + s + `}]}`
	}
	tests := []struct {
		name, in, want string
	}{
		{name: "the file a list", in: `[1]`, want: `the file: a list, want an object`},
		{name: "jobs an object", in: `{"jobs":{}}`, want: `jobs: an object, want a list`},
		{name: "a job a string", in: `{"jobs":["a"]}`, want: `jobs[0]: a string, want an object`},
		{name: "a number too large", in: job(`,"send_depth":99999999999999999999`), want: `jobs[a].send_depth: 99999999999999999999, want a whole number between -9223372036854775808 and 9223372036854775807`},
		{name: "a bool as a string", in: job(`,"processing":{"ignore_delete":"true"}`), want: `jobs[a].processing.ignore_delete: a string, want true or false`},
		{name: "a string as a bool", in: job(`,"idle":true`), want: `jobs[a].idle: true, want a string`},
		{name: "a duration as a list", in: job(`,"lease":{"ttl":[]}`), want: `jobs[a].lease.ttl: a list, want a duration: a string like "90s" or "1m30s", or a number of seconds`},
		{name: "a password as a string", in: `{"jobs":[{"id":"a","source":{"type":"sync_gateway","url":"https://h/db","auth":{"type":"basic","username":"u","password":"hunter2"}},"outputs":[{"id":"s","type":"s3"}]}]}`,
			want: `jobs[a].source.auth.password: a string, want a secret reference {"secret": NAME} or {"env": NAME} (the value itself goes in Secrets Manager or an environment variable, never in this file)`},
		{name: "an unknown key in a header reference", in: `{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},
			"outputs":[{"id":"h","type":"http","http":{"url":"http://x/{doc_id}","headers":{"X-Api-Key":{"vaule":"x"}}}}]}]}`,
			want: `jobs[a].outputs[h].http.headers[X-Api-Key]: unknown field "vaule"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := parseProblems(t, tt.in)
			if got[0] != tt.want {
				t.Errorf("first problem %q, want %q\nall: %q", got[0], tt.want, got)
			}
			if strings.Contains(strings.Join(got, "\n"), "hunter2") {
				t.Errorf("the problems quote the password: %q", got)
			}
		})
	}
}

// TestSyntaxErrorsByPosition: a file that is not JSON is reported at the
// line and column of the first character that breaks it, counted in the
// file as written, comments included.
func TestSyntaxErrorsByPosition(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
	}{
		{name: "a trailing comma", in: "{\"jobs\": [],\n}",
			want: "syntax error at line 2, column 1: invalid character '}' looking for beginning of object key string (remove the comma before it)"},
		{name: "after comments", in: "// For: a sample\n/* two\n   lines */ {\"stack\": {\"prefix\": \"é\" \"bucket\": \"b\"}}",
			want: "syntax error at line 3, column 38: invalid character '\"' after object key:value pair (is a comma missing before it?)"},
		{name: "a missing colon", in: "{\n  \"jobs\" []\n}", want: "syntax error at line 2, column 10: invalid character '[' after object key"},
		{name: "cut short", in: "{\"jobs\": [\n", want: "syntax error at line 2, column 1: the file ends before its JSON does (a {, [ or \" is not closed)"},
		{name: "more after the object", in: "{\"jobs\": []}\n}", want: "syntax error at line 2, column 1: invalid character '}' after top-level value"},
		{name: "an open comment", in: "{\"jobs\": []} /* x\n", want: "syntax error at line 1, column 14: this /* comment is never closed with */"},
		{name: "empty", in: " // nothing\n", want: "the file holds no JSON object: it is empty or holds only comments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tt.in))
			if err == nil || err.Error() != tt.want {
				t.Errorf("Parse error:\n%v\nwant:\n%s", err, tt.want)
			}
		})
	}
}

// TestZeroCountsRefused: a number written as 0 where leaving the key out
// gives another value is refused, like a duration of 0, naming the
// default; where the default is 0, 0 is taken.
func TestZeroCountsRefused(t *testing.T) {
	t.Parallel()
	got := parseProblems(t, `{"stack":{"max_message_bytes":0},"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"feed":{"limit":0},
		"attachments":{"enabled":false,"max_bytes":0},
		"outputs":[{"id":"p","type":"postgres","batch_size":0,"backpressure":{"threshold":0.0},"postgres":{"dsn":{"env":"D"}}}]}]}`)
	want := []string{
		"jobs[a].feed.limit: 0 is not allowed: leave the key out for the default (500)",
		"jobs[a].outputs[p].backpressure.threshold: 0 is not allowed: leave the key out for the default (2)",
		"jobs[a].outputs[p].batch_size: 0 is not allowed: leave the key out for the default (100)",
		"stack.max_message_bytes: 0 is not allowed: leave the key out for the default (262144)",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("problems (-want +got):\n%s", d)
	}
}

// TestKeysCaseSensitive: a key is matched as written; one in another case
// is unknown, with the key it resembles, and read as that key so that it
// brings no other problem.
func TestKeysCaseSensitive(t *testing.T) {
	t.Parallel()
	got := parseProblems(t, `{"stack":{"PREFIX":"shop"},"jobs":[{"id":"a","Feed":{"limit":5},"source":{"type":"couchdb","url":"http://h/db"},
		"outputs":[{"id":"p","type":"postgres","postgres":{"dsn":{"Env":"D"}}}]}]}`)
	want := []string{
		`jobs[a]: unknown field "Feed", did you mean "feed"? (keys are case-sensitive)`,
		`jobs[a].outputs[p].postgres.dsn: unknown field "Env", did you mean "env"? (keys are case-sensitive)`,
		`stack: unknown field "PREFIX", did you mean "prefix"? (keys are case-sensitive)`,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("problems (-want +got):\n%s", d)
	}
}

// TestDuplicateKeys: a key given twice in one object is refused with the
// lines it is on, rather than the last one silently winning.
func TestDuplicateKeys(t *testing.T) {
	t.Parallel()
	got := parseProblems(t, `{"stack":{"prefix":"a"},"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},
		"feed":{"limit":5,
			"limit":7},
		"outputs":[{"id":"h","type":"http","http":{"url":"http://x/{doc_id}","headers":{"X-Source":"a","X-Source":"b"}}}]}],
	"stack":{"prefix":"b"}}`)
	want := []string{
		"jobs[a].feed.limit: given 2 times (lines 2 and 3): give it once",
		"jobs[a].outputs[h].http.headers[X-Source]: given 2 times (lines 4 and 4): give it once",
		"stack: given 2 times (lines 1 and 5): give it once",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("problems (-want +got):\n%s", d)
	}
}

// TestValidFileDecodesAsBefore: a file without problems gives what
// encoding/json makes of it, comments and all.
func TestValidFileDecodesAsBefore(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte("// For: a test\n{\"jobs\":[{\"id\":\"a\", /* the source */ \"source\":{\"type\":\"couchdb\",\"url\":\"http://h/db\"},\"feed\":{\"timeout\":1.5,\"limit\":20},\n" +
		`"outputs":[{"id":"h","type":"http","http":{"url":"https://x/{doc_id}","headers":{"X-Source":"demo","X-Api-Key":{"env":"K"}}}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	j := f.Jobs[0]
	h := j.Outputs[0].HTTP.Headers
	got := []any{j.Feed.Timeout.D().String(), j.Feed.Limit, h["X-Source"].Value, h["X-Api-Key"].Ref.Env}
	if d := cmp.Diff([]any{"1.5s", 20, "demo", "K"}, got); d != "" {
		t.Errorf("decoded (-want +got):\n%s", d)
	}
}

// TestGoBuiltFileParses: a File built in Go, its settings left at 0 for
// their defaults, encodes to a file Parse takes (the test stacks write
// theirs so): a count left at 0 is left out, not written as 0.
func TestGoBuiltFileParses(t *testing.T) {
	t.Parallel()
	f := &File{Jobs: []*Job{{ID: "a", Source: Source{Type: SourceCouchDB, URL: "http://h/db"}, Outputs: []*Output{
		{ID: "s", Type: OutputS3, S3: &S3Output{}},
		{ID: "p", Type: OutputPostgres, Postgres: &PostgresOutput{DSN: SecretRef{Env: "D"}}},
	}}}}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(b); err != nil {
		t.Errorf("Parse(%s):\n%v", b, err)
	}
}
