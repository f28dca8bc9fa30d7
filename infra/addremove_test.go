package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	cfntypes "github.com/aws/aws-sdk-go-v2/service/cloudformation/types"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	lambdatypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deployed"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/iamcheck"
)

// TestDeployAddRemoveJob deploys the full stack of three jobs to the local
// AWS with localstack/deploy.sh (`make localstack-deploy`), the schedule
// rules left disabled, and runs each job end to end through its deployed
// functions: documents in its own source, its poller invoked through the
// Lambda API, its writer fed by the event source mapping, until its queues
// are drained and its PostgreSQL table holds the documents. It then deploys
// the configuration with one job removed and another added.
//
// Only those two jobs' stacks change. The shared stack's events during the
// second deploy name their two nested stacks alone, created and deleted,
// and the deployed templates give CloudFormation nothing to update in the
// others (their nested stack resources in the shared stack's template and
// their own templates are the same, byte for byte). For each of the other
// two jobs, its nested stack (status, last update, template, resources),
// functions (code, revision, last modification), event source mappings,
// schedule rule, queues (URLs and every attribute) and lease and checkpoint
// item are exactly as they were. Documents written to their sources before
// the second deploy stay unread, so a poller started by the deploy would
// move a checkpoint. The removed job's functions, mappings, rule and queues
// are gone; the added job runs end to end. Last, one kept job's poller runs
// again and delivers the documents written meanwhile: the comparison must
// now see its checkpoint move.
//
// On the local AWS the shared stack's events are what shows a nested stack
// updated: LocalStack does not implement the update of an
// AWS::CloudFormation::Stack resource. It reports the resource
// UPDATE_COMPLETE but leaves the nested stack as it was (template, status,
// resources, the functions' code), so the nested stacks alone would show a
// kept job unchanged whatever its templates said.
func TestDeployAddRemoveJob(t *testing.T) {
	// Beside the other deploys: everything here runs out of this process.
	t.Parallel()
	awsCfg := testenv.AWS(t)
	requireLoopback(t)
	pinnedCLI(t, "cdklocal") // deploy.sh runs it
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	requireOneDynamoDB(ctx, t, awsCfg)

	const docs, later = 10, 5
	kept, removed, added := []string{"alpha", "beta"}, "gamma", "delta"
	f := &jobFleet{
		prefix:  "cwa" + randomHex(t, 4),
		dir:     t.TempDir(),
		dsn:     testenv.PostgresDSN(t),
		commit:  headCommit(t),
		sources: map[string]string{},
		cfn:     cloudformation.NewFromConfig(awsCfg),
		ddb:     dynamodb.NewFromConfig(awsCfg),
		sqs:     sqs.NewFromConfig(awsCfg),
		lambda:  lambda.NewFromConfig(awsCfg),
		events:  eventbridge.NewFromConfig(awsCfg),
		pg:      testenv.Postgres(t),
	}
	for _, id := range append(kept, removed, added) {
		f.sources[id] = testenv.CouchDB(t)
	}
	before := f.writeConfig(t, "before.json", kept[0], kept[1], removed)
	after := f.writeConfig(t, "after.json", kept[0], kept[1], added)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		f.remove(ctx, t, append(kept, removed, added))
	})

	outBefore, outAfter := filepath.Join(f.dir, "before.out"), filepath.Join(f.dir, "after.out")
	f.deploy(ctx, t, before, outBefore)
	for _, id := range append(kept, removed) {
		putDocs(ctx, t, f.sources[id], 0, docs)
	}
	f.runPollers(ctx, t, kept[0], kept[1], removed)
	f.waitDelivered(ctx, t, map[string]int{kept[0]: docs, kept[1]: docs, removed: docs})
	checked := f.checkIAM(t, outBefore, 0, kept[0], kept[1], removed)

	jobsBefore := jobStacks(ctx, t, f.cfn, f.prefix, outBefore)
	state := map[string]jobState{}
	for _, id := range kept {
		state[id] = f.readJobState(ctx, t, jobsBefore[id], id)
		if state[id].item["checkpoint_seq"] == nil {
			t.Fatalf("job %s has no checkpoint after its poller ran: %v", id, state[id].item)
		}
	}
	gone := f.readJobState(ctx, t, jobsBefore[removed], removed)
	for _, id := range kept {
		putDocs(ctx, t, f.sources[id], docs, later)
	}

	redeployed := time.Now()
	f.deploy(ctx, t, after, outAfter)
	jobsAfter := jobStacks(ctx, t, f.cfn, f.prefix, outAfter)
	for _, id := range kept {
		if d := cmp.Diff(jobTemplates(t, outBefore, f.prefix, id), jobTemplates(t, outAfter, f.prefix, id)); d != "" {
			t.Errorf("job %s: the deploy changed its stack (-before +after):\n%s", id, d)
		}
		for _, d := range diffJobState(state[id], f.readJobState(ctx, t, jobsAfter[id], id)) {
			t.Errorf("job %s: %s", id, d)
		}
	}
	touched := nestedStackEvents(ctx, t, f.cfn, f.prefix, redeployed, outBefore, outAfter)
	t.Logf("nested stack events of the second deploy: %v", touched)
	for job, statuses := range touched {
		if job != added && job != removed {
			t.Errorf("the second deploy touched job %s's nested stack: %v", job, statuses)
		}
	}
	if !contains(touched[added], string(cfntypes.ResourceStatusCreateComplete)) || !contains(touched[removed], string(cfntypes.ResourceStatusDeleteComplete)) {
		t.Errorf("nested stack events of the second deploy: %v; want %s created and %s deleted", touched, added, removed)
	}

	if s, ok := jobsAfter[removed]; ok {
		t.Errorf("the removed job %s still has its nested stack %s", removed, s)
	}
	if st := nestedStackStatus(ctx, f.cfn, jobsBefore[removed]); st != cfntypes.StackStatusDeleteComplete && st != "" {
		t.Errorf("the removed job's nested stack %s: %s, want DELETE_COMPLETE", jobsBefore[removed], st)
	}
	f.checkGone(ctx, t, removed, gone)
	if st := nestedStackStatus(ctx, f.cfn, jobsAfter[added]); st != cfntypes.StackStatusCreateComplete {
		t.Errorf("the added job's nested stack %q: %s, want CREATE_COMPLETE", jobsAfter[added], st)
	}

	// The added job end to end, and a kept job reading on from its
	// checkpoint: what it delivers now was written before the second deploy.
	putDocs(ctx, t, f.sources[added], 0, docs)
	f.runPollers(ctx, t, added, kept[0])
	f.waitDelivered(ctx, t, map[string]int{added: docs, kept[0]: docs + later})
	if item := f.readItem(ctx, t, added); item["checkpoint_seq"] == nil {
		t.Errorf("the added job %s has no checkpoint after its poller ran: %v", added, item)
	}
	moved := diffJobState(state[kept[0]], f.readJobState(ctx, t, jobsAfter[kept[0]], kept[0]))
	if !strings.Contains(strings.Join(moved, "\n"), "checkpoint_seq") {
		t.Errorf("job %s's poller delivered %d more documents, yet the comparison sees no change of its checkpoint: %v", kept[0], later, moved)
	}
	// A warm writer may deliver to PostgreSQL without an AWS request of
	// its own (Lambda's event source mapping receives and deletes).
	f.checkIAM(t, outAfter, checked, added)
}

