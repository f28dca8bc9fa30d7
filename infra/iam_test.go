package main

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/changes-worker/changes-worker/shared/config"
)

// policyLocations says where each resource type keeps its policy documents.
var policyLocations = map[string][]string{
	"AWS::IAM::Policy":                    {"PolicyDocument"},
	"AWS::IAM::ManagedPolicy":             {"PolicyDocument"},
	"AWS::IAM::Role":                      {"AssumeRolePolicyDocument", "Policies[].PolicyDocument"},
	"AWS::SQS::QueuePolicy":               {"PolicyDocument"},
	"AWS::S3::BucketPolicy":               {"PolicyDocument"},
	"AWS::SNS::TopicPolicy":               {"PolicyDocument"},
	"AWS::KMS::Key":                       {"KeyPolicy"},
	"AWS::SecretsManager::ResourcePolicy": {"ResourcePolicy"},
}

// vpcNetworkActions are the EC2 actions Lambda needs in the execution role of
// a function in a VPC. Lambda's check of the role and the actions themselves
// take no resource scope: ec2:DescribeNetworkInterfaces and
// ec2:DescribeSubnets support no resource-level permissions at all.
var vpcNetworkActions = map[string]bool{
	"ec2:CreateNetworkInterface":     true,
	"ec2:DescribeNetworkInterfaces":  true,
	"ec2:DescribeSubnets":            true,
	"ec2:DeleteNetworkInterface":     true,
	"ec2:AssignPrivateIpAddresses":   true,
	"ec2:UnassignPrivateIpAddresses": true,
}

