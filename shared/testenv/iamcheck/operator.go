package iamcheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/iampolicy"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// The changesctl commands, by the policy their requests are checked
// against: the operator commands against the operator policy; the local
// ones (provisioning the resources a deploy creates, running the pipeline
// on this machine) are not checked. A command missing from both is
// reported when it makes a request.
var (
	OperatorCommands = []string{"status", "checkpoint", "dlq", "halt", "verify", "job", "bucket"}
	LocalCommands    = []string{"bootstrap", "run", "invoke"}
)

// OperatorHeading is the heading of docs/deploy.md's section that holds the
// operator policy, in its first json code block.
const OperatorHeading = "## The operator's IAM policy"

// Placeholders of the operator policy, replaced wherever they stand as a
// word.
const (
	VarPrefix  = "P"
	VarRegion  = "REGION"
	VarAccount = "ACCOUNT"
	VarBucket  = "BUCKET"
)

var placeholder = regexp.MustCompile(`\b(` + VarPrefix + `|` + VarRegion + `|` + VarAccount + `|` + VarBucket + `)\b`)

// OperatorPolicy reads the operator policy from the Markdown page: the
// first json code block of the section OperatorHeading, each placeholder
// replaced by its value in vars.
func OperatorPolicy(page []byte, vars map[string]string) (*iampolicy.Policy, error) {
	_, section, ok := bytes.Cut(page, []byte("\n"+OperatorHeading+"\n"))
	if !ok {
		return nil, fmt.Errorf("operator policy: no section %q", OperatorHeading)
	}
	if i := bytes.Index(section, []byte("\n## ")); i >= 0 {
		section = section[:i]
	}
	_, block, ok := bytes.Cut(section, []byte("```json\n"))
	if !ok {
		return nil, fmt.Errorf("operator policy: no json code block in section %q", OperatorHeading)
	}
	block, _, ok = bytes.Cut(block, []byte("\n```"))
	if !ok {
		return nil, errors.New("operator policy: unclosed code block")
	}
	var missing []string
	doc := placeholder.ReplaceAllStringFunc(string(block), func(w string) string {
		v, ok := vars[w]
		if !ok {
			missing = append(missing, w)
		}
		return v
	})
	if len(missing) > 0 {
		return nil, fmt.Errorf("operator policy: no value for %s", strings.Join(missing, ", "))
	}
	return iampolicy.Parse("docs/deploy.md operator policy", []byte(doc))
}

// Operator is the principal of an operator (an IAM user) whose only policy
// is docs/deploy.md's, read from the repository at root.
func Operator(root string, vars map[string]string) (*Principal, error) {
	page, err := os.ReadFile(filepath.Join(root, "docs", "deploy.md"))
	if err != nil {
		return nil, fmt.Errorf("operator policy: %w", err)
	}
	pol, err := OperatorPolicy(page, vars)
	if err != nil {
		return nil, err
	}
	return &Principal{ARN: "arn:aws:iam::" + vars[VarAccount] + ":user/operator", Policies: []*iampolicy.Policy{pol}}, nil
}

// AddChangesctl makes the operator commands of changesctl callers with the
// principal op, and the local commands callers that are not checked.
func (p *Policies) AddChangesctl(op *Principal) {
	for _, c := range OperatorCommands {
		p.Callers["changesctl "+c] = op
	}
	for _, c := range LocalCommands {
		p.Callers["changesctl "+c] = nil
	}
}

// Account returns the account of the credentials of cfg.
func Account(ctx context.Context, cfg aws.Config) (string, error) {
	out, err := sts.NewFromConfig(cfg).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if err != nil {
		return "", fmt.Errorf("look up the account: %w", err)
	}
	return aws.ToString(out.Account), nil
}

// Deployed is a stack deployed by localstack/deploy.sh with its functions'
// requests, and those of changesctl, recorded in Calls.
type Deployed struct {
	AWS      aws.Config
	Calls    string // the file of the recorded calls
	Assembly string // the deploy's cloud assembly directory
	Stack    string // the stack's name, stack.prefix
	Bucket   string // the stack's bucket
	Root     string // the repository root, for docs/deploy.md
	// From skips the first calls of the file, checked before (against the
	// stack as it was then).
	From int
}