// checkIAM evaluates the AWS requests the functions made, from the
// from-th recorded on, against their roles in the stack deployed from the
// cloud assembly outdir; each job named must have had requests of both its
// functions. It returns the number of requests recorded so far.
func (f *jobFleet) checkIAM(t *testing.T, outdir string, from int, jobs ...string) int {
	t.Helper()
	rep := iamcheck.Deployed{AWS: testenv.AWS(t), Calls: f.calls(), Assembly: outdir, Stack: f.prefix, Root: "..", From: from}.Check(t)
	for _, j := range jobs {
		for _, fn := range []string{fnPoller, fnWriter} {
			if name := functionName(f.cfg, f.jobs[j], fn); rep.ByCaller[name] == 0 {
				t.Errorf("no request of %s was recorded", name)
			}
		}
	}
	return rep.Calls
}

// calls is the file the functions record their AWS requests in: one for
// both deploys, so that a kept job's function configuration stays as it
// was.
func (f *jobFleet) calls() string { return filepath.Join(f.dir, "aws-calls.jsonl") }

// jobFleet is the stack of the test's jobs, deployed to the local AWS.
type jobFleet struct {
	prefix string
	dir    string
	dsn    string                 // PostgreSQL, the value of the stack's secret PG_DSN
	commit string                 // stamped into the functions of every deploy
	cfg    *config.File           // the configuration deployed last
	jobs   map[string]*config.Job // every job deployed, by id
	// sources are the jobs' source databases, by job id.
	sources map[string]string

	cfn    *cloudformation.Client
	ddb    *dynamodb.Client
	sqs    *sqs.Client
	lambda *lambda.Client
	events *eventbridge.Client
	pg     *pgxpool.Pool
}

