package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	cfntypes "github.com/aws/aws-sdk-go-v2/service/cloudformation/types"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// deployedRun is how a deploy test runs the pipeline of a deployed variant.
type deployedRun struct {
	variant variant
	// pollOnce runs the pollers of every job of the configuration at cfgPath
	// until each has caught up with its source: each then holds its lease
	// item with a checkpoint, and its work queues hold what it read.
	pollOnce func(ctx context.Context, t *testing.T, cfgPath string)
}

// localRun is the local variant, its pollers hosted on this machine by
// `changesctl run` against the deployed table and queues. A variant with
// functions would instead wait for the deployed schedules to run them.
var localRun = deployedRun{variant: variantLocal, pollOnce: pollWithChangesctl}

// TestDeployAddRemoveJob deploys three jobs to the local AWS, runs their
// pollers until each holds a lease and a checkpoint, then deploys the
// configuration with one job removed and another added. Only those two
// jobs' stacks change: the removed job's nested stack and queues are
// deleted, the added job's created; for the other two jobs, the deployed
// templates give CloudFormation nothing to update (their nested stack
// resources in the shared stack's template and their own templates are the
// same, byte for byte), their nested stacks keep their template and
// resources, their queues are the same queues holding the same messages, and
// their lease and checkpoint items are exactly as before.
//
// The template comparison is what shows the other jobs' stacks untouched on
// AWS: the local AWS does not show an update of a nested stack (a job whose
// settings change keeps the template, status and resources it was first
// deployed with), so its view of them alone would show them unchanged
// whatever the templates said.
func TestDeployAddRemoveJob(t *testing.T) {
	testDeployAddRemoveJob(t, localRun)
}

