package iamcheck_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	cfntypes "github.com/aws/aws-sdk-go-v2/service/cloudformation/types"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/iampolicy"
	"github.com/changes-worker/changes-worker/shared/testenv/iamcheck"
)

const (
	region  = "us-east-1"
	account = "111122223333"
	nested  = "arn:aws:cloudformation:us-east-1:111122223333:stack/shop-Joborders-1/abc"
)

// fakeCFN answers ListStackResources with the physical ids of each stack.
type fakeCFN map[string]map[string]string

func (f fakeCFN) ListStackResources(_ context.Context, in *cloudformation.ListStackResourcesInput, _ ...func(*cloudformation.Options)) (*cloudformation.ListStackResourcesOutput, error) {
	out := &cloudformation.ListStackResourcesOutput{}
	for id, phys := range f[aws.ToString(in.StackName)] {
		out.StackResourceSummaries = append(out.StackResourceSummaries, cfntypes.StackResourceSummary{LogicalResourceId: aws.String(id), PhysicalResourceId: aws.String(phys)})
	}
	return out, nil
}

var deployed = fakeCFN{
	"shop": {"DataBucketE3889A50": "shop-databucket-1x2y", "DataBucketPolicy3231C704": "p", "JobordersNestedStackResource": nested},
	nested: {
		"Queueorderspg": "http://sqs.us-east-1.localhost.localstack.cloud:4566/111122223333/shop-orders-pg",
		"PollerLogs":    "/aws/lambda/shop-orders-poller", "PollerRole": "shop-Joborders-PollerRole-XYZ",
		"PollerRoleDefaultPolicy": "x", "Pollerorders": "shop-orders-poller",
	},
}

