package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	cfntypes "github.com/aws/aws-sdk-go-v2/service/cloudformation/types"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deployed"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/testbucket"
)

// The walkthrough TestDeployWalkthrough runs: the section of the page that
// starts with walkthroughHeading, up to the next section, and the sample
// configuration its configuration step copies.
const (
	walkthroughPage    = "docs/deploy.md"
	walkthroughHeading = "## Step by step"
	walkthroughExample = "docs/examples/syncgateway-postgres-vpc.json"
)

// A fenced sh block of the walkthrough may carry one of these words after its
// language (```sh test:retry): the test understands no other.
const (
	// markSkip: a block not meant to run as it stands.
	markSkip = "test:skip"
	// markRetry: a block the reader runs again until it exits 0, such as a
	// verify while changes are still on their way.
	markRetry = "test:retry"
)

// The Sync Gateway user the walkthrough's job reads as, and the password its
// secret holds as the page writes it: the test's Sync Gateway gives the user
// that password, so the secret's value is the page's own.
const (
	walkthroughUser     = "changes-worker"
	walkthroughPassword = "the Sync Gateway user's password"
	walkthroughChannel  = "orders"
)

// How long a block may run (a deploy takes minutes), and how long a
// test:retry block is run again before the test gives up.
const (
	walkthroughBlockTimeout = 20 * time.Minute
	walkthroughRetryFor     = 8 * time.Minute
	walkthroughRetryEvery   = 15 * time.Second
)

// TestDeployWalkthrough runs the step-by-step walkthrough of docs/deploy.md
// as the page writes it, against the local AWS: every fenced sh block of the
// section, in order, each in bash -euo pipefail, in a terminal whose
// questions (the CDK's "(y/n)") are answered y as the reader does; the first
// starts at the repository root, and the exported variables and working
// directory one leaves carry over to the next, as in the reader's shell. Only what is the reader's own is substituted: the account and
// region, the endpoints (the environment of localstack/env.sh, with the S3
// of LocalStack, where CloudFormation reads templates; the Makefile's CDK is
// cdklocal, the CLI that sends the CDK's calls there, and the functions are
// built for this machine, which runs them), and names: the stack prefix, the
// secret names, the configuration file, the Sync Gateway URL, the PostgreSQL
// DSN and table, the VPC, subnets and security group (LocalStack's EC2
// checks that they exist; it does not enforce them). The configuration the
// page's configuration step copies is edited as its reader edits it, with
// those names. The walkthrough must end with the Sync Gateway's documents of
// the job's channel, and no other, in PostgreSQL, and its teardown must have
// deleted the stack. Everything the stack retains is removed at the end.
func TestDeployWalkthrough(t *testing.T) {
	deployedParallel(t)
	ctx := t.Context()
	root := repoRoot(t)
	page, err := os.ReadFile(filepath.Join(root, walkthroughPage))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := walkthroughBlocks(string(page))
	if err != nil {
		t.Fatalf("%s: %v", walkthroughPage, err)
	}
	w := newWalkthrough(t, root)
	for _, b := range blocks {
		if b.lang == "json" && strings.Contains(b.text, `"jobs"`) {
			w.checkShownConfig(t, b)
		}
	}
	ran := 0
	for _, b := range blocks {
		if b.lang != "sh" {
			continue
		}
		if b.has(markSkip) {
			t.Logf("%s: not run (%s):\n%s", b.step, markSkip, b.text)
			continue
		}
		w.runBlock(ctx, t, b)
		w.afterBlock(ctx, t)
		ran++
	}
	if ran == 0 {
		t.Fatalf("%s: no sh block to run under %q", walkthroughPage, walkthroughHeading)
	}
	for _, s := range w.commandSubs {
		if s.required && s.used == 0 {
			t.Errorf("no command of the walkthrough holds %q (%s), which the test substitutes: is the page still the walkthrough the test knows?", s.old, s.what)
		}
	}
	if !w.edited {
		t.Fatalf("no command of the walkthrough wrote the configuration %s", w.configPath)
	}
	w.checkDelivered(ctx, t)
	if _, err := deployed.Bucket(ctx, w.cfn, w.prefix); !errors.Is(err, deployed.ErrNoStack) {
		t.Errorf("after the walkthrough's teardown, the stack %s: %v, want it deleted", w.prefix, err)
	}
}