// writeConfig writes the configuration of the jobs named into the test's
// directory and returns its path. Each job reads its own source and writes
// to a PostgreSQL table of its own, <prefix>_<job>; its poller sleeps while
// the feed is idle, so an invocation ends seconds after it has caught up.
func (f *jobFleet) writeConfig(t *testing.T, name string, jobs ...string) string {
	t.Helper()
	var docs []string
	for _, id := range jobs {
		docs = append(docs, fmt.Sprintf(`{"id": %q, "schedule": "1m",
      "idle": "sleep", "source": {"type": "couchdb", "url": %q},
      "feed": {"limit": 100, "timeout": "2s"}, "lease": {"ttl": "6s"},
      "outputs": [{"id": "pg", "type": "postgres",
        "postgres": {"dsn": {"env": "PG_DSN"}, "table": %q, "create_tables": true}}]}`, id, f.sources[id], f.table(id)))
	}
	p := filepath.Join(f.dir, name)
	doc := fmt.Sprintf(`{"stack": {"prefix": %q, "retain": false, "poller_timeout": "20s", "writer_timeout": "10s", "log_retention_days": 1},
  "jobs": [%s]}`, f.prefix, strings.Join(docs, ",\n    "))
	if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// headCommit returns the checkout's HEAD as deploy.sh stamps it; "" (no
// commit stamped) out of a git checkout.
func headCommit(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		t.Logf("git rev-parse HEAD: %v: the functions carry no commit", err)
	}
	return strings.TrimSpace(string(out))
}

// table is the PostgreSQL table of job's output.
func (f *jobFleet) table(job string) string { return f.prefix + "_" + job }

