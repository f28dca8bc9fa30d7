package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// validateOut runs changesctl validate with args and returns what it
// printed and its error.
func validateOut(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb strings.Builder
	err := realMain(t.Context(), &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, lookup: testenv.Lookup},
		append([]string{"validate"}, args...))
	return out.String(), err
}

// TestValidate: a good configuration prints ok and its jobs, then what a
// deploy accepts but its operator should act on; a bad one prints every
// problem, one a line, each naming its key (a syntax error its line and
// column), loading's and the deploy's alike, and fails naming how many
// there are.
func TestValidate(t *testing.T) {
	t.Parallel()
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`// mistakes of every kind
{"stack": {"prefix": "shop", "log_retention_days": 10},
 "jobs": [{"id": "orders", "feed": {"limt": 200},
   "source": {"type": "sync_gateway", "url": "http://sg:4984/shop",
     "auth": {"type": "basic", "username": "worker", "password": {"secret": "arn:aws:ssm:eu-west-1:123456789012:parameter/sg"}}},
   "outputs": [{"id": "pg", "type": "postgres", "postgres": {"dsn": {}}},
     {"id": "hook", "type": "http", "ordering": "none", "on_failure": "halt", "http": {"url": "https://hooks.example.com/{doc_id}"}}]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// A newcomer's file: a key in another case, a duration and a DSN
	// written as strings, an explicit 0, and what only validation catches.
	mistakes := filepath.Join(t.TempDir(), "mistakes.json")
	if err := os.WriteFile(mistakes, []byte(`{"stack": {"prefix": "shop", "alarm_email": "not-an-email", "log_retention_days": 10},
 "jobs": [{"id": "orders", "Schedule": "5m",
   "source": {"type": "couchdb", "url": "https://couch:5984/shop?password=pw-456"},
   "feed": {"limit": 0, "timeout": "10 seconds"},
   "outputs": [{"id": "pg", "type": "postgres", "postgres": {"dsn": "postgres://app:pw-456@db:5432/shop?sslmode=require"}},
     {"id": "hook", "type": "http", "http": {"url": "https://hooks.example.com/{doc_id}", "auth": {"type": "bearer", "token": {"secret": "hook token"}}}}]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	syntax := filepath.Join(t.TempDir(), "syntax.json")
	if err := os.WriteFile(syntax, []byte("// a trailing comma\n{\"stack\": {\"prefix\": \"shop\"},\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	warned := filepath.Join(t.TempDir(), "warned.json")
	if err := os.WriteFile(warned, []byte(`{"stack": {"prefix": "shop", "bucket": "existing-data", "poller_timeout": "2m"},
 "jobs": [{"id": "orders", "schedule": "5m", "source": {"type": "couchdb", "url": "https://couch:5984/shop"},
   "outputs": [{"id": "files", "type": "s3", "s3": {}}]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		want    []string // the lines printed
		wantErr string   // a substring of the error; "" for none
	}{
		{
			name: "good",
			args: []string{"--config", "../../localstack/jobs.json"},
			want: []string{"ok: 1 job, 3 outputs", "  orders: couchdb source, outputs pg (postgres), rest (http), archive (s3)"},
		},
		{
			name: "every problem by its key",
			args: []string{"--config", bad},
			want: []string{
				`jobs[orders].feed: unknown field "limt"`,
				"jobs[orders].source.url: http:// would send source.auth in clear to sg: use https://, or set source.allow_cleartext_credentials to true",
				"jobs[orders].outputs[pg].postgres.dsn: give env (an environment variable) or secret (a Secrets Manager name or ARN); the value itself never goes in this file",
				"jobs[orders].outputs[hook].on_failure: halt needs a FIFO queue: set ordering to total or per_document",
				"stack.log_retention_days: 10 is not one of [1 3 5 7 14 30 60 90 120 150 180 365 400 545 731 1096 1827 2192 2557 2922 3288 3653]",
				`jobs[orders].source.auth.password.secret: "arn:aws:ssm:eu-west-1:123456789012:parameter/sg" is not a Secrets Manager secret ARN (arn:PARTITION:secretsmanager:REGION:ACCOUNT:secret:NAME)`,
			},
			wantErr: "bad.json: 6 problems",
		},
		{
			name: "type errors and the other problems, all by key",
			args: []string{"--config", mistakes},
			want: []string{
				`jobs[orders]: unknown field "Schedule", did you mean "schedule"? (keys are case-sensitive)`,
				`jobs[orders].feed.timeout: "10 seconds", want a duration: a string like "90s" or "1m30s", or a number of seconds`,
				`jobs[orders].outputs[pg].postgres.dsn: a string, want a secret reference {"secret": NAME} or {"env": NAME} (the value itself goes in Secrets Manager or an environment variable, never in this file)`,
				"jobs[orders].feed.limit: 0 is not allowed: leave the key out for the default (500)",
				`stack.alarm_email: "not-an-email" is not one e-mail address (name@example.com)`,
				"jobs[orders].source.url: must not have a query or fragment: credentials go in source.auth, by reference (the URL is not shown)",
				"stack.log_retention_days: 10 is not one of [1 3 5 7 14 30 60 90 120 150 180 365 400 545 731 1096 1827 2192 2557 2922 3288 3653]",
				"jobs[orders].outputs[hook].http.auth.token.secret: is not a Secrets Manager secret name: it holds a space; a name holds ASCII letters, digits and /_+=.@- only (the value is not shown)",
			},
			wantErr: "mistakes.json: 8 problems",
		},
		{
			name:    "a syntax error by line and column",
			args:    []string{"--config", syntax},
			want:    []string{"syntax error at line 3, column 1: invalid character '}' looking for beginning of object key string (remove the comma before it)"},
			wantErr: "syntax.json: 1 problem",
		},
		{
			name: "warnings after ok",
			args: []string{"--config", warned},
			want: []string{
				"ok: 1 job, 1 output",
				"  orders: couchdb source, outputs files (s3)",
				"warning: stack.bucket: existing-data is an existing bucket, whose lifecycle configuration the stack leaves as it is: add a rule that expires the objects under claim-check/ (docs/deploy.md shows it) and check it with `changesctl bucket check --config FILE`; without it, claim checks are never deleted",
				"warning: jobs[orders].schedule: with a poller timeout of 2m0s and a schedule of 5m0s, up to 5m0s of every period has no invocation standing by, and a poller that crashes then is replaced only at the next tick; a standby at every moment needs a poller timeout of twice the schedule plus 15s (10m15s), which stack.poller_timeout left unset gives",
			},
		},
		{name: "no file", args: []string{"--config", "nope.json"}, wantErr: "open nope.json"},
		{name: "no --config", wantErr: "--config is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, err := validateOut(t, tt.args...)
			var got []string
			if out != "" {
				got = strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("output (-want +got):\n%s", d)
			}
			if strings.Contains(out, "pw-456") {
				t.Errorf("validate printed a secret:\n%s", out)
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("error %v, want none", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestValidateExamples: every sample configuration under docs/examples/
// opens with a comment saying who it is for and passes validate. (The
// infra tests synthesize each one.)
func TestValidateExamples(t *testing.T) {
	t.Parallel()
	paths, err := filepath.Glob("../../docs/examples/*")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no sample configuration under docs/examples: %v", err)
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			t.Parallel()
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(raw), "// For: ") || !strings.Contains(string(raw), "\n// Replace: ") {
				t.Errorf("%s does not open with the comments \"// For: ...\" and \"// Replace: ...\"", path)
			}
			if out, err := validateOut(t, "--config", path); err != nil || !strings.HasPrefix(out, "ok: ") {
				t.Errorf("validate %s: %v\n%s", path, err, out)
			}
		})
	}
}