// pageBlock is one fenced block of the walkthrough.
type pageBlock struct {
	step  string   // the ### heading it is under
	lang  string   // the word after the opening fence
	marks []string // the words after that
	text  string
}

func (b pageBlock) has(mark string) bool {
	for _, m := range b.marks {
		if m == mark {
			return true
		}
	}
	return false
}

// walkthroughBlocks returns the fenced blocks of page's walkthrough section,
// in order. A mark on an sh block other than markSkip or markRetry is an
// error, as is a section without an end to a block.
func walkthroughBlocks(page string) ([]pageBlock, error) {
	start := strings.Index(page, "\n"+walkthroughHeading)
	if start < 0 {
		return nil, fmt.Errorf("no section %q", walkthroughHeading)
	}
	section := page[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	var (
		blocks []pageBlock
		step   string
		cur    *pageBlock
		body   []string
	)
	for _, line := range strings.Split(section, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case cur != nil && trimmed == "```":
			cur.text = strings.Join(body, "\n") + "\n"
			blocks = append(blocks, *cur)
			cur, body = nil, nil
		case cur != nil:
			body = append(body, line)
		case strings.HasPrefix(line, "### "):
			step = strings.TrimPrefix(line, "### ")
		case strings.HasPrefix(trimmed, "```"):
			b := pageBlock{step: step}
			if f := strings.Fields(strings.TrimPrefix(trimmed, "```")); len(f) > 0 {
				b.lang, b.marks = f[0], f[1:]
			}
			for _, m := range b.marks {
				if b.lang == "sh" && m != markSkip && m != markRetry {
					return nil, fmt.Errorf("step %q: a block marked %q; the test knows %s and %s", step, m, markSkip, markRetry)
				}
			}
			cur = &b
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("step %q: a block without its closing fence", cur.step)
	}
	return blocks, nil
}

// substitution replaces the page's value old with the test's new.
type substitution struct {
	old, new string
	what     string // what the value is, for a message
	word     bool   // old only as a word of its own (REGION, not AWS_REGION)
	required bool   // the walkthrough must hold it
	used     int    // blocks (or files) it was found in
}

// substitute applies subs to s, in order, counting what each replaced.
func substitute(s string, subs []*substitution) string {
	for _, sub := range subs {
		pattern := regexp.QuoteMeta(sub.old)
		if sub.word {
			pattern = `\b` + pattern + `\b`
		}
		re := regexp.MustCompile(pattern)
		if re.MatchString(s) {
			sub.used++
			s = re.ReplaceAllLiteralString(s, sub.new)
		}
	}
	return s
}

// walkthrough is the reader's side of one run: their Sync Gateway and
// PostgreSQL, their VPC, their tools and environment.
type walkthrough struct {
	root       string
	prefix     string // stack.prefix
	table      string // postgres.table
	configPath string // where the walkthrough writes its configuration
	bin        string // changesctl and aws
	dir        string // the test's files
	env        []string
	// shell and cwd are the reader's shell as the last block left it: its
	// exported variables and its working directory.
	shell      []string
	cwd        string
	db         *testenv.SGDatabase
	dsn        string
	awsCfg     aws.Config
	cfn        *cloudformation.Client
	localstack string // LocalStack's endpoint, S3 included

	commandSubs []*substitution // applied to every command
	configSubs  []*substitution // applied to the configuration the walkthrough writes
	edited      bool            // the configuration was edited with configSubs
	mirrored    bool            // the stack's bucket exists in the S3 the functions use
}

func newWalkthrough(t *testing.T, root string) *walkthrough {
	t.Helper()
	ctx := t.Context()
	awsCfg := testenv.AWS(t) // the environment of localstack/env.sh
	w := &walkthrough{
		root:       root,
		prefix:     testenv.UniqueName("walkthrough"),
		awsCfg:     awsCfg,
		cfn:        cloudformation.NewFromConfig(awsCfg),
		localstack: os.Getenv("AWS_ENDPOINT_URL"),
		dsn:        testenv.PostgresDSN(t),
	}
	w.table = strings.ReplaceAll(w.prefix, "-", "_")
	dir := t.TempDir()
	w.configPath = filepath.Join(dir, "shop.json")

	// The reader's tools: the pinned CDK CLI, installed already (make test
	// installs it first): the walkthrough's make targets would otherwise run
	// npm ci, which empties an infra/node_modules shared through a symbolic
	// link; changesctl as make ctl builds it; the AWS CLI (LocalStack's own).
	deps := exec.CommandContext(ctx, "make", "-q", "infra/node_modules/.package-lock.json")
	deps.Dir = root
	if out, err := deps.CombinedOutput(); err != nil {
		t.Fatalf("the pinned CDK CLI is missing or older than infra/package-lock.json (make -q: %v%s): run make cdk-deps first", err, out)
	}
	ctl := currentChangesctl(t)
	w.bin = filepath.Dir(ctl)
	awsCLI := filepath.Join(root, ".local", "localstack", "venv", "bin", "python")
	if _, err := os.Stat(awsCLI); err != nil {
		t.Fatalf("the AWS CLI of LocalStack's virtualenv: %v (run make up)", err)
	}
	if err := os.WriteFile(filepath.Join(w.bin, "aws"), []byte("#!/bin/sh\nexec "+awsCLI+" -m awscli \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	w.dir = dir
	w.env = w.environ(dir)
	w.shell, w.cwd = w.env, root

	// The reader's Sync Gateway: the job's channel and another one, with
	// an update and a delete.
	sg := testenv.StartSyncGateway(t, testenv.SyncGatewayOptions{})
	w.db = sg.CreateDB(t, "")
	w.db.PutUser(walkthroughUser, walkthroughPassword, walkthroughChannel)
	revs := map[string]string{}
	for i := range 12 {
		id := fmt.Sprintf("order-%02d", i)
		revs[id] = w.db.Put(id, "", map[string]any{"channels": []string{walkthroughChannel}, "total": i})
	}
	w.db.Put("order-03", revs["order-03"], map[string]any{"channels": []string{walkthroughChannel}, "total": 300})
	w.db.Delete("order-05", revs["order-05"])
	for i := range 3 {
		w.db.Put(fmt.Sprintf("payment-%02d", i), "", map[string]any{"channels": []string{"payments"}, "amount": i})
	}
	w.db.WaitCached()

	// The cleanups run in the reverse order: the stack first, then what it
	// retains, the secrets, the tables and the VPC the stack used.
	vpc := w.createVPC(ctx, t)
	t.Cleanup(func() {
		pool := testenv.Postgres(t)
		for _, table := range []string{w.table, w.table + "_versions"} {
			if _, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{"public", table}.Sanitize()); err != nil {
				t.Errorf("drop table %s: %v", table, err)
			}
		}
	})
	secrets := []string{w.prefix + "/sgw-worker", w.prefix + "/orders-dsn"}
	t.Cleanup(func() {
		sm := secretsmanager.NewFromConfig(awsCfg)
		for _, s := range secrets {
			_, _ = sm.DeleteSecret(context.Background(), &secretsmanager.DeleteSecretInput{SecretId: aws.String(s), ForceDeleteWithoutRecovery: aws.Bool(true)})
		}
	})
	t.Cleanup(func() { w.removeRetained(t) })
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := w.cfn.DescribeStacks(ctx, &cloudformation.DescribeStacksInput{StackName: &w.prefix})
		if err != nil || len(out.Stacks) == 0 || out.Stacks[0].StackStatus == cfntypes.StackStatusDeleteComplete {
			return // deleted by the walkthrough, or never created
		}
		deleteCFNStack(ctx, t, w.cfn, w.prefix)
	})

	region := os.Getenv("AWS_REGION")
	w.commandSubs = []*substitution{
		{old: "postgres://changes:PASSWORD@orders.cluster-xyz.eu-west-1.rds.amazonaws.com:5432/orders?sslmode=verify-full", new: w.dsn, what: "the PostgreSQL DSN", required: true},
		{old: "shop.json", new: w.configPath, what: "the configuration file", required: true},
		{old: "shop/", new: w.prefix + "/", what: "the secrets' names", required: true},
		{old: "ACCOUNT-ID", new: "000000000000", what: "the account", word: true},
		{old: "REGION", new: region, what: "the region", word: true},
	}
	w.configSubs = []*substitution{
		{old: "https://sgw.example.com:4984/shop", new: w.db.URL(), what: "source.url"},
		{old: `"shop/`, new: `"` + w.prefix + "/", what: "the secrets' names"},
		{old: `"prefix": "shop"`, new: `"prefix": "` + w.prefix + `"`, what: "stack.prefix"},
		{old: `"table": "orders"`, new: `"table": "` + w.table + `"`, what: "postgres.table"},
		{old: `"vpc-0123456789abcdef0"`, new: `"` + vpc.id + `"`, what: "stack.vpc.id"},
		{old: `"subnet-0123456789abcdef0"`, new: `"` + vpc.subnets[0] + `"`, what: "stack.vpc.subnet_ids[0]"},
		{old: `"subnet-0fedcba9876543210"`, new: `"` + vpc.subnets[1] + `"`, what: "stack.vpc.subnet_ids[1]"},
		{old: `"sg-0123456789abcdef0"`, new: `"` + vpc.securityGroup + `"`, what: "stack.vpc.security_group_ids[0]"},
	}
	return w
}

