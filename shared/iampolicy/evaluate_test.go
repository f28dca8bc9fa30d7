package iampolicy_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/iampolicy"
)

const role = "arn:aws:iam::111122223333:role/cwd-orders-writer"

// evalCase is one request against some policies and the decision IAM's
// evaluation logic gives it.
type evalCase struct {
	name     string
	policies []*iampolicy.Policy
	req      iampolicy.Request
	want     iampolicy.Decision
}

func runEval(t *testing.T, tests []evalCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.req.Principal == "" {
				tt.req.Principal = role
			}
			if got := iampolicy.Evaluate(tt.req, tt.policies...); got.Decision != tt.want {
				t.Errorf("Evaluate(%s) = %s (allowed by %v, denied by %v), want %s", tt.req, got.Decision, got.Allowed, got.Denied, tt.want)
			}
		})
	}
}

func req(action, resource string, ctx map[string][]string) iampolicy.Request {
	return iampolicy.Request{Action: action, Resource: resource, Context: ctx}
}

// TestExplicitAndImplicitDeny: the example of IAM's "The difference
// between explicit and implicit denies": a policy allowing iam:Get* and
// iam:List* and denying iam:*Report*; another policy granting
// iam:GenerateCredentialReport does not get past the explicit deny.
func TestExplicitAndImplicitDeny(t *testing.T) {
	t.Parallel()
	getList := iampolicy.MustParse("get-list", `{"Version": "2012-10-17", "Statement": [
		{"Sid": "AllowGetList", "Effect": "Allow", "Action": ["iam:Get*", "iam:List*"], "Resource": "*"},
		{"Sid": "DenyReports", "Effect": "Deny", "Action": "iam:*Report*", "Resource": "*"}]}`)
	reports := iampolicy.MustParse("reports", `{"Statement": {"Effect": "Allow", "Action": "iam:GenerateCredentialReport", "Resource": "*"}}`)
	runEval(t, []evalCase{
		{name: "allowed by a wildcard action", policies: []*iampolicy.Policy{getList}, req: req("iam:GetUser", "arn:aws:iam::111122223333:user/carlos", nil), want: iampolicy.Allow},
		{name: "no statement: denied by default", policies: []*iampolicy.Policy{getList}, req: req("iam:CreatePolicy", "*", nil), want: iampolicy.ImplicitDeny},
		{name: "no policy at all: denied by default", req: req("sqs:SendMessage", "arn:aws:sqs:us-east-1:111122223333:q", nil), want: iampolicy.ImplicitDeny},
		{name: "allow and deny: the deny wins", policies: []*iampolicy.Policy{getList}, req: req("iam:GetOrganizationsAccessReport", "*", nil), want: iampolicy.ExplicitDeny},
		{name: "an allow in another policy does not override a deny", policies: []*iampolicy.Policy{reports, getList}, req: req("iam:GenerateCredentialReport", "*", nil), want: iampolicy.ExplicitDeny},
	})
}

