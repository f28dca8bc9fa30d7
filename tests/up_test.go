package tests

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// upStub stands in for a tool that localstack/up.sh must not run when every
// service already answers: it records its name and arguments in $STUB_LOG.
const upStub = `#!/usr/bin/env bash
printf '%s %s\n' "$(basename "$0")" "$*" >>"$STUB_LOG"
`

// upStubPsql answers as a PostgreSQL where the changes role logs in and is
// a superuser; other calls are recorded.
const upStubPsql = `#!/usr/bin/env bash
case "$*" in
*rolsuper*server_version*) echo 't|15.8' ;;
*) printf 'psql %s\n' "$*" >>"$STUB_LOG" ;;
esac
`

// upStubPgLsclusters shows the cluster 15 main online on 5432.
const upStubPgLsclusters = `#!/usr/bin/env bash
printf 'pg_lsclusters %s\n' "$*" >>"$STUB_LOG"
echo "15 main 5432 online postgres /var/lib/postgresql/15/main /var/log/postgresql/postgresql-15-main.log"
`

// answerAll is one HTTP server answering as all four services do when up.sh
// checks them: LocalStack's health, S3's ListBuckets, DynamoDB's ListTables
// and the source's root.
func answerAll(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/_localstack/health" {
		_, _ = w.Write([]byte(`{"services": {"sqs": "running", "s3": "available"}, "version": "2026.3.0"}`))
		return
	}
	_, _ = w.Write([]byte(`<ListAllMyBucketsResult></ListAllMyBucketsResult>`))
}

// upRun is one run of a copy of localstack/up.sh with the tools it may
// install or build stubbed (upStub), and stubs of the test's own first.
type upRun struct {
	out   string   // what up.sh printed
	err   error    // how it exited
	calls []string // the stubbed tools it ran, as "name args"
}