// environ is the reader's environment: their own with the local AWS's
// endpoints, region and credentials, LocalStack's S3 (where CloudFormation
// reads the templates the CDK uploads), the Makefile's deploy targets with
// cdklocal and functions built for this machine, and changesctl and aws on
// the PATH. Nothing of a make that runs the test leaks into the reader's.
func (w *walkthrough) environ(dir string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "PATH" || strings.HasPrefix(k, "AWS_") || strings.HasPrefix(k, "CDK") || strings.HasPrefix(k, "CHANGES_") ||
			strings.HasPrefix(k, "MAKE") || k == "MFLAGS" {
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"PATH="+w.bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"AWS_ENDPOINT_URL="+w.localstack,
		"AWS_ENDPOINT_URL_S3="+w.localstack,
		"AWS_ENDPOINT_URL_DYNAMODB="+os.Getenv("AWS_ENDPOINT_URL_DYNAMODB"),
		"AWS_REGION="+os.Getenv("AWS_REGION"),
		"AWS_DEFAULT_REGION="+os.Getenv("AWS_REGION"),
		"AWS_ACCESS_KEY_ID="+os.Getenv("AWS_ACCESS_KEY_ID"),
		"AWS_SECRET_ACCESS_KEY="+os.Getenv("AWS_SECRET_ACCESS_KEY"),
		"AWS_PAGER=",
		"CDK=infra/node_modules/.bin/cdklocal",
		"CDK_HOME="+filepath.Join(dir, "cdk-home"),
		"CDK_OUT="+filepath.Join(dir, "cdk.out"),
		"BUILD_DIR="+filepath.Join(dir, "build"),
		"FUNCTION_ARCH="+runtime.GOARCH,
		"NO_COLOR=1",
	)
}