// Check evaluates the recorded calls against the stack's roles and, for
// changesctl's operator commands, the operator policy of docs/deploy.md.
// Each request that would be denied fails the test; the granted actions no
// request used are logged. It returns the report for further checks.
func (d Deployed) Check(t testing.TB) Report {
	t.Helper()
	ctx := t.Context()
	calls, err := awsconf.ReadCalls(d.Calls)
	if err != nil {
		t.Fatal(err)
	}
	if d.From > len(calls) {
		t.Fatalf("%s holds %d calls, fewer than the %d checked before", d.Calls, len(calls), d.From)
	}
	account, err := Account(ctx, d.AWS)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := FromStack(ctx, cloudformation.NewFromConfig(d.AWS), d.Assembly, d.Stack, d.AWS.Region, account)
	if err != nil {
		t.Fatal(err)
	}
	op, err := Operator(d.Root, map[string]string{VarPrefix: d.Stack, VarRegion: d.AWS.Region, VarAccount: account, VarBucket: d.Bucket})
	if err != nil {
		t.Fatal(err)
	}
	pol.AddChangesctl(op)
	rep := Check(calls[d.From:], pol)
	rep.Calls = len(calls)
	rep.Log(t)
	return rep
}

// Log fails the test with each denied request (once per kind, with how
// often) and logs the summary.
func (rep Report) Log(t testing.TB) {
	t.Helper()
	for _, d := range grouped(rep.Denied) {
		t.Errorf("denied%s", d)
	}
	var b strings.Builder
	rep.summary(&b, false)
	t.Log(b.String())
}

// grouped returns the sorted lines once each, prefixed with how often they
// occur when more than once: ": line" or " (N times): line".
func grouped(lines []string) []string {
	var out []string
	for i := 0; i < len(lines); {
		n := 1
		for i+n < len(lines) && lines[i+n] == lines[i] {
			n++
		}
		if n > 1 {
			out = append(out, fmt.Sprintf(" (%d times): %s", n, lines[i]))
		} else {
			out = append(out, ": "+lines[i])
		}
		i += n
	}
	return out
}

// Summary says what was checked, what would be denied and which granted
// actions no request used.
func (rep Report) Summary() string {
	var b strings.Builder
	rep.summary(&b, true)
	return b.String()
}

func (rep Report) summary(b *strings.Builder, denied bool) {
	fmt.Fprintf(b, "IAM: %d requests checked %v, %d calls of unchecked callers, %d denied\n", rep.Checked, rep.ByCaller, rep.Skipped, len(rep.Denied))
	if denied {
		for _, d := range grouped(rep.Denied) {
			b.WriteString("  denied" + d + "\n")
		}
	}
	if len(rep.Unused) > 0 {
		b.WriteString("IAM: granted actions no request used:\n")
		for _, u := range rep.Unused {
			b.WriteString("  " + u.String() + "\n")
		}
	}
}

// TestStackPrefix and TestStackBucket stand for the stack prefix and bucket
// of the tests' stacks (testenv/stack), named by testenv.UniqueName.
const (
	TestStackPrefix = "*-????????"
	// TestStackBucket: the tests use buckets of their own too.
	TestStackBucket = "*"
)

// CheckTestStacks checks the requests of changesctl recorded in path, made
// on the tests' own stacks, against the operator policy of the repository
// at root.
func CheckTestStacks(ctx context.Context, path, root string) (Report, error) {
	calls, err := awsconf.ReadCalls(path)
	if err != nil {
		return Report{}, err
	}
	testenv.SetAWSEnv()
	cfg, err := awsconf.Load(ctx, nil)
	if err != nil {
		return Report{}, err
	}
	account, err := Account(ctx, cfg)
	if err != nil {
		return Report{}, err
	}
	op, err := Operator(root, map[string]string{VarPrefix: TestStackPrefix, VarRegion: cfg.Region, VarAccount: account, VarBucket: TestStackBucket})
	if err != nil {
		return Report{}, err
	}
	p := &Policies{Callers: map[string]*Principal{}}
	p.AddChangesctl(op)
	return Check(calls, p), nil
}