// TestActionAndResourceWildcards: * and ? in actions (case-insensitive) and
// in ARNs (case-sensitive, within a segment; a trailing * of the pattern's
// last segment reaches past colons).
func TestActionAndResourceWildcards(t *testing.T) {
	t.Parallel()
	p := iampolicy.MustParse("p", `{"Statement": [
		{"Sid": "Queues", "Effect": "Allow", "Action": "sqs:*", "Resource": "arn:aws:sqs:*:111122223333:cwd-orders-*"},
		{"Sid": "Objects", "Effect": "Allow", "Action": ["s3:Get?bject", "S3:PUTOBJECT"], "Resource": "arn:aws:s3:::data/claim-check/cwd/orders/*"},
		{"Sid": "Secret", "Effect": "Allow", "Action": "secretsmanager:GetSecretValue", "Resource": "arn:aws:secretsmanager:us-east-1:111122223333:secret:cwd/PG_DSN-??????"},
		{"Sid": "Logs", "Effect": "Allow", "Action": "logs:PutLogEvents", "Resource": "arn:aws:logs:us-east-1:111122223333:*"},
		{"Sid": "Table", "Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": "arn:aws:dynamodb:us-east-1:*:table/cwd-state"}]}`)
	one := []*iampolicy.Policy{p}
	const secret = "arn:aws:secretsmanager:us-east-1:111122223333:secret:cwd/PG_DSN-"
	runEval(t, []evalCase{
		{name: "service wildcard", policies: one, req: req("sqs:SendMessage", "arn:aws:sqs:us-east-1:111122223333:cwd-orders-pg", nil), want: iampolicy.Allow},
		{name: "action names are case-insensitive", policies: one, req: req("SQS:sendmessage", "arn:aws:sqs:us-east-1:111122223333:cwd-orders-pg", nil), want: iampolicy.Allow},
		{name: "action element in capitals", policies: one, req: req("s3:PutObject", "arn:aws:s3:::data/claim-check/cwd/orders/1/2.json", nil), want: iampolicy.Allow},
		{name: "? is one character", policies: one, req: req("s3:GetObject", "arn:aws:s3:::data/claim-check/cwd/orders/1/2.json", nil), want: iampolicy.Allow},
		{name: "? is not zero characters", policies: one, req: req("s3:GetObjct", "arn:aws:s3:::data/claim-check/cwd/orders/1/2.json", nil), want: iampolicy.ImplicitDeny},
		{name: "region wildcard", policies: one, req: req("sqs:SendMessage", "arn:aws:sqs:eu-west-1:111122223333:cwd-orders-pg", nil), want: iampolicy.Allow},
		{name: "other account", policies: one, req: req("sqs:SendMessage", "arn:aws:sqs:us-east-1:444455556666:cwd-orders-pg", nil), want: iampolicy.ImplicitDeny},
		{name: "other job's queue", policies: one, req: req("sqs:SendMessage", "arn:aws:sqs:us-east-1:111122223333:cwd-refunds-pg", nil), want: iampolicy.ImplicitDeny},
		{name: "object of another prefix", policies: one, req: req("s3:GetObject", "arn:aws:s3:::data/claim-check/cwd/refunds/1.json", nil), want: iampolicy.ImplicitDeny},
		{name: "the bucket is not its objects", policies: one, req: req("s3:GetObject", "arn:aws:s3:::data", nil), want: iampolicy.ImplicitDeny},
		{name: "resources are case-sensitive", policies: one, req: req("s3:GetObject", "arn:aws:s3:::data/Claim-Check/cwd/orders/1.json", nil), want: iampolicy.ImplicitDeny},
		{name: "secret name with its six-character suffix", policies: one, req: req("secretsmanager:GetSecretValue", secret+"AbCdEf", nil), want: iampolicy.Allow},
		{name: "secret suffix too short", policies: one, req: req("secretsmanager:GetSecretValue", secret+"AbCdE", nil), want: iampolicy.ImplicitDeny},
		{name: "secret whose name only starts the same", policies: one, req: req("secretsmanager:GetSecretValue", "arn:aws:secretsmanager:us-east-1:111122223333:secret:cwd/PG_DSN2-AbCdEf", nil), want: iampolicy.ImplicitDeny},
		{name: "trailing * reaches past colons", policies: one, req: req("logs:PutLogEvents", "arn:aws:logs:us-east-1:111122223333:log-group:/aws/lambda/cwd-orders-poller:log-stream:x", nil), want: iampolicy.Allow},
		{name: "account wildcard within its segment", policies: one, req: req("dynamodb:GetItem", "arn:aws:dynamodb:us-east-1:111122223333:table/cwd-state", nil), want: iampolicy.Allow},
		{name: "a segment's * does not cross a colon", policies: one, req: req("dynamodb:GetItem", "arn:aws:dynamodb:us-east-1:1111:2222:table/cwd-state", nil), want: iampolicy.ImplicitDeny},
		{name: "action of another service", policies: one, req: req("sns:Publish", "arn:aws:sqs:us-east-1:111122223333:cwd-orders-pg", nil), want: iampolicy.ImplicitDeny},
	})
}