func policies(t *testing.T) *iamcheck.Policies {
	t.Helper()
	p, err := iamcheck.FromStack(t.Context(), deployed, filepath.Join("testdata", "assembly"), "shop", region, account)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestFromStack: the function's role is its caller's principal, with its
// attached and inline policies resolved to the deployed resources (Ref,
// Fn::GetAtt, Fn::Join, Fn::Sub, pseudo parameters, a nested stack's
// parameter), and the bucket policy is a resource-based policy.
func TestFromStack(t *testing.T) {
	t.Parallel()
	p := policies(t)
	pr := p.Callers["shop-orders-poller"]
	if pr == nil || len(p.Callers) != 1 {
		t.Fatalf("callers %v, want shop-orders-poller only", p.Callers)
	}
	if want := "arn:aws:iam::111122223333:role/shop-Joborders-PollerRole-XYZ"; pr.ARN != want {
		t.Errorf("role ARN %s, want %s", pr.ARN, want)
	}
	got := map[string][]string{}
	for _, pol := range append(append([]*iampolicy.Policy{}, pr.Policies...), p.Resource...) {
		for _, st := range pol.Statements {
			got[st.Sid] = append(got[st.Sid], st.Resource...)
		}
	}
	want := map[string][]string{
		"Inline":             {"arn:aws:sqs:us-east-1:111122223333:shop-orders-pg"},
		"":                   {"arn:aws:logs:us-east-1:111122223333:log-group:/aws/lambda/shop-orders-poller:*", "arn:aws:s3:::shop-databucket-1x2y", "arn:aws:s3:::shop-databucket-1x2y/*", "arn:aws:s3:::shop-databucket-1x2y/claim-check/*"},
		"LeaseAndCheckpoint": {"arn:aws:dynamodb:us-east-1:111122223333:table/shop-state"},
		"SendToWorkQueues":   {"arn:aws:sqs:us-east-1:111122223333:shop-orders-pg"},
		"WriteClaimChecks":   {"arn:aws:s3:::shop-databucket-1x2y/claim-check/shop/orders/*"},
		"Secret":             {"arn:aws:secretsmanager:us-east-1:111122223333:secret:shop/PG_DSN-??????"},
	}
	for k := range got {
		sortStrings(got[k])
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("resolved resources by statement (-want +got):\n%s", diff)
	}
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// TestCheck: a request the role allows passes; one outside its grants, one
// a resource policy denies, a call of an unknown caller and a call that
// could not be mapped are each reported; the grants no request used are
// listed, those Lambda uses itself marked. A statement that applied to a
// request counts as used even when a deny won.
func TestCheck(t *testing.T) {
	t.Parallel()
	p := policies(t)
	p.Callers["changesctl run"] = nil
	const table = "arn:aws:dynamodb:us-east-1:111122223333:table/shop-state"
	const queue = "arn:aws:sqs:us-east-1:111122223333:shop-orders-pg"
	lk := func(k ...string) map[string][]string { return map[string][]string{"dynamodb:LeadingKeys": k} }
	call := func(op string, reqs ...iampolicy.Request) awsconf.Call {
		return awsconf.Call{Caller: "shop-orders-poller", Service: "X", Operation: op, Region: region, Requests: reqs}
	}
	calls := []awsconf.Call{
		call("GetItem", iampolicy.Request{Action: "dynamodb:GetItem", Resource: table, Context: lk("orders")}),
		call("SendMessageBatch", iampolicy.Request{Action: "sqs:SendMessage", Resource: queue}),
		call("GetQueueAttributes", iampolicy.Request{Action: "sqs:GetQueueAttributes", Resource: queue}),
		call("PutObject", iampolicy.Request{Action: "s3:PutObject", Resource: "arn:aws:s3:::shop-databucket-1x2y/claim-check/shop/orders/1/2.json"}),
		call("UpdateItem", iampolicy.Request{Action: "dynamodb:UpdateItem", Resource: table, Context: lk("refunds")}),
		call("DeleteObject", iampolicy.Request{Action: "s3:DeleteObject", Resource: "arn:aws:s3:::shop-databucket-1x2y/claim-check/shop/orders/1/2.json"}),
		{Caller: "shop-refunds-poller", Service: "SQS", Operation: "SendMessage"},
		{Caller: "shop-orders-poller", Service: "SQS", Operation: "ListQueues", Unmapped: "no IAM mapping for SQS ListQueues"},
		{Caller: "changesctl run", Service: "SQS", Operation: "SendMessage"},
	}
	rep := iamcheck.Check(calls, p)
	wantDenied := []string{
		"shop-orders-poller: SQS ListQueues: cannot be checked: no IAM mapping for SQS ListQueues",
		"shop-orders-poller: X DeleteObject: s3:DeleteObject on arn:aws:s3:::shop-databucket-1x2y/claim-check/shop/orders/1/2.json with map[aws:SecureTransport:[true]] is explicitly denied by [shop/DataBucketPolicy3231C704 statement 1]",
		"shop-orders-poller: X UpdateItem: dynamodb:UpdateItem on arn:aws:dynamodb:us-east-1:111122223333:table/shop-state with map[aws:SecureTransport:[true] dynamodb:LeadingKeys:[refunds]] is implicitly denied",
		"shop-refunds-poller: SQS SendMessage: no policy known for this caller",
	}
	if diff := cmp.Diff(wantDenied, rep.Denied); diff != "" {
		t.Errorf("denied (-want +got):\n%s", diff)
	}
	if rep.Checked != 6 || rep.Skipped != 1 || rep.ByCaller["shop-orders-poller"] != 6 {
		t.Errorf("checked %d (%v), skipped %d; want 6 of shop-orders-poller, 1 skipped", rep.Checked, rep.ByCaller, rep.Skipped)
	}
	var unused []string
	for _, u := range rep.Unused {
		unused = append(unused, u.String())
	}
	wantUnused := []string{
		"shop-orders-poller: dynamodb:UpdateItem (JobordersNestedStackResource/PollerRoleDefaultPolicy LeaseAndCheckpoint)",
		"shop-orders-poller: logs:CreateLogStream (JobordersNestedStackResource/PollerRoleDefaultPolicy statement 0), used by Lambda itself",
		"shop-orders-poller: logs:PutLogEvents (JobordersNestedStackResource/PollerRoleDefaultPolicy statement 0), used by Lambda itself",
		"shop-orders-poller: secretsmanager:GetSecretValue (JobordersNestedStackResource/PollerRoleDefaultPolicy Secret)",
	}
	if diff := cmp.Diff(wantUnused, unused); diff != "" {
		t.Errorf("unused grants (-want +got):\n%s", diff)
	}
}

// TestOperatorPolicy: the operator policy is the first json block of its
// section, placeholders replaced where they stand as words; a page without
// the section, or a placeholder without a value, is an error.
func TestOperatorPolicy(t *testing.T) {
	t.Parallel()
	page := []byte("# Deploying\n\n" + iamcheck.OperatorHeading + "\n\nText about P.\n\n```json\n" +
		`{"Statement": [{"Sid": "Pipeline", "Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "arn:aws:sqs:REGION:ACCOUNT:P-*"},` +
		`{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::BUCKET/claim-check/P/*"}]}` + "\n```\n\n## Next\n\n```json\n{}\n```\n")
	vars := map[string]string{iamcheck.VarPrefix: "shop", iamcheck.VarRegion: region, iamcheck.VarAccount: account, iamcheck.VarBucket: "shop-data"}
	pol, err := iamcheck.OperatorPolicy(page, vars)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, st := range pol.Statements {
		got = append(got, st.Sid+" "+strings.Join(st.Resource, ","))
	}
	if want := []string{"Pipeline arn:aws:sqs:us-east-1:111122223333:shop-*", " arn:aws:s3:::shop-data/claim-check/shop/*"}; !cmp.Equal(want, got) {
		t.Errorf("statements %q, want %q", got, want)
	}
	if _, err := iamcheck.OperatorPolicy([]byte("# Deploying\n"), vars); err == nil || !strings.Contains(err.Error(), "no section") {
		t.Errorf("page without the section: %v", err)
	}
	if _, err := iamcheck.OperatorPolicy(page, map[string]string{iamcheck.VarPrefix: "shop"}); err == nil || !strings.Contains(err.Error(), "no value for REGION") {
		t.Errorf("missing placeholder value: %v", err)
	}
}

// TestDeployDocOperatorPolicy: docs/deploy.md holds an operator policy
// the evaluator reads, naming only the stack's resources.
func TestDeployDocOperatorPolicy(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{iamcheck.VarPrefix: "shop", iamcheck.VarRegion: region, iamcheck.VarAccount: account, iamcheck.VarBucket: "shop-data"}
	pol, err := iamcheck.OperatorPolicy(page, vars)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range pol.Statements {
		for _, r := range st.Resource {
			if r == "*" || !strings.Contains(r, "shop") {
				t.Errorf("statement %s grants %v on %s, not a resource of the stack shop", st.Sid, st.Action, r)
			}
		}
	}
}