// deploy deploys the configuration at cfgPath with localstack/deploy.sh,
// its cloud assembly written to outdir.
func (f *jobFleet) deploy(ctx context.Context, t *testing.T, cfgPath, outdir string) {
	t.Helper()
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := testenv.DeployLocal(ctx, testenv.LocalDeploy{
		ConfigPath: cfgPath, BuildDir: filepath.Join(f.dir, "build"), AssemblyDir: outdir,
		// The same commit in both deploys: the kept jobs' functions must
		// not change though the checkout's HEAD may move between them.
		Env:      []string{"PG_DSN=" + f.dsn, "CHANGES_COMMIT=" + f.commit},
		AWSCalls: f.calls(),
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("localstack/deploy.sh %s took %s", filepath.Base(cfgPath), time.Since(start).Round(time.Second))
	f.cfg = cfg
	if f.jobs == nil {
		f.jobs = map[string]*config.Job{}
	}
	for _, j := range cfg.Jobs {
		f.jobs[j.ID] = j
	}
}

// runPollers invokes the pollers of the jobs named through the Lambda API,
// all at once, as their schedules would, and fails the test on an error.
func (f *jobFleet) runPollers(ctx context.Context, t *testing.T, jobs ...string) {
	t.Helper()
	start := time.Now()
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, id := range jobs {
		wg.Go(func() {
			fn := functionName(f.cfg, f.jobs[id], fnPoller)
			out, err := f.lambda.Invoke(ctx, &lambda.InvokeInput{FunctionName: &fn, Payload: fmt.Appendf(nil, `{"job":%q}`, id)},
				func(o *lambda.Options) { o.RetryMaxAttempts = 1 })
			switch {
			case err != nil:
				errs[i] = fmt.Errorf("invoke %s: %w", fn, err)
			case out.FunctionError != nil:
				errs[i] = fmt.Errorf("%s: %s: %s", fn, aws.ToString(out.FunctionError), out.Payload)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Logf("pollers of %v returned after %s", jobs, time.Since(start).Round(time.Second))
}

// waitDelivered waits until each job's PostgreSQL table holds the number of
// documents given and its queues are drained: no message visible or in
// flight in its work queue or its DLQ.
func (f *jobFleet) waitDelivered(ctx context.Context, t *testing.T, want map[string]int) {
	t.Helper()
	start := time.Now()
	got := map[string]string{}
	err := testenv.Poll(ctx, 3*time.Minute, 2*time.Second, func(ctx context.Context) (bool, error) {
		done := true
		for id, n := range want {
			var rows int
			err := f.pg.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{f.table(id)}.Sanitize()).Scan(&rows)
			depth := f.queueDepth(ctx, t, id)
			got[id] = fmt.Sprintf("%d rows (%v), %d messages queued", rows, err, depth)
			done = done && err == nil && rows == n && depth == 0
		}
		return done, nil
	})
	if err != nil {
		t.Fatalf("jobs not delivered: %v: want %v documents and empty queues, have %v", err, want, got)
	}
	t.Logf("delivered %v and queues drained in %s", want, time.Since(start).Round(time.Second))
}

// queueDepth returns the messages of job's queues and DLQs, visible and in
// flight.
func (f *jobFleet) queueDepth(ctx context.Context, t *testing.T, job string) int {
	t.Helper()
	n := 0
	for _, name := range f.queueNames(job) {
		a := f.queueAttributes(ctx, t, name)
		for _, k := range []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages, sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible} {
			i, err := strconv.Atoi(a[string(k)])
			if err != nil {
				t.Fatalf("queue %s: %s = %q", name, k, a[string(k)])
			}
			n += i
		}
	}
	return n
}

// queueNames are the names of job's work queues and DLQs.
func (f *jobFleet) queueNames(job string) []string {
	j := f.jobs[job]
	var names []string
	for _, o := range j.Outputs {
		names = append(names, f.cfg.QueueName(j, o), f.cfg.DLQName(j, o))
	}
	return names
}

// queueAttributes returns every attribute of the queue name, its URL as URL.
func (f *jobFleet) queueAttributes(ctx context.Context, t *testing.T, name string) map[string]string {
	t.Helper()
	u, err := f.sqs.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		t.Fatalf("queue %s: %v", name, err)
	}
	a, err := f.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: u.QueueUrl,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameAll}})
	if err != nil {
		t.Fatalf("queue %s attributes: %v", name, err)
	}
	a.Attributes["URL"] = aws.ToString(u.QueueUrl)
	return a.Attributes
}

// jobState is what a deploy that leaves a job alone must leave as it is:
// its nested stack with its template and resources, its functions, event
// source mappings and schedule rule, its queues, its lease and checkpoint.
type jobState struct {
	stack     string                       // the nested stack's id, status and last update
	template  string                       // as CloudFormation holds it
	resources map[string]string            // logical id → physical id and status
	functions map[string]string            // name → ARN, code, revision, last modification, state
	mappings  map[string]string            // event source mapping UUID → source, function, state, last modification
	rule      string                       // the schedule rule's ARN, state and schedule
	queues    map[string]map[string]string // queue name → URL and every attribute
	item      map[string]any               // the job's lease and checkpoint item
}