// TestNotActionNotResource: NotAction and NotResource apply to everything
// they do not list.
func TestNotActionNotResource(t *testing.T) {
	t.Parallel()
	p := iampolicy.MustParse("p", `{"Statement": [
		{"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"},
		{"Effect": "Deny", "Action": "s3:*", "NotResource": ["arn:aws:s3:::data", "arn:aws:s3:::data/*"]}]}`)
	one := []*iampolicy.Policy{p}
	runEval(t, []evalCase{
		{name: "not the excluded service", policies: one, req: req("sqs:SendMessage", "arn:aws:sqs:us-east-1:111122223333:q", nil), want: iampolicy.Allow},
		{name: "the excluded service", policies: one, req: req("iam:GetUser", "*", nil), want: iampolicy.ImplicitDeny},
		{name: "inside the excluded resources", policies: one, req: req("s3:GetObject", "arn:aws:s3:::data/k", nil), want: iampolicy.Allow},
		{name: "outside them", policies: one, req: req("s3:GetObject", "arn:aws:s3:::other/k", nil), want: iampolicy.ExplicitDeny},
	})
}

// TestLeadingKeys: the DynamoDB fine-grained access pattern, as the
// stack's roles use it: ForAllValues:StringLike on dynamodb:LeadingKeys.
// Every partition key of the request must match; a request without the key
// (a Scan) satisfies ForAllValues, which is why the roles grant no Scan,
// while ForAnyValue needs the key.
func TestLeadingKeys(t *testing.T) {
	t.Parallel()
	const table = "arn:aws:dynamodb:us-east-1:111122223333:table/cwd-state"
	all := iampolicy.MustParse("all", `{"Statement": [{"Sid": "LeaseAndCheckpoint", "Effect": "Allow",
		"Action": ["dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:Scan"], "Resource": "`+table+`",
		"Condition": {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["orders", "quarantine/orders/*"]}}}]}`)
	anyOf := iampolicy.MustParse("any", `{"Statement": [{"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": "`+table+`",
		"Condition": {"ForAnyValue:StringEquals": {"dynamodb:LeadingKeys": ["orders"]}}}]}`)
	keys := func(k ...string) map[string][]string { return map[string][]string{"dynamodb:LeadingKeys": k} }
	runEval(t, []evalCase{
		{name: "the job's item", policies: []*iampolicy.Policy{all}, req: req("dynamodb:GetItem", table, keys("orders")), want: iampolicy.Allow},
		{name: "a quarantine entry", policies: []*iampolicy.Policy{all}, req: req("dynamodb:UpdateItem", table, keys("quarantine/orders/page/12")), want: iampolicy.Allow},
		{name: "another job's item", policies: []*iampolicy.Policy{all}, req: req("dynamodb:GetItem", table, keys("refunds")), want: iampolicy.ImplicitDeny},
		{name: "a job id that only starts the same", policies: []*iampolicy.Policy{all}, req: req("dynamodb:GetItem", table, keys("orders2")), want: iampolicy.ImplicitDeny},
		{name: "one key of two outside", policies: []*iampolicy.Policy{all}, req: req("dynamodb:GetItem", table, keys("orders", "halt/refunds/pg/x")), want: iampolicy.ImplicitDeny},
		{name: "condition key names are case-insensitive", policies: []*iampolicy.Policy{all}, req: req("dynamodb:GetItem", table, map[string][]string{"DynamoDB:leadingkeys": {"refunds"}}), want: iampolicy.ImplicitDeny},
		{name: "no key: ForAllValues holds", policies: []*iampolicy.Policy{all}, req: req("dynamodb:Scan", table, nil), want: iampolicy.Allow},
		{name: "no key: ForAnyValue does not", policies: []*iampolicy.Policy{anyOf}, req: req("dynamodb:GetItem", table, nil), want: iampolicy.ImplicitDeny},
		{name: "ForAnyValue: one key is enough", policies: []*iampolicy.Policy{anyOf}, req: req("dynamodb:GetItem", table, keys("x", "orders")), want: iampolicy.Allow},
	})
}