// TestIAMNoWildcards walks every policy statement of the template.
//
//   - No Allow statement has a "*" in an action, and none uses NotAction.
//   - Deny statements may use "service:*" only to refuse every request made
//     without TLS (aws:SecureTransport false) or with TLS older than 1.2
//     (s3:TlsVersion): a deny can only take access
//     away, and listing actions one by one would let any new action through.
//     cdk-nag's TLS rules (S10, SQS4, SNS3) require that form.
//   - Resource "*" appears only where AWS requires it: in a KMS key policy,
//     where "*" means the key itself, for the EC2 network-interface actions
//     of a function in a VPC (vpcNetworkActions), and for the writer's
//     lambda:ListEventSourceMappings, a read that takes no resource.
//   - No managed policy whose name ends in FullAccess is attached.
func TestIAMNoWildcards(t *testing.T) {
	syn := synthesized(t)
	checked := 0
	for typ, locations := range policyLocations {
		for id, r := range syn.resources(typ) {
			for _, loc := range locations {
				for _, doc := range policyDocs(props(r), loc) {
					for _, st := range statements(doc) {
						checked++
						checkStatement(t, typ, id, st)
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no policy statement found")
	}
	for id, r := range syn.resources("AWS::IAM::Role") {
		arns, _ := props(r)["ManagedPolicyArns"].([]any)
		for _, arn := range arns {
			if strings.Contains(compact(arn), "FullAccess") {
				t.Errorf("role %s has managed policy %s", id, compact(arn))
			}
		}
	}
	for id, r := range syn.resources("AWS::Lambda::Permission") {
		if a, _ := props(r)["Action"].(string); strings.Contains(a, "*") {
			t.Errorf("lambda permission %s allows %s", id, a)
		}
	}
	t.Logf("checked %d policy statements", checked)
}

func checkStatement(t *testing.T, typ, id string, st map[string]any) {
	t.Helper()
	where := typ + " " + id + " statement " + compact(st["Sid"])
	if _, ok := st["NotAction"]; ok {
		t.Errorf("%s uses NotAction", where)
	}
	if _, ok := st["NotResource"]; ok {
		t.Errorf("%s uses NotResource", where)
	}
	actions := strs(st["Action"])
	if st["Effect"] == "Deny" {
		cond := compact(st["Condition"])
		tlsOnly := strings.Contains(cond, `"aws:SecureTransport":"false"`) || strings.Contains(cond, `{"NumericLessThan":{"s3:TlsVersion":`)
		for _, a := range actions {
			if strings.Contains(a, "*") && !tlsOnly {
				t.Errorf("%s denies wildcard action %s other than for non-TLS requests", where, a)
			}
		}
		return
	}
	for _, a := range actions {
		if strings.Contains(a, "*") {
			t.Errorf("%s allows wildcard action %s", where, a)
		}
	}
	checkObjectScope(t, where, actions, st["Resource"])
	if !contains(strs(st["Resource"]), "*") {
		return
	}
	switch {
	case typ == "AWS::KMS::Key":
		// In a key policy the resource is always "*": this key.
	case allIn(actions, vpcNetworkActions):
	case allIn(actions, map[string]bool{"lambda:ListEventSourceMappings": true}):
	default:
		t.Errorf("%s allows %v on Resource \"*\"", where, actions)
	}
}

// wholeBucket matches the end of an object ARN that covers every object of
// a bucket; everyJob one that covers every job's claim checks.
var (
	wholeBucket = regexp.MustCompile(`(^|:s3:::[^/]*)/\*$`)
	everyJob    = regexp.MustCompile(`/` + regexp.QuoteMeta(config.ClaimCheckPrefix) + `\*$`)
)

// checkObjectScope refuses S3 object actions granted on every object of a
// bucket, or on every job's claim checks rather than the configured jobs'.
func checkObjectScope(t *testing.T, where string, actions []string, resource any) {
	t.Helper()
	object := false
	for _, a := range actions {
		object = object || a == "s3:GetObject" || a == "s3:PutObject" || a == "s3:DeleteObject"
	}
	if !object {
		return
	}
	list, ok := resource.([]any)
	if !ok {
		list = []any{resource}
	}
	for _, r := range list {
		tail := arnTail(r)
		switch {
		case wholeBucket.MatchString(tail):
			t.Errorf("%s allows %v on every object of a bucket: %s", where, actions, compact(r))
		case everyJob.MatchString(tail):
			t.Errorf("%s allows %v on every job's claim checks: %s", where, actions, compact(r))
		}
	}
}

// arnTail returns the literal end of a resource: the string itself, or the
// last part of an Fn::Join.
func arnTail(r any) string {
	switch r := r.(type) {
	case string:
		return r
	case map[string]any:
		join, _ := r["Fn::Join"].([]any)
		if len(join) == 2 {
			parts, _ := join[1].([]any)
			if len(parts) > 0 {
				s, _ := parts[len(parts)-1].(string)
				return s
			}
		}
	}
	return ""
}

func allIn(actions []string, set map[string]bool) bool {
	for _, a := range actions {
		if !set[a] {
			return false
		}
	}
	return len(actions) > 0
}

// policyDocs returns the documents at loc ("Key" or "List[].Key") in p.
func policyDocs(p map[string]any, loc string) []map[string]any {
	if list, key, ok := strings.Cut(loc, "[]."); ok {
		var docs []map[string]any
		items, _ := p[list].([]any)
		for _, it := range items {
			if m, ok := it.(map[string]any); ok {
				if d, ok := m[key].(map[string]any); ok {
					docs = append(docs, d)
				}
			}
		}
		return docs
	}
	if d, ok := p[loc].(map[string]any); ok {
		return []map[string]any{d}
	}
	return nil
}

// statements returns the statements of a policy document.
func statements(doc map[string]any) []map[string]any {
	var out []map[string]any
	switch s := doc["Statement"].(type) {
	case []any:
		for _, e := range s {
			if m, ok := e.(map[string]any); ok {
				out = append(out, m)
			}
		}
	case map[string]any:
		out = append(out, s)
	}
	return out
}

// statementsOf decodes a policy document given as JSON.
func statementsOf(doc string) []map[string]any {
	var m map[string]any
	if err := json.Unmarshal([]byte(doc), &m); err != nil {
		return nil
	}
	return statements(m)
}

// TestS3OutputGrantOwnPrefix: the writer's grant on an S3 output is
// bucket/<prefix>* for a prefix that ends with '/' (by default
// <job>/<output>/), never the whole bucket; a prefix that would widen it (no
// trailing '/', a wildcard) is refused before anything is synthesized.
func TestS3OutputGrantOwnPrefix(t *testing.T) {
	synthesized(t) // one synthesis at a time through the jsii runtime
	doc := func(s3 string) string {
		return `{"stack": {"prefix": "cwpfx"}, "jobs": [{"id": "one", "source": {"type": "couchdb", "url": "https://couch.internal/db"},
			"outputs": [{"id": "files", "type": "s3", "s3": ` + s3 + `}, {"id": "mine", "type": "s3", "s3": {"bucket": "mine", "prefix": "docs/"}}]}]}`
	}
	syn, err := synthesizeDoc(t, doc(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	var objects, lists []string
	for _, st := range statementsOf(rolePolicy(t, syn, "cwpfx-one-writer")) {
		actions := strs(st["Action"])
		switch {
		case contains(actions, "s3:PutObject"):
			objects = append(objects, arnTail(st["Resource"]))
		case contains(actions, "s3:ListBucket"):
			lists = append(lists, compact(st["Condition"]))
		}
	}
	slices.Sort(objects)
	slices.Sort(lists)
	if want := []string{"/one/files/*", ":s3:::mine/docs/*"}; !slices.Equal(objects, want) {
		t.Errorf("writer's object grants end in %q, want %q", objects, want)
	}
	if want := []string{`{"StringLike":{"s3:prefix":["docs/*"]}}`, `{"StringLike":{"s3:prefix":["one/files/*"]}}`}; !slices.Equal(lists, want) {
		t.Errorf("writer's list conditions %q, want %q", lists, want)
	}
	for _, c := range []struct{ s3, want string }{
		{`{"prefix": "exports"}`, `jobs[one].outputs[files].s3.prefix: "exports" must end with '/'`},
		{`{"prefix": "ex*/"}`, `jobs[one].outputs[files].s3.prefix: "ex*/" must not contain '*', '?' or '$'`},
		{`{"prefix": "claim-check/one/"}`, "overlaps"},
	} {
		if _, err := synthesizeDoc(t, doc(c.s3)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("synthesize with s3 %s: error %v, want one containing %q", c.s3, err, c.want)
		}
	}
}