// diffJobState describes each part of a job's state that differs between
// before and after, the lease and checkpoint item first; nil when none does.
func diffJobState(before, after jobState) []string {
	var out []string
	for _, p := range []struct {
		what          string
		before, after any
	}{
		{"lease and checkpoint item", before.item, after.item},
		{"queues", before.queues, after.queues},
		{"functions", before.functions, after.functions},
		{"event source mappings", before.mappings, after.mappings},
		{"schedule rule", before.rule, after.rule},
		{"nested stack", before.stack, after.stack},
		{"nested stack template", before.template, after.template},
		{"nested stack resources", before.resources, after.resources},
	} {
		if d := cmp.Diff(p.before, p.after); d != "" {
			out = append(out, fmt.Sprintf("%s changed (-before +after):\n%s", p.what, d))
		}
	}
	return out
}

// TestJobStateDiff: the comparison of TestDeployAddRemoveJob names each
// part of a job's deployed state that changed, and nothing when none did.
func TestJobStateDiff(t *testing.T) {
	t.Parallel()
	base := func() jobState {
		return jobState{
			stack:     "arn:stack/p-Jobalpha/1 CREATE_COMPLETE updated 0001-01-01 00:00:00 +0000 UTC",
			template:  `{"Resources": {}}`,
			resources: map[string]string{"Queue": "http://q/p-alpha-pg CREATE_COMPLETE"},
			functions: map[string]string{"p-alpha-poller": "arn:fn code abc= revision r1 modified t1 Active"},
			mappings:  map[string]string{"u1": "arn:q → arn:fn Enabled modified t1"},
			rule:      "arn:rule DISABLED rate(1 minute)",
			queues:    map[string]map[string]string{"p-alpha-pg": {"URL": "http://q/p-alpha-pg", "CreatedTimestamp": "1"}},
			item:      map[string]any{"job_id": "alpha", "checkpoint_seq": "10-abc", "generation": "N:1", "released": true},
		}
	}
	tests := []struct {
		name   string
		change func(*jobState)
		want   []string // what the diff names
		added  string   // a value the diff shows as after's (+), if any
	}{
		{name: "unchanged", change: func(*jobState) {}},
		{name: "checkpoint moved", change: func(s *jobState) { s.item["checkpoint_seq"] = "15-def" },
			want: []string{"lease and checkpoint item", "checkpoint_seq"}, added: "15-def"},
		{name: "lease taken again", change: func(s *jobState) { s.item["generation"] = "N:2" },
			want: []string{"lease and checkpoint item", "generation"}, added: "N:2"},
		{name: "item gone", change: func(s *jobState) { s.item = map[string]any{} },
			want: []string{"lease and checkpoint item"}},
		{name: "queue recreated", change: func(s *jobState) { s.queues["p-alpha-pg"]["CreatedTimestamp"] = "2" },
			want: []string{"queues", "CreatedTimestamp"}},
		{name: "function code updated", change: func(s *jobState) { s.functions["p-alpha-poller"] = "arn:fn code xyz= revision r2 modified t2 Active" },
			want: []string{"functions"}, added: "xyz="},
		{name: "mapping recreated", change: func(s *jobState) { s.mappings = map[string]string{"u2": s.mappings["u1"]} },
			want: []string{"event source mappings"}},
		{name: "rule enabled", change: func(s *jobState) { s.rule = "arn:rule ENABLED rate(1 minute)" },
			want: []string{"schedule rule"}},
		{name: "nested stack updated", change: func(s *jobState) {
			s.stack = strings.Replace(s.stack, "CREATE_COMPLETE updated 0001-01-01", "UPDATE_COMPLETE updated 2026-01-01", 1)
		}, want: []string{"nested stack changed"}},
		{name: "template and resource", change: func(s *jobState) {
			s.template, s.resources["Queue"] = `{"Resources": {"Queue": {}}}`, "http://q/p-alpha-pg UPDATE_COMPLETE"
		}, want: []string{"nested stack template", "nested stack resources"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			after := base()
			tc.change(&after)
			got := diffJobState(base(), after)
			if len(tc.want) == 0 {
				if got != nil {
					t.Fatalf("diff of an unchanged state: %q", got)
				}
				return
			}
			text := strings.Join(got, "\n")
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("diff does not name %q:\n%s", w, text)
				}
			}
			for _, line := range strings.Split(text, "\n") {
				if tc.added != "" && strings.Contains(line, tc.added) && !strings.HasPrefix(strings.TrimSpace(line), "+") {
					t.Errorf("diff shows after's %q as before's:\n%s", tc.added, text)
				}
			}
		})
	}
}