// TestS3Prefix: s3:ListBucket limited to a prefix, with StringLike (the
// stack's output and attachment grants) and StringEquals (IAM's "allow
// listing only the home folder" example): a request without a prefix
// matches neither.
func TestS3Prefix(t *testing.T) {
	t.Parallel()
	const bucket = "arn:aws:s3:::data"
	like := iampolicy.MustParse("like", `{"Statement": [{"Sid": "ListS3Output1", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": "`+bucket+`",
		"Condition": {"StringLike": {"s3:prefix": ["archive/*"]}}}]}`)
	equals := iampolicy.MustParse("equals", `{"Statement": [{"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "`+bucket+`",
		"Condition": {"StringEquals": {"s3:prefix": ["", "home/"], "s3:delimiter": "/"}}}]}`)
	prefix := func(p string) map[string][]string { return map[string][]string{"s3:prefix": {p}} }
	runEval(t, []evalCase{
		{name: "like: under the prefix", policies: []*iampolicy.Policy{like}, req: req("s3:ListBucket", bucket, prefix("archive/orders-1")), want: iampolicy.Allow},
		{name: "like: the prefix itself", policies: []*iampolicy.Policy{like}, req: req("s3:ListBucket", bucket, prefix("archive/")), want: iampolicy.Allow},
		{name: "like: another prefix", policies: []*iampolicy.Policy{like}, req: req("s3:ListBucket", bucket, prefix("claim-check/")), want: iampolicy.ImplicitDeny},
		{name: "like: no prefix", policies: []*iampolicy.Policy{like}, req: req("s3:ListBucket", bucket, nil), want: iampolicy.ImplicitDeny},
		{name: "like: case-sensitive", policies: []*iampolicy.Policy{like}, req: req("s3:ListBucket", bucket, prefix("Archive/x")), want: iampolicy.ImplicitDeny},
		{name: "equals: both keys", policies: []*iampolicy.Policy{equals}, req: req("s3:ListBucket", bucket, map[string][]string{"s3:prefix": {"home/"}, "s3:delimiter": {"/"}}), want: iampolicy.Allow},
		{name: "equals: every key of the operator must hold", policies: []*iampolicy.Policy{equals}, req: req("s3:ListBucket", bucket, prefix("home/")), want: iampolicy.ImplicitDeny},
		{name: "equals: no wildcard", policies: []*iampolicy.Policy{equals}, req: req("s3:ListBucket", bucket, map[string][]string{"s3:prefix": {"home/x"}, "s3:delimiter": {"/"}}), want: iampolicy.ImplicitDeny},
	})
}