func testDeployAddRemoveJob(t *testing.T, run deployedRun) {
	awsCfg := testenv.AWS(t)
	requireLoopback(t)
	cdklocal := pinnedCLI(t, "cdklocal")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()

	prefix := "cwa" + randomHex(t, 4)
	db := testenv.CouchDB(t)
	putDocs(ctx, t, db, 10)
	dir := t.TempDir()
	kept, removed, added := []string{"alpha", "beta"}, "gamma", "delta"
	writeConfig := func(name string, jobs ...string) string {
		var docs []string
		for _, id := range jobs {
			docs = append(docs, fmt.Sprintf(`{"id": %q, "schedule": "1m",
      "source": {"type": "couchdb", "url": %q},
      "feed": {"limit": 100, "timeout": "2s"}, "lease": {"ttl": "6s"},
      "outputs": [{"id": "pg", "type": "postgres", "postgres": {"dsn": {"env": "PG_DSN"}, "table": "docs"}}]}`, id, db))
		}
		p := filepath.Join(dir, name)
		doc := fmt.Sprintf(`{"stack": {"prefix": %q, "retain": false, "poller_timeout": "20s", "writer_timeout": "10s", "log_retention_days": 7},
  "jobs": [%s]}`, prefix, strings.Join(docs, ",\n    "))
		if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	before := writeConfig("before.json", kept[0], kept[1], removed)
	after := writeConfig("after.json", kept[0], kept[1], added)

	requireOneDynamoDB(ctx, t, awsCfg)
	cfn := cloudformation.NewFromConfig(awsCfg)
	ddb := dynamodb.NewFromConfig(awsCfg)
	sq := sqs.NewFromConfig(awsCfg)
	cli := cdkRun{bin: cdklocal, env: cdkEnv(t), dir: ".."}
	if !stackExists(ctx, cfn, "CDKToolkit") {
		cli.run(ctx, t, "bootstrap", "-c", "config="+before, "-c", "variant="+string(run.variant))
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		deleteStack(ctx, t, cfn, prefix)
	})
	deploy := func(cfgPath, outdir string) {
		start := time.Now()
		cli.run(ctx, t, "deploy", "-c", "config="+cfgPath, "-c", "variant="+string(run.variant), "-o", outdir,
			"--require-approval", "never", "--no-notices")
		t.Logf("cdklocal deploy %s took %s", filepath.Base(cfgPath), time.Since(start).Round(time.Second))
	}

	outBefore, outAfter := filepath.Join(dir, "before.out"), filepath.Join(dir, "after.out")
	deploy(before, outBefore)
	run.pollOnce(ctx, t, before)
	cfg, err := config.Load(before)
	if err != nil {
		t.Fatal(err)
	}
	jobsBefore := jobStacks(ctx, t, cfn, prefix, outBefore)
	state := map[string]jobState{}
	for _, id := range kept {
		state[id] = readJobState(ctx, t, cfn, ddb, sq, cfg, jobsBefore[id], id)
		if len(state[id].item) == 0 || state[id].item["checkpoint_seq"] == nil {
			t.Fatalf("job %s has no lease and checkpoint item after its pollers ran: %v", id, state[id].item)
		}
	}

	deploy(after, outAfter)
	jobsAfter := jobStacks(ctx, t, cfn, prefix, outAfter)
	for _, id := range kept {
		got := readJobState(ctx, t, cfn, ddb, sq, cfg, jobsAfter[id], id)
		want := state[id]
		if !reflect.DeepEqual(got.item, want.item) {
			t.Errorf("job %s's lease and checkpoint item changed:\nbefore %v\nafter  %v", id, want.item, got.item)
		}
		if d := cmp.Diff(jobTemplates(t, outBefore, prefix, id), jobTemplates(t, outAfter, prefix, id)); d != "" {
			t.Errorf("job %s: the deploy changed its stack (-before +after):\n%s", id, d)
		}
		if got.template != want.template {
			t.Errorf("job %s's stack template changed:\nbefore %s\nafter  %s", id, want.template, got.template)
		}
		if got.stack != want.stack {
			t.Errorf("job %s's stack changed:\nbefore %+v\nafter  %+v", id, want.stack, got.stack)
		}
		if !reflect.DeepEqual(got.resources, want.resources) {
			t.Errorf("job %s's resources changed:\nbefore %v\nafter  %v", id, want.resources, got.resources)
		}
		if !reflect.DeepEqual(got.queues, want.queues) {
			t.Errorf("job %s's queues changed:\nbefore %v\nafter  %v", id, want.queues, got.queues)
		}
	}
	if s, ok := jobsAfter[removed]; ok {
		t.Errorf("the removed job %s still has its nested stack %s", removed, s)
	}
	if old := jobsBefore[removed]; old != "" {
		if st := nestedStackStatus(ctx, cfn, old); st != cfntypes.StackStatusDeleteComplete && st != "" {
			t.Errorf("the removed job's nested stack %s: %s, want DELETE_COMPLETE", old, st)
		}
	}
	if st := nestedStackStatus(ctx, cfn, jobsAfter[added]); st != cfntypes.StackStatusCreateComplete {
		t.Errorf("the added job's nested stack %q: %s, want CREATE_COMPLETE", jobsAfter[added], st)
	}
	cfgAfter, err := config.Load(after)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range append(cfg.Jobs, cfgAfter.Jobs...) {
		want := j.ID != removed
		for _, o := range j.Outputs {
			for _, q := range []string{cfg.QueueName(j, o), cfg.DLQName(j, o)} {
				_, err := sq.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &q})
				var missing *sqstypes.QueueDoesNotExist
				if got := err == nil; got != want || (err != nil && !errors.As(err, &missing)) {
					t.Errorf("queue %s exists: %v (%v), want %v", q, got, err, want)
				}
			}
		}
	}
}

// jobState is what a job's deploy must leave alone: its nested stack, the
// resources in it, its queues with their messages, its lease and checkpoint.
type jobState struct {
	stack     nestedStackState
	template  string            // as CloudFormation holds it
	resources map[string]string // logical id → physical id
	queues    map[string]string // queue name → URL and messages
	item      map[string]any
}

type nestedStackState struct {
	id, status  string
	lastUpdated time.Time
}