func (f *jobFleet) readJobState(ctx context.Context, t *testing.T, stack, job string) jobState {
	t.Helper()
	var st jobState
	out, err := f.cfn.DescribeStacks(ctx, &cloudformation.DescribeStacksInput{StackName: &stack})
	if err != nil || len(out.Stacks) != 1 {
		t.Fatalf("describe the nested stack %s of job %s: %v", stack, job, err)
	}
	s := out.Stacks[0]
	st.stack = fmt.Sprintf("%s %s updated %s", aws.ToString(s.StackId), s.StackStatus, aws.ToTime(s.LastUpdatedTime))
	tmpl, err := f.cfn.GetTemplate(ctx, &cloudformation.GetTemplateInput{StackName: &stack})
	if err != nil {
		t.Fatalf("template of the nested stack %s of job %s: %v", stack, job, err)
	}
	st.template = aws.ToString(tmpl.TemplateBody)
	st.resources = map[string]string{}
	for id, r := range stackResources(ctx, t, f.cfn, stack) {
		st.resources[id] = aws.ToString(r.PhysicalResourceId) + " " + string(r.ResourceStatus)
	}

	j := f.jobs[job]
	st.functions, st.mappings = map[string]string{}, map[string]string{}
	for _, fn := range []string{fnPoller, fnWriter, fnVerify} {
		name := functionName(f.cfg, j, fn)
		got, err := f.lambda.GetFunction(ctx, &lambda.GetFunctionInput{FunctionName: &name})
		if err != nil {
			t.Fatalf("function %s: %v", name, err)
		}
		c := got.Configuration
		st.functions[name] = fmt.Sprintf("%s code %s revision %s modified %s %s", aws.ToString(c.FunctionArn),
			aws.ToString(c.CodeSha256), aws.ToString(c.RevisionId), aws.ToString(c.LastModified), c.State)
		p := lambda.NewListEventSourceMappingsPaginator(f.lambda, &lambda.ListEventSourceMappingsInput{FunctionName: &name})
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				t.Fatalf("event source mappings of %s: %v", name, err)
			}
			for _, m := range page.EventSourceMappings {
				st.mappings[aws.ToString(m.UUID)] = fmt.Sprintf("%s → %s %s modified %s", aws.ToString(m.EventSourceArn),
					aws.ToString(m.FunctionArn), aws.ToString(m.State), aws.ToTime(m.LastModified))
			}
		}
	}
	rule := scheduleName(f.cfg, j)
	r, err := f.events.DescribeRule(ctx, &eventbridge.DescribeRuleInput{Name: &rule})
	if err != nil {
		t.Fatalf("rule %s: %v", rule, err)
	}
	st.rule = fmt.Sprintf("%s %s %s", aws.ToString(r.Arn), r.State, aws.ToString(r.ScheduleExpression))

	st.queues = map[string]map[string]string{}
	for _, name := range f.queueNames(job) {
		st.queues[name] = f.queueAttributes(ctx, t, name)
	}
	st.item = f.readItem(ctx, t, job)
	return st
}

// readItem returns job's lease and checkpoint item, read consistently.
func (f *jobFleet) readItem(ctx context.Context, t *testing.T, job string) map[string]any {
	t.Helper()
	item, err := f.ddb.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(f.cfg.TableName()), ConsistentRead: aws.Bool(true),
		Key: map[string]ddbtypes.AttributeValue{stateKey: &ddbtypes.AttributeValueMemberS{Value: job}}})
	if err != nil {
		t.Fatalf("job item of %s: %v", job, err)
	}
	out := map[string]any{}
	for k, v := range item.Item {
		out[k] = attributeText(v)
	}
	return out
}