// TestSecureTransport: the stack's bucket and queue policies deny every
// request without TLS (Bool aws:SecureTransport false) and the bucket's
// requests with TLS older than 1.2 (NumericLessThan s3:TlsVersion 1.2),
// whatever the role allows; a resource-based policy's deny applies to the
// role through Principal {"AWS": "*"}.
func TestSecureTransport(t *testing.T) {
	t.Parallel()
	const bucket = "arn:aws:s3:::data"
	bucketPolicy := iampolicy.MustParse("bucket", `{"Version": "2012-10-17", "Statement": [
		{"Action": "s3:*", "Condition": {"Bool": {"aws:SecureTransport": "false"}}, "Effect": "Deny", "Principal": {"AWS": "*"}, "Resource": ["`+bucket+`", "`+bucket+`/*"]},
		{"Action": "s3:*", "Condition": {"NumericLessThan": {"s3:TlsVersion": 1.2}}, "Effect": "Deny", "Principal": {"AWS": "*"}, "Resource": ["`+bucket+`", "`+bucket+`/*"]}]}`)
	rolePolicy := iampolicy.MustParse("role", `{"Statement": [{"Effect": "Allow", "Action": "s3:PutObject", "Resource": "`+bucket+`/archive/*"}]}`)
	both := []*iampolicy.Policy{rolePolicy, bucketPolicy}
	ctx := func(secure, tls string) map[string][]string {
		m := map[string][]string{"aws:SecureTransport": {secure}}
		if tls != "" {
			m["s3:TlsVersion"] = []string{tls}
		}
		return m
	}
	runEval(t, []evalCase{
		{name: "TLS 1.2", policies: both, req: req("s3:PutObject", bucket+"/archive/a", ctx("true", "1.2")), want: iampolicy.Allow},
		{name: "TLS 1.3", policies: both, req: req("s3:PutObject", bucket+"/archive/a", ctx("true", "1.3")), want: iampolicy.Allow},
		{name: "plain HTTP", policies: both, req: req("s3:PutObject", bucket+"/archive/a", ctx("false", "")), want: iampolicy.ExplicitDeny},
		{name: "Bool compares case-insensitively", policies: both, req: req("s3:PutObject", bucket+"/archive/a", ctx("FALSE", "")), want: iampolicy.ExplicitDeny},
		{name: "TLS 1.0", policies: both, req: req("s3:PutObject", bucket+"/archive/a", ctx("true", "1.0")), want: iampolicy.ExplicitDeny},
		{name: "the resource policy alone allows nothing", policies: []*iampolicy.Policy{bucketPolicy}, req: req("s3:PutObject", bucket+"/archive/a", ctx("true", "1.2")), want: iampolicy.ImplicitDeny},
	})
}

// TestPrincipal: a resource-based statement applies to the principals it
// names: "*", an ARN, not a service principal; in one account, its allow
// is enough without an identity policy, and naming the account only
// delegates to the account's identity policies.
func TestPrincipal(t *testing.T) {
	t.Parallel()
	const queue = "arn:aws:sqs:us-east-1:111122223333:cwd-orders-pg"
	queuePolicy := iampolicy.MustParse("queue", `{"Statement": [
		{"Sid": "Writer", "Effect": "Allow", "Principal": {"AWS": "`+role+`"}, "Action": "sqs:SendMessage", "Resource": "`+queue+`"},
		{"Sid": "Events", "Effect": "Allow", "Principal": {"Service": "events.amazonaws.com"}, "Action": "sqs:ReceiveMessage", "Resource": "`+queue+`"},
		{"Sid": "Account", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::111122223333:root"}, "Action": "sqs:PurgeQueue", "Resource": "`+queue+`"},
		{"Sid": "NoDelete", "Effect": "Deny", "Principal": {"AWS": "111122223333"}, "Action": "sqs:DeleteQueue", "Resource": "`+queue+`"}]}`)
	admin := iampolicy.MustParse("admin", `{"Statement": [{"Effect": "Allow", "Action": "sqs:*", "Resource": "*"}]}`)
	runEval(t, []evalCase{
		{name: "named role", policies: []*iampolicy.Policy{queuePolicy}, req: req("sqs:SendMessage", queue, nil), want: iampolicy.Allow},
		{name: "another role", policies: []*iampolicy.Policy{queuePolicy}, req: iampolicy.Request{Principal: "arn:aws:iam::111122223333:role/other", Action: "sqs:SendMessage", Resource: queue}, want: iampolicy.ImplicitDeny},
		{name: "service principal", policies: []*iampolicy.Policy{queuePolicy}, req: req("sqs:ReceiveMessage", queue, nil), want: iampolicy.ImplicitDeny},
		{name: "account only delegates", policies: []*iampolicy.Policy{queuePolicy}, req: req("sqs:PurgeQueue", queue, nil), want: iampolicy.ImplicitDeny},
		{name: "account's deny applies to its roles", policies: []*iampolicy.Policy{admin, queuePolicy}, req: req("sqs:DeleteQueue", queue, nil), want: iampolicy.ExplicitDeny},
	})
}