// testVPC is a VPC of the test's own in LocalStack's EC2.
type testVPC struct {
	id, securityGroup string
	subnets           []string
}

// createVPC creates a VPC with two subnets and a security group, deleted
// when the test ends (after the stack, which registers its cleanup later).
func (w *walkthrough) createVPC(ctx context.Context, t *testing.T) testVPC {
	t.Helper()
	var v testVPC
	t.Cleanup(func() {
		ctx := context.Background()
		if v.securityGroup != "" {
			w.mustAWS(ctx, t, "ec2", "delete-security-group", "--group-id", v.securityGroup)
		}
		for _, s := range v.subnets {
			w.mustAWS(ctx, t, "ec2", "delete-subnet", "--subnet-id", s)
		}
		if v.id != "" {
			w.mustAWS(ctx, t, "ec2", "delete-vpc", "--vpc-id", v.id)
		}
	})
	v.id = w.mustAWS(ctx, t, "ec2", "create-vpc", "--cidr-block", "10.70.0.0/16", "--query", "Vpc.VpcId")
	for i := range 2 {
		v.subnets = append(v.subnets, w.mustAWS(ctx, t, "ec2", "create-subnet", "--vpc-id", v.id,
			"--cidr-block", fmt.Sprintf("10.70.%d.0/24", i+1), "--query", "Subnet.SubnetId"))
	}
	v.securityGroup = w.mustAWS(ctx, t, "ec2", "create-security-group", "--vpc-id", v.id,
		"--group-name", w.prefix, "--description", "changes-worker walkthrough", "--query", "GroupId")
	return v
}