// checkGone requires everything of the removed job, as before recorded it
// while it was deployed, to be gone: its functions, their event source
// mappings, its schedule rule and its queues.
func (f *jobFleet) checkGone(ctx context.Context, t *testing.T, job string, before jobState) {
	t.Helper()
	// look fails the test unless gone: the answer to the lookup of what, err,
	// says it does not exist.
	look := func(what string, err error, gone bool) {
		if !gone {
			t.Errorf("%s of the removed job %s: %v, want it not found", what, job, err)
		}
	}
	for name := range before.functions {
		_, err := f.lambda.GetFunction(ctx, &lambda.GetFunctionInput{FunctionName: &name})
		look("function "+name, err, errors.As(err, new(*lambdatypes.ResourceNotFoundException)))
	}
	for uuid := range before.mappings {
		_, err := f.lambda.GetEventSourceMapping(ctx, &lambda.GetEventSourceMappingInput{UUID: &uuid})
		look("event source mapping "+uuid, err, errors.As(err, new(*lambdatypes.ResourceNotFoundException)))
	}
	rule := scheduleName(f.cfg, f.jobs[job])
	_, err := f.events.DescribeRule(ctx, &eventbridge.DescribeRuleInput{Name: &rule})
	look("rule "+rule, err, errors.As(err, new(*ebtypes.ResourceNotFoundException)))
	for name := range before.queues {
		_, err := f.sqs.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
		look("queue "+name, err, errors.As(err, new(*sqstypes.QueueDoesNotExist)))
	}
}

// remove deletes the stack, its bucket in the S3 the functions use (where
// deploy.sh created it) and the jobs' PostgreSQL tables.
func (f *jobFleet) remove(ctx context.Context, t *testing.T, jobs []string) {
	bucket, bucketErr := deployed.Bucket(ctx, f.cfn, f.prefix)
	deleteStack(ctx, t, f.cfn, f.prefix)
	if bucketErr == nil {
		if _, err := s3.NewFromConfig(testenv.AWS(t)).DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: &bucket}); err != nil {
			t.Logf("delete bucket %s: %v", bucket, err)
		}
	}
	for _, id := range jobs {
		for _, tbl := range []string{f.table(id), f.table(id) + "_versions"} {
			if _, err := f.pg.Exec(ctx, `DROP TABLE IF EXISTS `+pgx.Identifier{tbl}.Sanitize()); err != nil {
				t.Logf("drop table %s: %v", tbl, err)
			}
		}
	}
}

// attributeText renders a DynamoDB attribute value for comparison and
// messages.
func attributeText(v ddbtypes.AttributeValue) any {
	switch v := v.(type) {
	case *ddbtypes.AttributeValueMemberS:
		return v.Value
	case *ddbtypes.AttributeValueMemberN:
		return "N:" + v.Value
	case *ddbtypes.AttributeValueMemberBOOL:
		return v.Value
	case *ddbtypes.AttributeValueMemberM:
		m := map[string]any{}
		for k, e := range v.Value {
			m[k] = attributeText(e)
		}
		return m
	case *ddbtypes.AttributeValueMemberL:
		var l []any
		for _, e := range v.Value {
			l = append(l, attributeText(e))
		}
		return l
	}
	return fmt.Sprintf("%T %v", v, v)
}