// TestOtherOperators: negated operators and ...IfExists are true without
// the key, Null tests presence, ARN and numeric operators compare as
// documented.
func TestOtherOperators(t *testing.T) {
	t.Parallel()
	policy := func(cond string) []*iampolicy.Policy {
		return []*iampolicy.Policy{iampolicy.MustParse("p", `{"Statement": [{"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "*", "Condition": `+cond+`}]}`)}
	}
	r := func(ctx map[string][]string) iampolicy.Request {
		return req("sqs:SendMessage", "arn:aws:sqs:us-east-1:111122223333:q", ctx)
	}
	src := func(v string) map[string][]string { return map[string][]string{"aws:SourceArn": {v}} }
	runEval(t, []evalCase{
		{name: "StringNotEquals without the key", policies: policy(`{"StringNotEquals": {"aws:SourceVpce": "vpce-1"}}`), req: r(nil), want: iampolicy.Allow},
		{name: "StringNotEquals with an excluded value", policies: policy(`{"StringNotEquals": {"aws:SourceVpce": ["vpce-1", "vpce-2"]}}`), req: r(map[string][]string{"aws:SourceVpce": {"vpce-2"}}), want: iampolicy.ImplicitDeny},
		{name: "StringNotLike with another value", policies: policy(`{"StringNotLike": {"aws:SourceVpce": "vpce-*"}}`), req: r(map[string][]string{"aws:SourceVpce": {"x"}}), want: iampolicy.Allow},
		{name: "StringEqualsIfExists without the key", policies: policy(`{"StringEqualsIfExists": {"aws:SourceVpce": "vpce-1"}}`), req: r(nil), want: iampolicy.Allow},
		{name: "StringEqualsIfExists with another value", policies: policy(`{"StringEqualsIfExists": {"aws:SourceVpce": "vpce-1"}}`), req: r(map[string][]string{"aws:SourceVpce": {"vpce-2"}}), want: iampolicy.ImplicitDeny},
		{name: "StringEqualsIgnoreCase", policies: policy(`{"StringEqualsIgnoreCase": {"aws:SourceVpce": "VPCE-1"}}`), req: r(map[string][]string{"aws:SourceVpce": {"vpce-1"}}), want: iampolicy.Allow},
		{name: "StringEquals without the key", policies: policy(`{"StringEquals": {"aws:SourceVpce": "vpce-1"}}`), req: r(nil), want: iampolicy.ImplicitDeny},
		{name: "Null true: absent", policies: policy(`{"Null": {"aws:SourceVpce": "true"}}`), req: r(nil), want: iampolicy.Allow},
		{name: "Null true: present", policies: policy(`{"Null": {"aws:SourceVpce": "true"}}`), req: r(map[string][]string{"aws:SourceVpce": {"v"}}), want: iampolicy.ImplicitDeny},
		{name: "Null false: present", policies: policy(`{"Null": {"aws:SourceVpce": false}}`), req: r(map[string][]string{"aws:SourceVpce": {"v"}}), want: iampolicy.Allow},
		{name: "ArnLike", policies: policy(`{"ArnLike": {"aws:SourceArn": "arn:aws:s3:::data"}}`), req: r(src("arn:aws:s3:::data")), want: iampolicy.Allow},
		{name: "ArnLike with a wildcard", policies: policy(`{"ArnLike": {"aws:SourceArn": "arn:aws:lambda:*:111122223333:function:cwd-*"}}`), req: r(src("arn:aws:lambda:us-east-1:111122223333:function:cwd-orders-writer")), want: iampolicy.Allow},
		{name: "ArnNotLike", policies: policy(`{"ArnNotLike": {"aws:SourceArn": "arn:aws:s3:::data"}}`), req: r(src("arn:aws:s3:::data")), want: iampolicy.ImplicitDeny},
		{name: "NumericGreaterThanEquals", policies: policy(`{"NumericGreaterThanEquals": {"s3:TlsVersion": "1.2"}}`), req: r(map[string][]string{"s3:TlsVersion": {"1.3"}}), want: iampolicy.Allow},
		{name: "numeric value that is not a number", policies: policy(`{"NumericLessThan": {"s3:TlsVersion": "1.2"}}`), req: r(map[string][]string{"s3:TlsVersion": {"old"}}), want: iampolicy.ImplicitDeny},
		{name: "ForAllValues:StringNotLike", policies: policy(`{"ForAllValues:StringNotLike": {"dynamodb:LeadingKeys": "halt/*"}}`), req: r(map[string][]string{"dynamodb:LeadingKeys": {"orders", "halt/x"}}), want: iampolicy.ImplicitDeny},
		{name: "two operators: both must hold", policies: policy(`{"StringEquals": {"aws:SourceVpce": "v"}, "Bool": {"aws:SecureTransport": "true"}}`), req: r(map[string][]string{"aws:SourceVpce": {"v"}, "aws:SecureTransport": {"false"}}), want: iampolicy.ImplicitDeny},
	})
}

