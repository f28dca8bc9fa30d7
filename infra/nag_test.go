package main

//lint:file-ignore SA1019 the Go CDK reads synthesis messages (errors, warnings, cdk-nag findings) only through cxapi.SynthesisMessage; its replacement is not published for Go.

import (
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2/cxapi"
)

// TestNagAwsSolutions requires cdk-nag's AwsSolutions pack (applied to the
// app by buildApp, as in every deploy) to report no unsuppressed error.
// Every suppression carries its reason in the template metadata.
func TestNagAwsSolutions(t *testing.T) {
	syn := synthesized(t)
	for _, m := range syn.messages {
		if !strings.HasPrefix(m.text, "AwsSolutions-") {
			continue
		}
		switch m.level {
		case string(cxapi.SynthesisMessageLevel_ERROR):
			t.Errorf("%s: %s", m.path, firstLine(m.text))
		default:
			t.Logf("%s %s: %s", m.level, m.path, firstLine(m.text))
		}
	}
	if n := checkSuppressions(t, syn); n == 0 {
		t.Errorf("no cdk-nag suppression metadata found: were the checks applied?")
	}
}

// checkSuppressions requires every cdk-nag suppression of every template,
// on a resource or on a whole stack, to carry a real reason, and returns
// how many there are.
func checkSuppressions(t *testing.T, syn *synthesis) int {
	t.Helper()
	suppressed := 0
	check := func(where string, md any) {
		m, _ := md.(map[string]any)
		nag, _ := m["cdk_nag"].(map[string]any)
		rules, _ := nag["rules_to_suppress"].([]any)
		for _, rule := range rules {
			rule := rule.(map[string]any)
			suppressed++
			if reason, _ := rule["reason"].(string); len(reason) < 40 {
				t.Errorf("%s: suppression of %v has no real reason: %q", where, rule["id"], reason)
			}
		}
	}
	for path, tmpl := range syn.templates {
		check(path, tmpl["Metadata"])
		for id, r := range tmpl["Resources"].(map[string]any) {
			check(id, r.(map[string]any)["Metadata"])
		}
	}
	return suppressed
}

// TestNagCoversSplitPolicies: the writer of a job with many S3 outputs has
// more statements than one inline policy holds, and the CDK splits them off
// into managed policies; cdk-nag's wildcard findings there are accepted as
// on the role's own policy, and no other finding is.
func TestNagCoversSplitPolicies(t *testing.T) {
	synthesized(t) // the shared synthesis first, before the parallel tests
	t.Parallel()   // its own syntheses beside them, one at a time (jsiiMu)
	var outputs []string
	for i := range 40 {
		outputs = append(outputs, fmt.Sprintf(`{"id": "files%02d", "type": "s3", "s3": {"bucket": "exports-%02d", "prefix": "tenant-%02d/documents/"}}`, i, i, i))
	}
	syn, err := synthesizeDoc(t, fmt.Sprintf(`{"stack": {"prefix": "cwwide"}, "jobs": [{"id": "tenants", "source": {"type": "couchdb", "url": "http://couch.internal:5984/db"}, "outputs": [%s]}]}`,
		strings.Join(outputs, ",")))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(syn.resources("AWS::IAM::ManagedPolicy")); n == 0 {
		t.Fatalf("no policy was split off: the test needs a larger writer policy")
	}
	for _, m := range syn.messages {
		if strings.HasPrefix(m.text, "AwsSolutions-") && m.level == string(cxapi.SynthesisMessageLevel_ERROR) {
			t.Errorf("%s: %s", m.path, firstLine(m.text))
		}
	}
	checkSuppressions(t, syn)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