func readJobState(ctx context.Context, t *testing.T, cfn *cloudformation.Client, ddb *dynamodb.Client, sq *sqs.Client, cfg *config.File, stack, job string) jobState {
	t.Helper()
	var st jobState
	out, err := cfn.DescribeStacks(ctx, &cloudformation.DescribeStacksInput{StackName: &stack})
	if err != nil || len(out.Stacks) != 1 {
		t.Fatalf("describe the nested stack %s of job %s: %v", stack, job, err)
	}
	s := out.Stacks[0]
	st.stack = nestedStackState{id: aws.ToString(s.StackId), status: string(s.StackStatus), lastUpdated: aws.ToTime(s.LastUpdatedTime)}
	tmpl, err := cfn.GetTemplate(ctx, &cloudformation.GetTemplateInput{StackName: &stack})
	if err != nil {
		t.Fatalf("template of the nested stack %s of job %s: %v", stack, job, err)
	}
	st.template = aws.ToString(tmpl.TemplateBody)
	st.resources = map[string]string{}
	for id, r := range stackResources(ctx, t, cfn, stack) {
		st.resources[id] = aws.ToString(r.PhysicalResourceId) + " " + string(r.ResourceStatus)
	}
	st.queues = map[string]string{}
	for _, j := range cfg.Jobs {
		if j.ID != job {
			continue
		}
		for _, o := range j.Outputs {
			for _, name := range []string{cfg.QueueName(j, o), cfg.DLQName(j, o)} {
				u, err := sq.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
				if err != nil {
					t.Fatalf("queue %s: %v", name, err)
				}
				a, err := sq.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: u.QueueUrl,
					AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages, sqstypes.QueueAttributeNameCreatedTimestamp}})
				if err != nil {
					t.Fatalf("queue %s attributes: %v", name, err)
				}
				st.queues[name] = fmt.Sprintf("%s created %s, %s messages", aws.ToString(u.QueueUrl),
					a.Attributes[string(sqstypes.QueueAttributeNameCreatedTimestamp)], a.Attributes[string(sqstypes.QueueAttributeNameApproximateNumberOfMessages)])
			}
		}
	}
	item, err := ddb.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(cfg.TableName()), ConsistentRead: aws.Bool(true),
		Key: map[string]ddbtypes.AttributeValue{stateKey: &ddbtypes.AttributeValueMemberS{Value: job}}})
	if err != nil {
		t.Fatalf("job item of %s: %v", job, err)
	}
	st.item = map[string]any{}
	for k, v := range item.Item {
		st.item[k] = attributeText(v)
	}
	return st
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

// jobTemplates returns what CloudFormation compares to decide whether job's
// nested stack needs an update: its resource in the template of the stack
// named stack (template location, parameters, dependencies) and the nested
// template, from the cloud assembly in outdir.
func jobTemplates(t *testing.T, outdir, stack, job string) string {
	t.Helper()
	tmpl := readTemplate(t, filepath.Join(outdir, stack+".template.json"))
	for _, r := range templateResources(tmpl, "AWS::CloudFormation::Stack") {
		md, _ := r["Metadata"].(map[string]any)
		if path, _ := md["aws:cdk:path"].(string); !strings.HasPrefix(path, stack+"/Job-"+job+".") {
			continue
		}
		nested, err := os.ReadFile(filepath.Join(outdir, md["aws:asset:path"].(string)))
		if err != nil {
			t.Fatal(err)
		}
		return compact(r) + "\n" + string(nested)
	}
	t.Fatalf("%s: no nested stack of job %s", outdir, job)
	return ""
}

// jobStacks returns the physical ids of the deployed job stacks nested in
// stack, by job id; the stack's template in the cloud assembly outdir gives
// each nested stack resource's construct path, Job-<id>.
func jobStacks(ctx context.Context, t *testing.T, cfn *cloudformation.Client, stack, outdir string) map[string]string {
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

// pollWithChangesctl runs the pollers of every job of the configuration at
// cfgPath with `changesctl run --no-writer --until-idle`, on the deployed
// table and queues, configured only by the standard environment.
func pollWithChangesctl(ctx context.Context, t *testing.T, cfgPath string) {
	t.Helper()
	changesctl(ctx, t, "run", "--config", cfgPath, "--no-writer", "--until-idle", "--tick", "2s", "--timeout", "3m")
}
