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

// TestUpStartsOnlyServices runs localstack/up.sh (make up, which make demo
// runs) in a copy of localstack/ where every service already answers: it
// installs and builds nothing (no go, pip, npm, mvn or apt-get), neither
// Sync Gateway nor the Lambda emulator, and lists the five services.
func TestUpStartsOnlyServices(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(answerAll))
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}

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
	stubs := map[string]string{"psql": upStubPsql, "pg_lsclusters": upStubPgLsclusters}
	for _, name := range []string{"go", "apt-get", "mvn", "npm", "node", "java", "pip", "pip3", "pyenv", "runuser", "pg_ctlcluster", "pg_createcluster"} {
		stubs[name] = upStub
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range stubs {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	log := filepath.Join(root, "calls.log")
	cmd := exec.Command("bash", filepath.Join(root, "localstack", "up.sh"))
	cmd.Env = []string{
		"PATH=" + bin + ":" + os.Getenv("PATH"),
		"HOME=" + root,
		"STUB_LOG=" + log,
		"LOCALSTACK_PORT=" + port, "S3_PORT=" + port, "DYNAMODB_PORT=" + port, "COUCH_PORT=" + port,
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("up.sh: %v\n%s", err, out)
	}
	calls, err := os.ReadFile(log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(calls)), "\n") {
		if line != "" && !strings.HasPrefix(line, "pg_lsclusters ") {
			t.Errorf("up.sh ran %q; with every service answering it installs and builds nothing", line)
		}
	}
	for _, want := range []string{"dynamodb ", "aws ", "s3 ", "couch ", "postgres "} {
		if !strings.Contains(string(out), "\n"+want) {
			t.Errorf("up.sh's table lacks the %sline:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "syncgw") {
		t.Errorf("up.sh's table lists Sync Gateway, a tool of the tests:\n%s", out)
	}
}

// TestMakeTargetsBuildTheirTools: make demo builds neither Sync Gateway nor
// the Lambda emulator (aws-lambda-rie); make test builds both, with
// everything else its packages need (the CDK CLI, cfn-lint); the targets
// that run Lambda functions on LocalStack build the emulator, and the
// benchmarks, which also read a Sync Gateway, build both.
func TestMakeTargetsBuildTheirTools(t *testing.T) {
	t.Parallel()
	const (
		syncGateway = "localstack/syncgateway.sh"
		emulator    = "localstack/lambda-rie.sh"
		cdkDeps     = "npm ci --prefix infra"
		cfnLint     = "cfn-lint"
		services    = "localstack/up.sh"
	)
	tests := []struct {
		target      string
		want, never []string
	}{
		{target: "demo", want: []string{services}, never: []string{syncGateway, emulator}},
		{target: "up", want: []string{services}, never: []string{syncGateway, emulator}},
		{target: "test", want: []string{services, syncGateway, emulator, cdkDeps, cfnLint}},
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
