package main

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// deployDoc is the page that tells how to deploy the stack.
var deployDoc = filepath.Join("..", "docs", "deploy.md")

// vpcEndpoints are, for each AWS service a function's role may call, the
// service's name in docs/deploy.md and the kind of VPC endpoint that reaches
// it from private subnets.
var vpcEndpoints = map[string]struct{ name, kind string }{
	"dynamodb":       {"DynamoDB", "gateway"},
	"s3":             {"S3", "gateway"},
	"sqs":            {"SQS", "interface"},
	"secretsmanager": {"Secrets Manager", "interface"},
	"lambda":         {"Lambda", "interface"},
}

// TestVPCEndpointsDocumented: docs/deploy.md names, for functions in a VPC,
// an endpoint for exactly the services the functions' roles call, each of
// the kind that service takes, and says that the interface endpoints' security
// group must admit the functions on 443. The roles' logs: and ec2: actions are
// used by Lambda itself, outside the VPC (it delivers the functions' logs, EMF
// metrics included, and manages their network interfaces): no Logs endpoint.
func TestVPCEndpointsDocumented(t *testing.T) {
	syn := synthesized(t)
	services := map[string][]string{}
	for _, j := range syn.cfg.Jobs {
		for _, fn := range []string{fnPoller, fnWriter, fnVerify} {
			for _, st := range statementsOf(rolePolicy(t, syn, functionName(syn.cfg, j, fn))) {
				for _, a := range strs(st["Action"]) {
					service, _, _ := strings.Cut(a, ":")
					if service == "logs" || service == "ec2" {
						continue
					}
					e, ok := vpcEndpoints[service]
					if !ok {
						t.Errorf("the %s role calls %s: which VPC endpoint reaches it?", fn, a)
						continue
					}
					if !contains(services[e.kind], e.name) {
						services[e.kind] = append(services[e.kind], e.name)
					}
				}
			}
		}
	}
	doc, err := os.ReadFile(deployDoc)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(doc)), " ")
	for _, kind := range []string{"gateway", "interface"} {
		sort.Strings(services[kind])
		names := services[kind]
		list := strings.Join(names, " and ")
		if len(names) > 2 {
			list = strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
		}
		want := kind + " endpoints for " + list
		// A list of capitalized names joined by ", " and " and ".
		name := `[A-Z][A-Za-z0-9]*(?: [A-Z][A-Za-z0-9]*)*`
		lists := regexp.MustCompile(kind+` endpoints for (`+name+`(?:(?:, | and )`+name+`)*)`).FindAllStringSubmatch(text, -1)
		if len(lists) == 0 {
			t.Errorf("%s names no %s endpoints; want %q", deployDoc, kind, want)
		}
		for _, l := range lists {
			if kind+" endpoints for "+l[1] != want {
				t.Errorf("%s: %q, want %q (the services the functions call)", deployDoc, kind+" endpoints for "+l[1], want)
			}
		}
	}
	if strings.Contains(text, "CloudWatch Logs (a NAT gateway") || strings.Contains(text, "and CloudWatch Logs:") {
		t.Errorf("%s asks the subnets to reach CloudWatch Logs, which the functions never call", deployDoc)
	}
	if !regexp.MustCompile(`interface endpoints[^.]*security group[^.]*443`).MatchString(text) {
		t.Errorf("%s does not say that the interface endpoints' security group must admit the functions on 443", deployDoc)
	}
}

// TestSSEKMSBucketsDocumented: a bucket the configuration names (stack.bucket,
// an S3 output's s3.bucket, attachments.bucket) may be encrypted with a KMS
// key of the owner's, which the stack cannot know and so does not grant:
// docs/deploy.md says so for each of those keys, with the KMS actions S3 asks
// for on behalf of a role that writes (kms:GenerateDataKey; a multipart
// upload also kms:Decrypt) and reads (kms:Decrypt), limited to S3
// (kms:ViaService), and how to find the roles to grant them to (the
// verify function's reads S3 outputs and writes claim checks too).
func TestSSEKMSBucketsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(deployDoc)
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	i := strings.Index(text, "### A bucket encrypted with your own KMS key")
	if i < 0 {
		t.Fatalf("%s has no section \"A bucket encrypted with your own KMS key\"", deployDoc)
	}
	section := text[i:]
	if j := strings.Index(section[1:], "\n#"); j >= 0 {
		section = section[:j+1]
	}
	for _, want := range []string{
		"`stack.bucket`", "`s3.bucket`", "`attachments.bucket`",
		"kms:GenerateDataKey", "kms:Decrypt", "kms:ViaService",
		"aws lambda get-function-configuration --function-name P-<job>-poller --query Role",
		"aws lambda get-function-configuration --function-name P-<job>-writer --query Role",
		"aws lambda get-function-configuration --function-name P-<job>-verify --query Role",
	} {
		if !strings.Contains(section, want) {
			t.Errorf("%s, A bucket encrypted with your own KMS key: does not name %s", deployDoc, want)
		}
	}
}