// mustAWS runs the AWS CLI with the reader's environment and returns what it
// printed as text, failing the test (without stopping it) on an error.
func (w *walkthrough) mustAWS(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join(w.bin, "aws"), append(args, "--output", "text")...)
	cmd.Env = w.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("aws %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// checkShownConfig: the configuration the page shows is the sample its
// configuration step copies.
func (w *walkthrough) checkShownConfig(t *testing.T, b pageBlock) {
	t.Helper()
	example, err := os.ReadFile(filepath.Join(w.root, walkthroughExample))
	if err != nil {
		t.Fatal(err)
	}
	var shown, copied any
	if err := json.Unmarshal(config.StripComments([]byte(b.text)), &shown); err != nil {
		t.Fatalf("%s: the configuration shown: %v", b.step, err)
	}
	if err := json.Unmarshal(config.StripComments(example), &copied); err != nil {
		t.Fatalf("%s: %v", walkthroughExample, err)
	}
	if diff := cmp.Diff(copied, shown); diff != "" {
		t.Errorf("%s: the configuration shown differs from %s (-file +page):\n%s", b.step, walkthroughExample, diff)
	}
}

// runBlock runs one block, again and again for a test:retry block, and
// stops the test when it fails.
func (w *walkthrough) runBlock(ctx context.Context, t *testing.T, b pageBlock) {
	t.Helper()
	script := substitute(b.text, w.commandSubs)
	deadline := time.Now().Add(walkthroughRetryFor)
	for try := 1; ; try++ {
		start := time.Now()
		out, err := w.run(ctx, script)
		took := time.Since(start).Round(time.Second)
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "(y/n)") {
				t.Logf("%s: answered y to: %s", b.step, strings.TrimSpace(l))
			}
		}
		if err == nil {
			t.Logf("%s: ran in %s (try %d):\n%s\n%s", b.step, took, try, indent(b.text, "$ "), tail(out, 30))
			return
		}
		if !b.has(markRetry) || time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: failed after %s (try %d): %v\n%s\n%s", b.step, took, try, err, indent(b.text, "$ "), tail(out, 60))
		}
		t.Logf("%s: try %d: %v; again in %s:\n%s", b.step, try, err, walkthroughRetryEvery, tail(out, 15))
		select {
		case <-ctx.Done():
		case <-time.After(walkthroughRetryEvery):
		}
	}
}

// run runs script in bash -euo pipefail, in a terminal of its own whose
// every "(y/n)" question is answered y, and returns what the terminal
// showed. It starts with the exported variables and working directory the
// last block left (the repository root at first), as the reader's shell
// would, and keeps those this one leaves when it succeeds.
func (w *walkthrough) run(ctx context.Context, script string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, walkthroughBlockTimeout)
	defer cancel()
	state, err := os.CreateTemp(w.dir, "shell-")
	if err != nil {
		return "", err
	}
	defer os.Remove(state.Name())
	defer state.Close()
	master, slave, err := openPTY()
	if err != nil {
		return "", err
	}
	defer master.Close()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script+"env -0 >&3\n")
	cmd.Dir, cmd.Env = w.cwd, w.shell
	cmd.ExtraFiles = []*os.File{state} // fd 3
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	// A group of its own, killed whole when the block runs out of time.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	term := &terminal{master: master, done: make(chan struct{})}
	go term.read()
	err = cmd.Start()
	slave.Close()
	if err == nil {
		err = cmd.Wait()
	}
	// The terminal ends when the last process holding it exits; one left
	// behind does not hold the test.
	select {
	case <-term.done:
	case <-time.After(5 * time.Second):
	}
	master.Close()
	<-term.done
	if err != nil {
		return term.text(), err
	}
	raw, err := os.ReadFile(state.Name())
	if err != nil {
		return term.text(), fmt.Errorf("read the shell's environment: %w", err)
	}
	w.shell = nil
	for _, kv := range strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00") {
		w.shell = append(w.shell, kv)
		if dir, ok := strings.CutPrefix(kv, "PWD="); ok {
			w.cwd = dir
		}
	}
	return term.text(), nil
}

// terminal reads a pseudo-terminal's master and answers y to each "(y/n)".
type terminal struct {
	master *os.File
	done   chan struct{}

	mu       sync.Mutex
	out      []byte
	answered int
}

