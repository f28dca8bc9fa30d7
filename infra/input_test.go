package main

//lint:file-ignore SA1019 the Go CDK reads synthesis messages (errors, warnings, cdk-nag findings) only through cxapi.SynthesisMessage; its replacement is not published for Go.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2/cxapi"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
)

func TestSecretRefs(t *testing.T) {
	t.Parallel()
	f, err := config.Load(testConfig)
	if err != nil {
		t.Fatal(err)
	}
	src, out := secretRefs(f)
	wantSrc := []config.SecretRef{{Secret: "orders/sgw-password"}, {Env: "CATALOG_SOURCE_TOKEN"}}
	wantOut := []config.SecretRef{{Secret: "arn:aws:secretsmanager:us-east-1:123456789012:secret:orders/pg-dsn-AbCdEf"}, {Env: "CRM_TOKEN"}}
	if diff := cmp.Diff(wantSrc, src); diff != "" {
		t.Errorf("source refs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantOut, out); diff != "" {
		t.Errorf("output refs (-want +got):\n%s", diff)
	}
	if got, want := envSecretNames(src, out), []string{"CATALOG_SOURCE_TOKEN", "CRM_TOKEN"}; !cmp.Equal(got, want) {
		t.Errorf("envSecretNames = %v, want %v", got, want)
	}
}

func TestLoadInputErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	valid, err := os.ReadFile(testConfig)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		configPath string
		buildDir   string
		want       string
	}{
		{name: "missing config", configPath: filepath.Join(dir, "nope.json"), buildDir: dir, want: "read job configuration: open " + filepath.Join(dir, "nope.json")},
		{name: "missing bootstrap", configPath: testConfig, buildDir: filepath.Join(dir, "empty"), want: "run make build first"},
		{name: "bad retention", configPath: write("retention.json", strings.Replace(string(valid), `"log_retention_days": 14`, `"log_retention_days": 15`, 1)), buildDir: dir, want: "stack.log_retention_days: 15"},
		{name: "bad secret ARN", configPath: write("arn.json", strings.Replace(string(valid), `"orders/sgw-password"`, `"arn:aws:ssm:us-east-1:123456789012:parameter/x"`, 1)), buildDir: dir, want: "not a Secrets Manager secret ARN"},
		{name: "invalid config", configPath: write("invalid.json", `{"jobs": []}`), buildDir: dir, want: "at least one job"},
		{name: "names too long", configPath: write("long.json", strings.Replace(strings.Replace(string(valid), `"prefix": "cwtest"`, `"prefix": "changes-worker-production-eu"`, 1), `"id": "catalog"`, `"id": "catalog-of-every-product-we-sell"`, 1)),
			buildDir: dir, want: "jobs[catalog-of-every-product-we-sell].id: the name changes-worker-production-eu-catalog-of-every-product-we-sell-poller is 68 characters, AWS allows 64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := loadInput(tt.configPath, tt.buildDir, t.TempDir(), "", variantFull)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("loadInput error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestBucketGiven(t *testing.T) {
	t.Parallel()
	tests := []struct {
		raw  string
		want bool
	}{
		{`{"stack": {"prefix": "x"}}`, false},
		{`{"stack": {"bucket": ""}}`, false},
		{"// comment\n{\"stack\": {\"bucket\": \"existing\" /* here */}}", true},
	}
	for _, tt := range tests {
		got, err := bucketGiven([]byte(tt.raw))
		if err != nil || got != tt.want {
			t.Errorf("bucketGiven(%s) = %v, %v; want %v", tt.raw, got, err, tt.want)
		}
	}
}

// TestSynthTooManyResources: a job whose stack would exceed CloudFormation's
// 500 resources fails the synth with an error that says so, not a panic.
func TestSynthTooManyResources(t *testing.T) {
	synthesized(t) // the shared synthesis first, before the parallel tests
	t.Parallel()   // its own syntheses beside them, one at a time (jsiiMu)
	var outputs []string
	for i := range 60 {
		outputs = append(outputs, fmt.Sprintf(`{"id": "pg%02d", "type": "postgres", "postgres": {"dsn": {"env": "PG_DSN"}, "table": "t%02d"}}`, i, i))
	}
	_, err := synthesizeDoc(t, fmt.Sprintf(`{"stack": {"prefix": "cwbig"}, "jobs": [{"id": "wide", "source": {"type": "couchdb", "url": "http://couch.internal:5984/db"}, "outputs": [%s]}]}`,
		strings.Join(outputs, ",")))
	if err == nil || !strings.Contains(err.Error(), "is greater than allowed maximum of 500") || !strings.Contains(err.Error(), "cwbig/Job-wide") {
		t.Fatalf("synthesize a job of 60 outputs: error %v, want one naming the job's stack and its resources over 500", err)
	}
	t.Logf("synth error: %s", firstLine(err.Error()))
}

// TestExistingBucketNoRetain synthesizes a second configuration: an existing
// bucket named in stack.bucket, retain off, no dashboards, no VPC and no alarm
// e-mail.
func TestExistingBucketNoRetain(t *testing.T) {
	synthesized(t) // share the jsii runtime; make sure the main synthesis works first
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "jobs.json")
	if err := os.WriteFile(cfgPath, []byte(`{
  "stack": {"prefix": "cwalt", "bucket": "existing-data", "retain": false, "dashboards": false},
  "jobs": [{
    "id": "one",
    "source": {"type": "couchdb", "url": "http://couch.internal:5984/db"},
    "outputs": [{"id": "files", "type": "s3", "s3": {"prefix": "docs/"}}]
  }]
}`), 0o644); err != nil {
		t.Fatal(err)
	}
	syn, err := synthesize(cfgPath, variantFull, dir)
	if err != nil {
		t.Fatal(err)
	}
	expiryWarned := false
	for _, m := range syn.messages {
		if m.level == string(cxapi.SynthesisMessageLevel_ERROR) {
			t.Errorf("synth error at %s: %s", m.path, m.text)
		}
		if m.level == string(cxapi.SynthesisMessageLevel_WARNING) && strings.Contains(m.text, "existing-data") &&
			strings.Contains(m.text, "claim-check/") && strings.Contains(m.text, "changesctl bucket check") {
			expiryWarned = true
		}
	}
	// The stack never changes the lifecycle of a bucket it does not own:
	// synth tells how to add the claim-check expiry and how to check it.
	if !expiryWarned {
		t.Errorf("no synth warning about the claim-check expiry rule of the existing bucket")
	}
	if n := len(syn.resources("AWS::S3::Bucket")); n != 0 {
		t.Errorf("%d buckets created, want none: stack.bucket names an existing one", n)
	}
	if n := len(syn.resources("AWS::CloudWatch::Dashboard")); n != 0 {
		t.Errorf("%d dashboards created, want none: stack.dashboards is false", n)
	}
	_, table := syn.resource(t, "AWS::DynamoDB::Table", "TableName", "cwalt-state")
	if table["DeletionPolicy"] != "Delete" || props(table)["DeletionProtectionEnabled"] != false {
		t.Errorf("table DeletionPolicy %v, DeletionProtectionEnabled %v; want Delete, false", table["DeletionPolicy"], props(table)["DeletionProtectionEnabled"])
	}
	for _, fn := range []string{fnPoller, fnWriter} {
		_, f := syn.resource(t, "AWS::Lambda::Function", "FunctionName", "cwalt-one-"+fn)
		vars := props(f)["Environment"].(map[string]any)["Variables"].(map[string]any)
		if vars[envBucket] != "existing-data" {
			t.Errorf("%s %s = %v, want existing-data", fn, envBucket, vars[envBucket])
		}
		if _, ok := props(f)["VpcConfig"]; ok {
			t.Errorf("%s is in a VPC without stack.vpc", fn)
		}
	}
	writer := rolePolicy(t, syn, "cwalt-one-writer")
	for _, want := range []string{":s3:::existing-data/claim-check/one/*", ":s3:::existing-data/docs/*"} {
		if !strings.Contains(writer, want) {
			t.Errorf("writer policy lacks %s: %s", want, writer)
		}
	}
	if strings.Contains(writer, ":s3:::existing-data/claim-check/*") {
		t.Errorf("writer may read every job's claim checks: %s", writer)
	}
	resources, _ := syn.tmpl["Resources"].(map[string]any)
	for id, r := range resources {
		typ, _ := r.(map[string]any)["Type"].(string)
		if typ == "AWS::CloudFormation::CustomResource" || strings.HasPrefix(typ, "Custom::") {
			t.Errorf("custom resource %s (%s): the stack must not touch the existing bucket's configuration", id, typ)
		}
	}
	if strings.Contains(writer, "ec2:") {
		t.Errorf("writer has EC2 permissions without stack.vpc")
	}
	if n := len(syn.resources("AWS::SNS::Subscription")); n != 0 {
		t.Errorf("%d subscriptions without stack.alarm_email", n)
	}
	if n := len(syn.resources("AWS::SecretsManager::Secret")); n != 0 {
		t.Errorf("%d secrets created without env references", n)
	}
}

// TestBootstrapArch reads the architecture from ELF headers as the Go
// toolchain writes them (64-bit little-endian, e_machine at offset 18).
func TestBootstrapArch(t *testing.T) {
	t.Parallel()
	header := func(machine byte) []byte {
		h := make([]byte, 64)
		copy(h, "\x7fELF\x02\x01\x01")
		h[18] = machine
		return h
	}
	tests := []struct {
		name    string
		content []byte
		want    string
		wantErr string
	}{
		{name: "arm64", content: header(0xb7), want: archARM64},
		{name: "amd64", content: header(0x3e), want: archX8664},
		{name: "a script", content: []byte("#!/bin/sh\n"), want: archARM64},
		{name: "another machine", content: header(0x28), wantErr: "which Lambda does not run"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := filepath.Join(t.TempDir(), "bootstrap")
			if err := os.WriteFile(p, tt.content, 0o755); err != nil {
				t.Fatal(err)
			}
			got, err := bootstrapArch(p)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("bootstrapArch = %q, %v; want an error saying %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("bootstrapArch = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
