package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// deployStubAWS stands in for the AWS CLI in TestDeployScriptSecrets: it
// records every call (and the value piped to put-secret-value) in $STUB_LOG
// and answers the listings deploy.sh reads as LocalStack would for a stack
// "shop" with one job and, besides the stack's secrets, a secret of the
// user's under the same prefix.
const deployStubAWS = `#!/usr/bin/env bash
set -euo pipefail
shift 2 # -m awscli
printf 'call %s\n' "$*" >>"$STUB_LOG"
case "$1 $2" in
"secretsmanager list-secrets") printf 'shop/PG_DSN\tshop/crm-token\tshop/orders-dsn\n' ;;
"secretsmanager put-secret-value") printf 'value %s\n' "$(cat)" >>"$STUB_LOG" ;;
"lambda list-functions") printf 'shop-orders-poller\tshop-orders-writer\n' ;;
"lambda get-function") echo Active ;;
"cloudformation describe-stacks") echo CREATE_COMPLETE ;;
"events list-rules") echo shop-orders-schedule ;;
"events list-targets-by-rule") echo '[]' ;;
esac
`

// deployStubCDK stands in for cdklocal: a deploy writes the stack's outputs
// and, as the synth before it does, the stack's template into the cloud
// assembly directory (-o).
const deployStubCDK = `#!/usr/bin/env bash
set -euo pipefail
printf 'cdklocal %s\n' "$*" >>"$STUB_LOG"
[[ "$1" == deploy ]] || exit 0
while [[ $# -gt 0 ]]; do
	case "$1" in
	-o) out=$2; shift ;;
	--outputs-file) outputs=$2; shift ;;
	esac
	shift
done
mkdir -p "$out"
cp "$STUB_TEMPLATE" "$out/shop.template.json"
echo '{"shop": {"BucketName": "shop-databucket-1"}}' >"$outputs"
`

// deployStubGo stands in for go: deploy.sh asks for GOARCH and builds the
// functions.
const deployStubGo = `#!/usr/bin/env bash
case "$1" in
env) echo amd64 ;;
build) while [[ $# -gt 0 ]]; do
	[[ "$1" == -o ]] && { mkdir -p "$(dirname "$2")"; : >"$2"; }
	[[ "$1" == -ldflags=* ]] && printf 'go build %s\n' "$1" >>"$STUB_LOG"
	shift
done ;;
esac
`

// TestDeployScriptSecrets runs localstack/deploy.sh with the AWS CLI,
// cdklocal, go and changesctl stubbed, for a stack whose secrets are
// shop/PG_DSN and shop/crm-token ({"env": "crm-token"}: a name that is no
// shell variable name) beside the user's own shop/orders-dsn, the naming
// docs/deploy.md uses. Each secret the stack created gets the value of the
// environment variable it names, whatever that name; a secret the stack did
// not create is left alone, even when a variable of its name is set; and the
// script goes on to enable the schedule rules. CHANGES_AWS_CALLS becomes
// the functions' (-c aws_calls), not the bootstrap's; the functions are
// built with VERSION and CHANGES_COMMIT stamped in.
func TestDeployScriptSecrets(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	script, err := os.ReadFile(filepath.Join("..", "localstack", "deploy.sh"))
	if err != nil {
		t.Fatal(err)
	}
	bootstrap, err := os.ReadFile(filepath.Join("..", "localstack", "cdk-bootstrap.sh"))
	if err != nil {
		t.Fatal(err)
	}
	template, err := json.Marshal(map[string]any{"Resources": map[string]any{
		"EnvSecretPGDSN":    map[string]any{"Type": "AWS::SecretsManager::Secret", "Properties": map[string]any{"Name": "shop/PG_DSN"}},
		"EnvSecretcrmtoken": map[string]any{"Type": "AWS::SecretsManager::Secret", "Properties": map[string]any{"Name": "shop/crm-token"}},
		"State":             map[string]any{"Type": "AWS::DynamoDB::Table", "Properties": map[string]any{"TableName": "shop-state"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for path, content := range map[string]string{
		"localstack/deploy.sh":              string(script),
		"localstack/cdk-bootstrap.sh":       string(bootstrap),
		".local/localstack/venv/bin/python": deployStubAWS,
		"infra/node_modules/.bin/cdklocal":  deployStubCDK,
		"bin/go":                            deployStubGo,
		"bin/changesctl":                    "#!/bin/sh\nprintf 'changesctl %s (calls recorded in %s)\\n' \"$1\" \"$CHANGES_AWS_CALLS\" >>\"$STUB_LOG\"\n",
		"template.json":                     string(template),
		"jobs.json":                         "{}\n",
		"VERSION":                           "1.2.3\n",
	} {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	log := filepath.Join(root, "calls.log")
	cmd := exec.Command("bash", filepath.Join(root, "localstack", "deploy.sh"), filepath.Join(root, "bin", "changesctl"), filepath.Join(root, "jobs.json"))
	cmd.Env = []string{
		"PATH=" + filepath.Join(root, "bin") + ":" + os.Getenv("PATH"),
		"HOME=" + root,
		"STUB_LOG=" + log,
		"STUB_TEMPLATE=" + filepath.Join(root, "template.json"),
		"AWS_REGION=us-east-1",
		"AWS_ENDPOINT_URL=http://127.0.0.1:4566",
		"AWS_ENDPOINT_URL_S3=http://127.0.0.1:4566",
		"CDK_OUT=" + filepath.Join(root, "cdk.out"),
		"PG_DSN=postgres://u:pw@db/x",
		"crm-token=the token",
		"orders-dsn=not for the stack",
		"CHANGES_AWS_CALLS=/calls/aws.jsonl",
		"CHANGES_COMMIT=0123456789ab",
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("deploy.sh: %v\n%s", err, out)
	}
	calls, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	got := string(calls)
	for _, want := range []string{
		"call secretsmanager put-secret-value --secret-id shop/PG_DSN --secret-string file:///dev/stdin\nvalue postgres://u:pw@db/x\n",
		"call secretsmanager put-secret-value --secret-id shop/crm-token --secret-string file:///dev/stdin\nvalue the token\n",
		"call events enable-rule --name shop-orders-schedule\n",
		// The functions record their AWS requests; the bootstrap --remove
		// before the deploy does not.
		"-c aws_calls=/calls/aws.jsonl",
		"changesctl bootstrap (calls recorded in )\n",
		// The functions carry the release and the commit it was given.
		"go build -ldflags=-s -w -X github.com/changes-worker/changes-worker/shared/version.version=1.2.3 -X github.com/changes-worker/changes-worker/shared/version.commit=0123456789ab\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("deploy.sh did not call\n%s\ncalls:\n%s\noutput:\n%s", want, got, out)
		}
	}
	if strings.Contains(got, "put-secret-value --secret-id shop/orders-dsn") {
		t.Errorf("deploy.sh wrote the user's secret shop/orders-dsn, which the stack did not create:\n%s", got)
	}
}