func (tm *terminal) read() {
	defer close(tm.done)
	buf := make([]byte, 32<<10)
	for {
		n, err := tm.master.Read(buf)
		if n > 0 {
			tm.mu.Lock()
			tm.out = append(tm.out, buf[:n]...)
			for asked := bytes.Count(tm.out, []byte("(y/n)")); tm.answered < asked; tm.answered++ {
				_, _ = tm.master.Write([]byte("y\n"))
			}
			tm.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// ansi matches the terminal control sequences the tools print.
var ansi = regexp.MustCompile("\x1b\\[[0-?]*[ -/]*[@-~]|\x1b\\][^\x07\x1b]*(\x07|\x1b\\\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]")

// text is what the terminal showed, as lines: control sequences removed,
// and of a line redrawn after a carriage return its last drawing.
func (tm *terminal) text() string {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	s := ansi.ReplaceAllString(string(tm.out), "")
	lines := strings.Split(strings.ReplaceAll(s, "\r\n", "\n"), "\n")
	for i, l := range lines {
		parts := strings.Split(l, "\r")
		for j := len(parts) - 1; j >= 0; j-- {
			if strings.TrimSpace(parts[j]) != "" {
				lines[i] = parts[j]
				break
			}
		}
	}
	return strings.Join(lines, "\n")
}

// afterBlock does what the reader does between the page's commands: edits
// the configuration the walkthrough copied, with the reader's names; and
// what LocalStack needs that AWS does not: the functions it runs use the S3
// of localstack/env.sh (moto), where the stack's bucket is created too.
func (w *walkthrough) afterBlock(ctx context.Context, t *testing.T) {
	t.Helper()
	if !w.edited {
		if raw, err := os.ReadFile(w.configPath); err == nil {
			edited := substitute(string(raw), w.configSubs)
			for _, s := range w.configSubs {
				if s.used == 0 {
					t.Fatalf("the configuration the walkthrough wrote holds no %q (%s), which its reader replaces", s.old, s.what)
				}
			}
			if err := os.WriteFile(w.configPath, []byte(edited), 0o644); err != nil {
				t.Fatal(err)
			}
			w.edited = true
			t.Logf("edited %s as the reader does: %s", filepath.Base(w.configPath), substitutedNames(w.configSubs))
		}
	}
	if w.mirrored {
		return
	}
	bucket, err := deployed.Bucket(ctx, w.cfn, w.prefix)
	if err != nil {
		return // not deployed yet
	}
	functionsS3 := s3.NewFromConfig(w.awsCfg, awsconf.S3Options)
	if _, err := functionsS3.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &bucket}); err != nil {
		t.Fatalf("create the stack's bucket %s in the S3 LocalStack's functions use: %v", bucket, err)
	}
	w.mirrored = true
	t.Logf("created the stack's bucket %s in the S3 of LocalStack's functions too", bucket)
	t.Cleanup(func() { emptyAndDeleteBucket(t, functionsS3, bucket) })
}

// substitutedNames lists what subs replaced, for the log.
func substitutedNames(subs []*substitution) string {
	var what []string
	for _, s := range subs {
		what = append(what, s.what)
	}
	return strings.Join(what, ", ")
}

// checkDelivered: PostgreSQL's table holds exactly the documents the job's
// user sees at the Sync Gateway (its channel's, live), at their revisions.
func (w *walkthrough) checkDelivered(ctx context.Context, t *testing.T) {
	t.Helper()
	want := w.db.Visible(walkthroughUser, walkthroughPassword)
	rows, err := testenv.Postgres(t).Query(ctx, "SELECT doc_id, rev FROM "+pgx.Identifier{"public", w.table}.Sanitize())
	if err != nil {
		t.Fatalf("read the walkthrough's table: %v", err)
	}
	got := map[string]string{}
	for rows.Next() {
		var id, rev string
		if err := rows.Scan(&id, &rev); err != nil {
			t.Fatal(err)
		}
		got[id] = rev
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 {
		t.Fatal("the Sync Gateway shows the job's user no document")
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PostgreSQL after the walkthrough (-Sync Gateway +PostgreSQL):\n%s", diff)
	}
}

// removeRetained removes what the stack keeps when it is deleted
// (stack.retain): its state table, its functions' log groups and its
// buckets, which the walkthrough leaves to its reader.
func (w *walkthrough) removeRetained(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	table := w.prefix + "-state"
	if _, err := dynamodb.NewFromConfig(w.awsCfg).DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: &table}); err != nil && !strings.Contains(err.Error(), "ResourceNotFound") {
		t.Errorf("delete table %s: %v", table, err)
	}
	logs := cloudwatchlogs.NewFromConfig(w.awsCfg)
	groups, err := logs.DescribeLogGroups(ctx, &cloudwatchlogs.DescribeLogGroupsInput{LogGroupNamePrefix: aws.String("/aws/lambda/" + w.prefix + "-")})
	if err != nil {
		t.Errorf("list log groups: %v", err)
	} else {
		for _, g := range groups.LogGroups {
			if _, err := logs.DeleteLogGroup(ctx, &cloudwatchlogs.DeleteLogGroupInput{LogGroupName: g.LogGroupName}); err != nil {
				t.Errorf("delete log group %s: %v", aws.ToString(g.LogGroupName), err)
			}
		}
	}
	// CloudFormation names the stack's buckets after the stack.
	cfnS3 := s3.NewFromConfig(w.awsCfg, func(o *s3.Options) { o.BaseEndpoint, o.UsePathStyle = aws.String(w.localstack), true })
	buckets, err := cfnS3.ListBuckets(ctx, &s3.ListBucketsInput{})
	if err != nil {
		t.Errorf("list LocalStack's buckets: %v", err)
		return
	}
	for _, b := range buckets.Buckets {
		if name := aws.ToString(b.Name); strings.HasPrefix(name, strings.ToLower(w.prefix)+"-") {
			emptyAndDeleteBucket(t, cfnS3, name)
		}
	}
}