// nestedStackEvents returns the statuses CloudFormation reported since
// since for the job stacks nested in stack, by job id; the cloud
// assemblies in outdirs name each nested stack resource's job.
func nestedStackEvents(ctx context.Context, t *testing.T, cfn *cloudformation.Client, stack string, since time.Time, outdirs ...string) map[string][]string {
	t.Helper()
	jobOf := map[string]string{}
	for _, outdir := range outdirs {
		for id, job := range jobStackIDs(t, outdir, stack) {
			jobOf[id] = job
		}
	}
	out := map[string][]string{}
	p := cloudformation.NewDescribeStackEventsPaginator(cfn, &cloudformation.DescribeStackEventsInput{StackName: &stack})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatalf("events of stack %s: %v", stack, err)
		}
		for _, e := range page.StackEvents {
			id := aws.ToString(e.LogicalResourceId)
			if aws.ToString(e.ResourceType) != "AWS::CloudFormation::Stack" || id == stack || aws.ToTime(e.Timestamp).Before(since) {
				continue
			}
			job, ok := jobOf[id]
			if !ok {
				t.Fatalf("stack %s: event of nested stack %s, which no template holds", stack, id)
			}
			out[job] = append(out[job], string(e.ResourceStatus))
		}
	}
	for _, statuses := range out {
		sort.Strings(statuses)
	}
	return out
}

// jobTemplates returns what CloudFormation compares to decide whether job's
// nested stack needs an update: its resource in the template of the stack
// named stack (template location, parameters, dependencies) and the nested
// template, from the cloud assembly in outdir.
func jobTemplates(t *testing.T, outdir, stack, job string) string {
	t.Helper()
	tmpl := readTemplate(t, filepath.Join(outdir, stack+".template.json"))
	for id, j := range jobStackIDs(t, outdir, stack) {
		if j != job {
			continue
		}
		r := tmpl["Resources"].(map[string]any)[id].(map[string]any)
		md, _ := r["Metadata"].(map[string]any)
		nested, err := os.ReadFile(filepath.Join(outdir, md["aws:asset:path"].(string)))
		if err != nil {
			t.Fatal(err)
		}
		return compact(r) + "\n" + string(nested)
	}
	t.Fatalf("%s: no nested stack of job %s", outdir, job)
	return ""
}

// jobStackIDs returns the job of each nested stack resource in the
// template of the stack named stack, in the cloud assembly outdir, by
// logical id; the job is in the resource's construct path, Job-<id>.
func jobStackIDs(t *testing.T, outdir, stack string) map[string]string {
	t.Helper()
	tmpl := readTemplate(t, filepath.Join(outdir, stack+".template.json"))
	jobOf := map[string]string{}
	for id, r := range templateResources(tmpl, "AWS::CloudFormation::Stack") {
		md, _ := r["Metadata"].(map[string]any)
		path, _ := md["aws:cdk:path"].(string)
		rest, ok := strings.CutPrefix(path, stack+"/Job-")
		job, _, cut := strings.Cut(rest, ".")
		if !ok || !cut {
			t.Fatalf("nested stack %s: construct path %q names no job", id, path)
		}
		jobOf[id] = job
	}
	return jobOf
}

// jobStacks returns the physical ids of the deployed job stacks nested in
// stack, by job id, the cloud assembly outdir naming each one's job.
func jobStacks(ctx context.Context, t *testing.T, cfn *cloudformation.Client, stack, outdir string) map[string]string {
	t.Helper()
	jobOf := jobStackIDs(t, outdir, stack)
	out := map[string]string{}
	for id, r := range stackResources(ctx, t, cfn, stack) {
		if aws.ToString(r.ResourceType) != "AWS::CloudFormation::Stack" {
			continue
		}
		job, ok := jobOf[id]
		if !ok {
			t.Fatalf("deployed nested stack %s is not in the template", id)
		}
		out[job] = aws.ToString(r.PhysicalResourceId)
	}
	return out
}

// nestedStackStatus returns the status of the stack with id (a deleted stack
// is still described by its id), or "" when it is not known at all.
func nestedStackStatus(ctx context.Context, cfn *cloudformation.Client, id string) cfntypes.StackStatus {
	if id == "" {
		return ""
	}
	out, err := cfn.DescribeStacks(ctx, &cloudformation.DescribeStacksInput{StackName: &id})
	if err != nil || len(out.Stacks) != 1 {
		return ""
	}
	return out.Stacks[0].StackStatus
}