// runUp runs localstack/up.sh in a copy of localstack/ under a new root,
// with env added to a PATH of stubs, HOME in the root and STUB_LOG.
func runUp(t *testing.T, env []string, stubs map[string]string) upRun {
	t.Helper()
	root := t.TempDir()
	if out, err := exec.Command("cp", "-r", filepath.Join("..", "localstack"), filepath.Join(root, "localstack")).CombinedOutput(); err != nil {
		t.Fatalf("copy localstack/: %v\n%s", err, out)
	}
	// syncgateway.sh reads the pinned version from the tools module.
	gomod, err := os.ReadFile(filepath.Join("tools", "syncgateway", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "tests", "tools", "syncgateway"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "tests", "tools", "syncgateway", "go.mod"), gomod, 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "bin")
	all := map[string]string{"psql": upStubPsql, "pg_lsclusters": upStubPgLsclusters}
	for _, name := range []string{"go", "apt-get", "mvn", "npm", "node", "java", "pip", "pip3", "pyenv", "runuser", "pg_ctlcluster", "pg_createcluster"} {
		all[name] = upStub
	}
	for name, content := range stubs {
		all[name] = content
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range all {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	log := filepath.Join(root, "calls.log")
	cmd := exec.Command("bash", filepath.Join(root, "localstack", "up.sh"))
	cmd.Env = append([]string{"PATH=" + bin + ":" + os.Getenv("PATH"), "HOME=" + root, "STUB_LOG=" + log}, env...)
	out, runErr := cmd.CombinedOutput()
	calls, err := os.ReadFile(log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	r := upRun{out: string(out), err: runErr}
	for _, line := range strings.Split(strings.TrimSpace(string(calls)), "\n") {
		if line != "" && !strings.HasPrefix(line, "pg_lsclusters ") {
			r.calls = append(r.calls, line)
		}
	}
	return r
}

// servicePorts sets the four services' ports to port.
func servicePorts(port string) []string {
	return []string{"LOCALSTACK_PORT=" + port, "S3_PORT=" + port, "DYNAMODB_PORT=" + port, "COUCH_PORT=" + port}
}

// TestUpStartsOnlyServices runs localstack/up.sh (make up, which make demo
// runs) where every service already answers: it installs and builds nothing
// (no go, pip, npm, mvn or apt-get), neither Sync Gateway nor the Lambda
// emulator, and lists the five services.
func TestUpStartsOnlyServices(t *testing.T) {
	parallel(t)
	srv := httptest.NewServer(http.HandlerFunc(answerAll))
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := runUp(t, servicePorts(port), nil)
	if r.err != nil {
		t.Errorf("up.sh: %v\n%s", r.err, r.out)
	}
	for _, c := range r.calls {
		t.Errorf("up.sh ran %q; with every service answering it installs and builds nothing", c)
	}
	for _, want := range []string{"dynamodb ", "aws ", "s3 ", "couch ", "postgres "} {
		if !strings.Contains(r.out, "\n"+want) {
			t.Errorf("up.sh's table lacks the %sline:\n%s", want, r.out)
		}
	}
	if strings.Contains(r.out, "syncgw") {
		t.Errorf("up.sh's table lists Sync Gateway, a tool of the tests:\n%s", r.out)
	}
}

// TestUpRefusesEarly: where up.sh cannot do its job, it says why before it
// installs anything: on a machine other than x86_64, when DynamoDB Local is
// to be installed; as another user than root, when PostgreSQL is to be set
// up.
func TestUpRefusesEarly(t *testing.T) {
	parallel(t)
	srv := httptest.NewServer(http.HandlerFunc(answerAll))
	t.Cleanup(srv.Close)
	_, answering, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, closed, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	tests := []struct {
		name  string
		env   []string
		stubs map[string]string
		want  string
	}{
		{
			name:  "arm64",
			env:   servicePorts(closed),
			stubs: map[string]string{"uname": "#!/bin/sh\n[ \"$1\" = -m ] && echo aarch64 || exec /usr/bin/uname \"$@\"\n"},
			want:  "up: ERROR: DynamoDB Local's native SQLite library is fetched for linux/amd64 only, and this machine is aarch64",
		},
		{
			name: "not root",
			env:  servicePorts(answering),
			stubs: map[string]string{
				"id":   "#!/bin/sh\ncase \"$1\" in -u) echo 1000 ;; -un) echo alice ;; esac\n",
				"psql": "#!/bin/sh\necho 'psql: error: password authentication failed for user \"changes\"' >&2\nexit 2\n",
			},
			want: "up: ERROR: setting up PostgreSQL (cluster 15 main, role and database changes) needs root, and up.sh runs as alice",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runUp(t, tt.env, tt.stubs)
			if r.err == nil || !strings.Contains(r.out, tt.want) {
				t.Errorf("up.sh: %v, want a failure saying %q:\n%s", r.err, tt.want, r.out)
			}
			for _, c := range r.calls {
				t.Errorf("up.sh ran %q before it failed", c)
			}
		})
	}
}

// TestMakeTargetsBuildTheirTools: make demo builds neither Sync Gateway nor
// the Lambda emulator (aws-lambda-rie); make test builds both, with
// everything else its packages need (the CDK CLI, cfn-lint) and runs the
// checks of make lint (.ci/lint) beside the tests; the targets that run
// Lambda functions on LocalStack build the emulator, and the benchmarks,
// which also read a Sync Gateway, build both.
func TestMakeTargetsBuildTheirTools(t *testing.T) {
	parallel(t)
	const (
		syncGateway = "localstack/syncgateway.sh"
		emulator    = "localstack/lambda-rie.sh"
		cdkDeps     = "npm ci --prefix infra"
		cfnLint     = "cfn-lint"
		services    = "localstack/up.sh"
		lint        = ".ci/lint"
	)
	tests := []struct {
		target      string
		want, never []string
	}{
		{target: "demo", want: []string{services}, never: []string{syncGateway, emulator}},
		{target: "up", want: []string{services}, never: []string{syncGateway, emulator}},
		{target: "test", want: []string{services, syncGateway, emulator, cdkDeps, cfnLint, lint}},
		{target: "test-infra", want: []string{services, emulator, cdkDeps, cfnLint}},
		{target: "localstack-deploy", want: []string{services, emulator, cdkDeps}},
		{target: "localstack-demo", want: []string{services, emulator}},
		{target: "bench", want: []string{services, syncGateway, emulator, cdkDeps}},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			t.Parallel()
			// -B: every prerequisite, made or not on this machine;
			// -n: printed, not run.
			out, err := exec.Command("make", "-C", "..", "-n", "-B", tt.target).CombinedOutput()
			if err != nil {
				t.Fatalf("make -n %s: %v\n%s", tt.target, err, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("make %s does not run %s", tt.target, w)
				}
			}
			for _, n := range tt.never {
				if strings.Contains(string(out), n) {
					t.Errorf("make %s runs %s, which it does not need", tt.target, n)
				}
			}
		})
	}
}