// TestParseRefuses: what the evaluator does not model is refused, by name.
func TestParseRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, doc, want string }{
		{"date operator", `{"Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*", "Condition": {"DateLessThan": {"aws:CurrentTime": "2030-01-01T00:00:00Z"}}}]}`, `condition operator "DateLessThan" is not supported`},
		{"unknown qualifier", `{"Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*", "Condition": {"ForSome:StringLike": {"s3:prefix": "a"}}}]}`, `unknown qualifier "ForSome"`},
		{"policy variable", `{"Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/${aws:username}/*"}]}`, `policy variables are not supported`},
		{"NotPrincipal", `{"Statement": [{"Effect": "Deny", "NotPrincipal": {"AWS": "x"}, "Action": "s3:GetObject", "Resource": "*"}]}`, `NotPrincipal: not supported`},
		{"effect", `{"Statement": [{"Sid": "S1", "Effect": "allow", "Action": "s3:GetObject", "Resource": "*"}]}`, `S1: element Effect "allow": want Allow or Deny`},
		{"no action", `{"Statement": [{"Effect": "Allow", "Resource": "*"}]}`, `want exactly one of Action and NotAction`},
		{"no statement", `{"Version": "2012-10-17"}`, `no Statement`},
		{"federated principal", `{"Statement": [{"Effect": "Allow", "Principal": {"Federated": "x"}, "Action": "s3:GetObject", "Resource": "*"}]}`, `Federated principals are not supported`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := iampolicy.Parse("doc", []byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "policy doc") {
				t.Errorf("Parse = %v, want an error naming the policy and containing %q", err, tt.want)
			}
		})
	}
}

// TestResultNamesStatements: the result names the statements that applied,
// by Sid or index.
func TestResultNamesStatements(t *testing.T) {
	t.Parallel()
	p := iampolicy.MustParse("role", `{"Statement": [
		{"Sid": "Send", "Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "*"},
		{"Effect": "Allow", "Action": "sqs:Send*", "Resource": "*"},
		{"Effect": "Allow", "Action": "sqs:ReceiveMessage", "Resource": "*"}]}`)
	got := iampolicy.Evaluate(req("sqs:SendMessage", "arn:aws:sqs:us-east-1:111122223333:q", nil), p)
	want := iampolicy.Result{Decision: iampolicy.Allow, Allowed: []iampolicy.Match{{Policy: "role", Statement: 0, Sid: "Send"}, {Policy: "role", Statement: 1}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Evaluate (-want +got):\n%s", diff)
	}
}