// emptyAndDeleteBucket deletes a bucket and what it holds.
func emptyAndDeleteBucket(t *testing.T, client *s3.Client, bucket string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, k := range testbucket.Keys(ctx, t, client, bucket) {
		if _, err := client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: aws.String(k)}); err != nil {
			t.Errorf("delete s3://%s/%s: %v", bucket, k, err)
		}
	}
	if _, err := client.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: &bucket}); err != nil {
		t.Errorf("delete bucket %s: %v", bucket, err)
	}
}

// indent prefixes each line of s.
func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n")
}

// tail is the last n non-empty lines of s.
func tail(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestWalkthroughBlocks: the blocks of the walkthrough section only, in
// order, with the step they are under and their marks; an unknown mark on
// an sh block is refused.
func TestWalkthroughBlocks(t *testing.T) {
	parallel(t)
	const fence = "```"
	page := "# Page\n\n" + fence + "sh\nbefore\n" + fence + "\n\n" +
		walkthroughHeading + ": a walkthrough\n\n### 1. One\n\n" + fence + "sh\necho one \\\n  two\n" + fence + "\n\n" +
		"### 2. Two\n\n- a list\n\n  " + fence + "json\n  {\"jobs\": []}\n  " + fence + "\n\n" + fence + "sh test:retry\nretried\n" + fence + "\n\n" +
		fence + "\noutput\n" + fence + "\n\n## After\n\n" + fence + "sh\nafter\n" + fence + "\n"
	tests := []struct {
		name    string
		page    string
		want    []pageBlock
		wantErr string
	}{
		{name: "the section's blocks", page: page, want: []pageBlock{
			{step: "1. One", lang: "sh", marks: []string{}, text: "echo one \\\n  two\n"},
			{step: "2. Two", lang: "json", marks: []string{}, text: "  {\"jobs\": []}\n"},
			{step: "2. Two", lang: "sh", marks: []string{markRetry}, text: "retried\n"},
			{step: "2. Two", lang: "", text: "output\n"},
		}},
		{name: "unknown mark", page: strings.Replace(page, "sh test:retry", "sh test:later", 1), wantErr: `a block marked "test:later"`},
		{name: "no closing fence", page: strings.TrimSuffix(strings.Split(page, "\n## After")[0], fence+"\n"), wantErr: "without its closing fence"},
		{name: "no section", page: "# Page\n", wantErr: "no section"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := walkthroughBlocks(tt.page)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(pageBlock{})); diff != "" {
				t.Errorf("blocks (-want +got):\n%s", diff)
			}
		})
	}
}
