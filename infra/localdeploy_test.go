package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	cfntypes "github.com/aws/aws-sdk-go-v2/service/cloudformation/types"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	lambdatypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deployed"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// TestDeployLocalVariant deploys the local variant of the stack (everything
// but the functions, their schedules and event sources; see variant.go) to
// the local AWS with the pinned CDK CLI through cdklocal, as
// `make localstack-deploy` does on a machine without Docker. It then checks
// through the AWS APIs what the stack created, and runs the pipeline on the
// deployed queues and table with the hosted handlers (`changesctl run`,
// configured only by the standard environment) until documents from the
// source are in PostgreSQL.
//
// What the local AWS accepts but ignores (point-in-time recovery, deletion
// protection, bucket lifecycle and access logging, log retention, reserved
// concurrency, dashboards, metric-math alarm evaluation) is covered by the
// template tests only.
func TestDeployLocalVariant(t *testing.T) {
	// Beside the other deploys: everything here runs out of this process.
	t.Parallel()
	awsCfg := testenv.AWS(t)
	requireLoopback(t)
	cdklocal := pinnedCLI(t, "cdklocal")
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()

	prefix := "cwl" + randomHex(t, 4)
	pgTable := strings.ReplaceAll(prefix, "-", "_")
	db := testenv.CouchDB(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "jobs.json")
	doc := fmt.Sprintf(`{
  "stack": {"prefix": %q, "retain": false, "poller_timeout": "20s", "writer_timeout": "10s", "log_retention_days": 7},
  "jobs": [{
    "id": "orders", "schedule": "1m",
    "source": {"type": "couchdb", "url": %q},
    "feed": {"limit": 100, "timeout": "2s"}, "lease": {"ttl": "6s"},
    "outputs": [
      {"id": "pg", "type": "postgres", "max_receive_count": 4,
       "postgres": {"dsn": {"env": "PG_DSN"}, "table": %q, "create_tables": true}},
      {"id": "pgfifo", "type": "postgres", "ordering": "per_document",
       "postgres": {"dsn": {"env": "PG_DSN"}, "table": "%s_fifo", "create_tables": true}}]}]}`, prefix, db, pgTable, pgTable)
	if err := os.WriteFile(cfgPath, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}

	requireOneDynamoDB(ctx, t, awsCfg)
	cfn := cloudformation.NewFromConfig(awsCfg)
	cli := cdkRun{bin: cdklocal, env: cdkEnv(t), dir: ".."}
	// The script deploys use: it bootstraps one at a time, as the tests
	// deploy side by side.
	script, err := filepath.Abs(filepath.Join("..", "localstack", "cdk-bootstrap.sh"))
	if err != nil {
		t.Fatal(err)
	}
	bootstrap := cdkRun{bin: script, env: append(cli.env, "CDKLOCAL="+cdklocal), dir: ".."}
	bootstrap.run(ctx, t, "-c", "config="+cfgPath, "-c", "variant=local")
	outdir := filepath.Join(dir, "cdk.out")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		deleteStack(ctx, t, cfn, prefix)
		pool := testenv.Postgres(t)
		for _, tbl := range []string{pgTable, pgTable + "_versions", pgTable + "_fifo", pgTable + "_fifo_versions"} {
			pool.Exec(ctx, `DROP TABLE IF EXISTS `+pgx.Identifier{tbl}.Sanitize())
		}
	})
	start := time.Now()
	cli.run(ctx, t, "deploy", "-c", "config="+cfgPath, "-c", "variant=local", "-o", outdir, "--require-approval", "never", "--no-notices")
	t.Logf("cdklocal deploy took %s", time.Since(start).Round(time.Second))

	out, err := cfn.DescribeStacks(ctx, &cloudformation.DescribeStacksInput{StackName: &prefix})
	if err != nil {
		t.Fatalf("describe stack %s: %v", prefix, err)
	}
	if st := out.Stacks[0].StackStatus; st != cfntypes.StackStatusCreateComplete {
		t.Fatalf("stack %s: %s, want CREATE_COMPLETE\n%s", prefix, st, stackEvents(ctx, cfn, prefix))
	}
	tmpl, nested := readTemplates(t, outdir, prefix)
	checkStackResources(ctx, t, cfn, prefix, tmpl, nested)
	all := mergedTemplate(tmpl, nested)

	bucket, err := deployed.Bucket(ctx, cfn, prefix)
	if err != nil {
		t.Fatalf("stack output: %v", err)
	}
	checkDeployedQueues(ctx, t, sqs.NewFromConfig(awsCfg), cfg)
	checkDeployedTable(ctx, t, dynamodb.NewFromConfig(awsCfg), cfg)
	checkDeployedBucket(ctx, t, cfnS3(awsCfg), bucket)
	checkDeployedSecrets(ctx, t, secretsmanager.NewFromConfig(awsCfg), prefix, tmpl)
	checkDeployedAlarms(ctx, t, cloudwatch.NewFromConfig(awsCfg), sns.NewFromConfig(awsCfg), prefix, all)
	checkNoFunctions(ctx, t, lambda.NewFromConfig(awsCfg), cfg)

	// The hosted handlers on the deployed queues and table: changesctl with
	// nothing but the standard environment.
	const docs = 25
	putDocs(ctx, t, db, 0, docs)
	stdout, stderr := changesctl(ctx, t, "run", "--config", cfgPath, "--until-idle", "--tick", "2s", "--timeout", "4m")
	t.Logf("changesctl run: %s", strings.TrimSpace(stdout))
	if want := "bucket=" + bucket; !strings.Contains(stderr, "using the deployed stack's bucket") || !strings.Contains(stderr, want) {
		t.Errorf("changesctl did not use the stack's bucket %s:\n%s", bucket, stderr)
	}
	pool := testenv.Postgres(t)
	for _, tbl := range []string{pgTable, pgTable + "_fifo"} {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{tbl}.Sanitize()).Scan(&n); err != nil || n != docs {
			t.Errorf("table %s holds %d documents (%v), want %d", tbl, n, err, docs)
		}
	}
	item, err := dynamodb.NewFromConfig(awsCfg).GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(cfg.TableName()), Key: map[string]ddbtypes.AttributeValue{stateKey: &ddbtypes.AttributeValueMemberS{Value: "orders"}},
	})
	if err != nil || len(item.Item) == 0 {
		t.Errorf("job item of orders in %s: %v, %v; want the lease and checkpoint the poller wrote", cfg.TableName(), item, err)
	}
}

// TestBareDeployRefuses runs the pinned CDK CLI's deploy from the repository
// root without naming a job configuration: the app must refuse before
// anything is deployed. The AWS endpoint is a closed loopback port, so
// nothing could be deployed anyway.
func TestBareDeployRefuses(t *testing.T) {
	t.Parallel()
	cdk := pinnedCLI(t, "cdk")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cdk, "deploy", "--require-approval", "never", "--no-notices", "-o", filepath.Join(t.TempDir(), "cdk.out"))
	cmd.Dir = ".."
	cmd.Env = append(withoutEnv(os.Environ(), envConfig, "AWS_"),
		"CDK_HOME="+t.TempDir(), "AWS_ENDPOINT_URL=http://127.0.0.1:9", "AWS_REGION=us-east-1",
		"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("bare cdk deploy succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), errNoConfig.Error()) {
		t.Errorf("bare cdk deploy failed without saying a configuration must be named:\n%s", out)
	}
}

// changesctl builds changesctl and runs it with args, in this process's
// environment (with the test PostgreSQL's PG_DSN where none is set), and
// returns what it printed; it fails the test when changesctl fails.
func changesctl(ctx context.Context, t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	ctl := filepath.Join(t.TempDir(), "changesctl")
	if b, err := exec.CommandContext(ctx, "go", "build", "-o", ctl, "../cmd/changesctl").CombinedOutput(); err != nil {
		t.Fatalf("build changesctl: %v\n%s", err, b)
	}
	run := exec.CommandContext(ctx, ctl, args...)
	run.Env = os.Environ()
	if os.Getenv("PG_DSN") == "" {
		run.Env = append(run.Env, "PG_DSN="+testenv.PostgresDSN(t))
	}
	var out, errOut bytes.Buffer
	run.Stdout, run.Stderr = &out, &errOut
	if err := run.Run(); err != nil {
		t.Fatalf("changesctl %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out.String(), tail(errOut.String(), 60))
	}
	return out.String(), errOut.String()
}

// pinnedCLI returns the path of a binary of the CDK CLI pinned in
// infra/package.json.
func pinnedCLI(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("node_modules", ".bin", name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is not installed: run make cdk-deps (npm ci --prefix infra)", p)
	}
	return p
}

// cdkRun runs the CDK CLI (or cdklocal) from the repository root.
type cdkRun struct {
	bin string
	env []string
	dir string
}

func (c cdkRun) run(ctx context.Context, t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, c.bin, args...)
	cmd.Dir, cmd.Env = c.dir, c.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(c.bin), strings.Join(args, " "), err, tail(string(out), 60))
	}
}

// cdkEnv is the environment of cdklocal: the local AWS endpoint for
// everything the CLI calls, S3 included (CloudFormation reads the template
// and assets from its own S3), and a CDK_HOME of its own so that no cached
// account of another emulator is used.
func cdkEnv(t *testing.T) []string {
	endpoint := os.Getenv("AWS_ENDPOINT_URL")
	env := withoutEnv(os.Environ(), envConfig, "AWS_ENDPOINT_URL", "CDK_HOME")
	return append(env, "AWS_ENDPOINT_URL="+endpoint, "AWS_ENDPOINT_URL_S3="+endpoint, "CDK_HOME="+t.TempDir(),
		"CDK_DISABLE_VERSION_CHECK=1")
}

// withoutEnv drops the variables named, or starting with a prefix ending in _.
func withoutEnv(env []string, drop ...string) []string {
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, d := range drop {
			if k == d || (strings.HasSuffix(d, "_") && strings.HasPrefix(k, d)) || strings.HasPrefix(k, d+"_") {
				keep = false
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}

// requireOneDynamoDB makes sure that the table the stack's CloudFormation
// creates is the one the hosted handlers use: a table created through the
// DynamoDB of AWS_ENDPOINT_URL (where CloudFormation runs) must be visible
// through the SDK's DynamoDB endpoint (AWS_ENDPOINT_URL_DYNAMODB, when set).
// It fails fast where CloudFormation could not create a table at all.
func requireOneDynamoDB(ctx context.Context, t *testing.T, awsCfg aws.Config) {
	t.Helper()
	viaCFN := dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(os.Getenv("AWS_ENDPOINT_URL")) })
	sdk := dynamodb.NewFromConfig(awsCfg)
	name := "cwl-probe-" + randomHex(t, 4)
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := viaCFN.CreateTable(pctx, &dynamodb.CreateTableInput{
		TableName:            &name,
		KeySchema:            []ddbtypes.KeySchemaElement{{AttributeName: aws.String("k"), KeyType: ddbtypes.KeyTypeHash}},
		AttributeDefinitions: []ddbtypes.AttributeDefinition{{AttributeName: aws.String("k"), AttributeType: ddbtypes.ScalarAttributeTypeS}},
		BillingMode:          ddbtypes.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatalf("create a table through the DynamoDB of %s, where CloudFormation creates the stack's table: %v "+
			"(LocalStack's DynamoDB must front DynamoDB Local; see localstack/README.md)", os.Getenv("AWS_ENDPOINT_URL"), err)
	}
	defer viaCFN.DeleteTable(context.WithoutCancel(ctx), &dynamodb.DeleteTableInput{TableName: &name})
	if _, err := sdk.DescribeTable(pctx, &dynamodb.DescribeTableInput{TableName: &name}); err != nil {
		t.Fatalf("a table created through %s is not visible through the SDK's DynamoDB endpoint %s: %v "+
			"(the deployed table would not be the one the hosted handlers use)", os.Getenv("AWS_ENDPOINT_URL"), os.Getenv("AWS_ENDPOINT_URL_DYNAMODB"), err)
	}
}

// requireLoopback refuses to deploy anywhere but on this machine.
func requireLoopback(t *testing.T) {
	t.Helper()
	u, err := url.Parse(os.Getenv("AWS_ENDPOINT_URL"))
	if err != nil {
		t.Fatalf("parse AWS_ENDPOINT_URL: %v", err)
	}
	ip := net.ParseIP(u.Hostname())
	if u.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
		t.Fatalf("AWS_ENDPOINT_URL=%s is not a local emulator; this test deploys only to loopback addresses", u)
	}
}

// cfnS3 is an S3 client for the S3 of the endpoint that ran CloudFormation,
// where the stack created its buckets (AWS_ENDPOINT_URL_S3 may send the
// SDK's S3 calls elsewhere).
func cfnS3(awsCfg aws.Config) *s3.Client {
	return s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		o.BaseEndpoint = aws.String(os.Getenv("AWS_ENDPOINT_URL"))
		o.UsePathStyle = true
	})
}

func readTemplate(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var tmpl map[string]any
	if err := json.Unmarshal(b, &tmpl); err != nil {
		t.Fatal(err)
	}
	return tmpl
}

// readTemplates reads, from the cloud assembly in outdir, the template of
// the stack named prefix and those of its nested stacks, by the logical id
// of their AWS::CloudFormation::Stack resource (whose aws:asset:path
// metadata names the file).
func readTemplates(t *testing.T, outdir, prefix string) (map[string]any, map[string]map[string]any) {
	t.Helper()
	tmpl := readTemplate(t, filepath.Join(outdir, prefix+".template.json"))
	nested := map[string]map[string]any{}
	for id, r := range templateResources(tmpl, "AWS::CloudFormation::Stack") {
		md, _ := r["Metadata"].(map[string]any)
		file, _ := md["aws:asset:path"].(string)
		if file == "" {
			t.Fatalf("nested stack %s names no template file: %s", id, compact(md))
		}
		nested[id] = readTemplate(t, filepath.Join(outdir, file))
	}
	return tmpl, nested
}

// mergedTemplate is one template holding the resources of tmpl and of its
// nested stacks.
func mergedTemplate(tmpl map[string]any, nested map[string]map[string]any) map[string]any {
	res := map[string]any{}
	for _, m := range append([]map[string]any{tmpl}, mapValues(nested)...) {
		for id, r := range m["Resources"].(map[string]any) {
			res[id] = r
		}
	}
	return map[string]any{"Resources": res}
}

func mapValues[V any](m map[string]V) []V {
	out := make([]V, 0, len(m))
	for _, k := range sortedKeys(m) {
		out = append(out, m[k])
	}
	return out
}

// stackResources returns the resources of the deployed stack by logical id.
func stackResources(ctx context.Context, t *testing.T, cfn *cloudformation.Client, stack string) map[string]cfntypes.StackResourceSummary {
	t.Helper()
	out := map[string]cfntypes.StackResourceSummary{}
	p := cloudformation.NewListStackResourcesPaginator(cfn, &cloudformation.ListStackResourcesInput{StackName: &stack})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatalf("list resources of stack %s: %v", stack, err)
		}
		for _, r := range page.StackResourceSummaries {
			out[aws.ToString(r.LogicalResourceId)] = r
		}
	}
	return out
}

// templateResources returns the template's resources of type typ by logical id.
func templateResources(tmpl map[string]any, typ string) map[string]map[string]any {
	out := map[string]map[string]any{}
	for id, r := range tmpl["Resources"].(map[string]any) {
		if r := r.(map[string]any); r["Type"] == typ {
			out[id] = r
		}
	}
	return out
}

// checkStackResources requires every resource of the template and of its
// nested stacks' templates to be CREATE_COMPLETE in the deployed stack and
// its nested stacks, and none of the compute the variant leaves out.
func checkStackResources(ctx context.Context, t *testing.T, cfn *cloudformation.Client, name string, tmpl map[string]any, nested map[string]map[string]any) {
	t.Helper()
	deployed := stackResources(ctx, t, cfn, name)
	types := map[string]int{}
	check := func(stack string, tmpl map[string]any, deployed map[string]cfntypes.StackResourceSummary) {
		for id, r := range tmpl["Resources"].(map[string]any) {
			typ := r.(map[string]any)["Type"].(string)
			types[typ]++
			if st := deployed[id].ResourceStatus; st != cfntypes.ResourceStatusCreateComplete {
				t.Errorf("%s: %s (%s): %q, want CREATE_COMPLETE", stack, id, typ, st)
			}
			switch typ {
			case "AWS::Lambda::Function", "AWS::Lambda::EventSourceMapping", "AWS::Events::Rule", "AWS::Lambda::Permission", "AWS::Lambda::EventInvokeConfig":
				t.Errorf("the local variant has %s %s", typ, id)
			}
		}
	}
	check(name, tmpl, deployed)
	for id, nt := range nested {
		physical := aws.ToString(deployed[id].PhysicalResourceId)
		if physical == "" {
			t.Errorf("nested stack %s was not created", id)
			continue
		}
		check(id, nt, stackResources(ctx, t, cfn, physical))
	}
	for _, typ := range []string{"AWS::DynamoDB::Table", "AWS::SQS::Queue", "AWS::SQS::QueuePolicy", "AWS::S3::Bucket", "AWS::S3::BucketPolicy",
		"AWS::SecretsManager::Secret", "AWS::CloudWatch::Alarm", "AWS::SNS::Topic", "AWS::SNS::TopicPolicy", "AWS::KMS::Key",
		"AWS::IAM::Role", "AWS::IAM::Policy", "AWS::Logs::LogGroup", "AWS::CloudWatch::Dashboard", "AWS::CloudFormation::Stack"} {
		if types[typ] == 0 {
			t.Errorf("the local variant's templates have no %s", typ)
		}
	}
	var list []string
	for typ, n := range types {
		list = append(list, fmt.Sprintf("%s×%d", typ, n))
	}
	sort.Strings(list)
	t.Logf("created: %s", strings.Join(list, ", "))
}

func checkDeployedQueues(ctx context.Context, t *testing.T, c *sqs.Client, cfg *config.File) {
	t.Helper()
	attrs := func(name string) map[string]string {
		u, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
		if err != nil {
			t.Errorf("queue %s: %v", name, err)
			return nil
		}
		out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: u.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameAll}})
		if err != nil {
			t.Errorf("queue %s attributes: %v", name, err)
			return nil
		}
		return out.Attributes
	}
	visibility := strconv.Itoa(int(visibilityFactor * cfg.Stack.WriterTimeout.D().Seconds()))
	for _, j := range cfg.Jobs {
		for _, o := range j.Outputs {
			where := j.ID + "/" + o.ID
			q, d := attrs(cfg.QueueName(j, o)), attrs(cfg.DLQName(j, o))
			if q == nil || d == nil {
				continue
			}
			for name, a := range map[string]map[string]string{"queue": q, "dlq": d} {
				if (a["FifoQueue"] == "true") != o.FIFO() {
					t.Errorf("%s %s FifoQueue = %q, want %v", where, name, a["FifoQueue"], o.FIFO())
				}
				if a["MaximumMessageSize"] != strconv.Itoa(maxMessageBytes) || a["SqsManagedSseEnabled"] != "true" || a["MessageRetentionPeriod"] != strconv.Itoa(queueRetentionDays*86400) {
					t.Errorf("%s %s: size %s, SSE %s, retention %s", where, name, a["MaximumMessageSize"], a["SqsManagedSseEnabled"], a["MessageRetentionPeriod"])
				}
				if p := a["Policy"]; !deniesPlainHTTP(p) {
					t.Errorf("%s %s policy does not refuse plain HTTP: %s", where, name, p)
				}
			}
			if q["VisibilityTimeout"] != visibility {
				t.Errorf("%s VisibilityTimeout = %s, want %s", where, q["VisibilityTimeout"], visibility)
			}
			if o.FIFO() && (q["ContentBasedDeduplication"] != "false" || q["DeduplicationScope"] != "messageGroup" || q["FifoThroughputLimit"] != "perMessageGroupId") {
				t.Errorf("%s FIFO attributes: %v", where, q)
			}
			var redrive struct {
				Target string `json:"deadLetterTargetArn"`
				Max    any    `json:"maxReceiveCount"`
			}
			if err := json.Unmarshal([]byte(q["RedrivePolicy"]), &redrive); err != nil || redrive.Target != d["QueueArn"] || fmt.Sprint(redrive.Max) != strconv.Itoa(o.QueueMaxReceiveCount()) {
				t.Errorf("%s RedrivePolicy = %s (%v), want %s after %d receives", where, q["RedrivePolicy"], err, d["QueueArn"], o.QueueMaxReceiveCount())
			}
			var allow struct {
				Permission string   `json:"redrivePermission"`
				Sources    []string `json:"sourceQueueArns"`
			}
			if err := json.Unmarshal([]byte(d["RedriveAllowPolicy"]), &allow); err != nil || allow.Permission != "byQueue" || len(allow.Sources) != 1 || allow.Sources[0] != q["QueueArn"] {
				t.Errorf("%s DLQ RedriveAllowPolicy = %s (%v), want byQueue from %s", where, d["RedriveAllowPolicy"], err, q["QueueArn"])
			}
		}
	}
}

func checkDeployedTable(ctx context.Context, t *testing.T, c *dynamodb.Client, cfg *config.File) {
	t.Helper()
	out, err := c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(cfg.TableName())})
	if err != nil {
		t.Errorf("describe table %s (through the SDK's DynamoDB endpoint): %v", cfg.TableName(), err)
		return
	}
	tbl := out.Table
	if len(tbl.KeySchema) != 1 || aws.ToString(tbl.KeySchema[0].AttributeName) != stateKey || tbl.KeySchema[0].KeyType != ddbtypes.KeyTypeHash {
		t.Errorf("table key schema = %+v", tbl.KeySchema)
	}
	if tbl.BillingModeSummary == nil || tbl.BillingModeSummary.BillingMode != ddbtypes.BillingModePayPerRequest {
		t.Errorf("table billing = %+v", tbl.BillingModeSummary)
	}
}

func checkDeployedBucket(ctx context.Context, t *testing.T, c *s3.Client, bucket string) {
	t.Helper()
	p, err := c.GetBucketPolicy(ctx, &s3.GetBucketPolicyInput{Bucket: &bucket})
	if err != nil {
		t.Errorf("bucket %s policy: %v", bucket, err)
	} else if pol := aws.ToString(p.Policy); !deniesPlainHTTP(pol) {
		t.Errorf("bucket %s policy does not refuse plain HTTP: %s", bucket, pol)
	}
	pab, err := c.GetPublicAccessBlock(ctx, &s3.GetPublicAccessBlockInput{Bucket: &bucket})
	if err != nil {
		t.Errorf("bucket %s public access block: %v", bucket, err)
	} else if b := pab.PublicAccessBlockConfiguration; !aws.ToBool(b.BlockPublicAcls) || !aws.ToBool(b.BlockPublicPolicy) || !aws.ToBool(b.IgnorePublicAcls) || !aws.ToBool(b.RestrictPublicBuckets) {
		t.Errorf("bucket %s public access block = %+v", bucket, b)
	}
	enc, err := c.GetBucketEncryption(ctx, &s3.GetBucketEncryptionInput{Bucket: &bucket})
	if err != nil || len(enc.ServerSideEncryptionConfiguration.Rules) == 0 ||
		enc.ServerSideEncryptionConfiguration.Rules[0].ApplyServerSideEncryptionByDefault.SSEAlgorithm != "AES256" {
		t.Errorf("bucket %s encryption = %+v (%v), want SSE-S3", bucket, enc, err)
	}
}

func checkDeployedSecrets(ctx context.Context, t *testing.T, c *secretsmanager.Client, prefix string, tmpl map[string]any) {
	t.Helper()
	secrets := templateResources(tmpl, "AWS::SecretsManager::Secret")
	if len(secrets) == 0 {
		t.Error("no secrets in the template")
	}
	for id, r := range secrets {
		name, _ := props(r)["Name"].(string)
		out, err := c.DescribeSecret(ctx, &secretsmanager.DescribeSecretInput{SecretId: &name})
		if err != nil || !strings.HasPrefix(name, prefix+"/") {
			t.Errorf("secret %s (%s): %v", name, id, err)
			continue
		}
		if aws.ToString(out.Name) != name {
			t.Errorf("secret %s described as %s", name, aws.ToString(out.Name))
		}
	}
}

func checkDeployedAlarms(ctx context.Context, t *testing.T, cw *cloudwatch.Client, sc *sns.Client, prefix string, tmpl map[string]any) {
	t.Helper()
	want := map[string]bool{}
	for _, r := range templateResources(tmpl, "AWS::CloudWatch::Alarm") {
		want[props(r)["AlarmName"].(string)] = true
	}
	got := map[string][]string{}
	p := cloudwatch.NewDescribeAlarmsPaginator(cw, &cloudwatch.DescribeAlarmsInput{AlarmNamePrefix: aws.String(prefix + "-")})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatalf("describe alarms: %v", err)
		}
		for _, a := range page.MetricAlarms {
			got[aws.ToString(a.AlarmName)] = a.AlarmActions
		}
	}
	var topic string
	for name := range want {
		actions, ok := got[name]
		if !ok {
			t.Errorf("alarm %s was not created", name)
			continue
		}
		if len(actions) != 1 || !strings.HasSuffix(actions[0], ":"+prefix+"-alarms") {
			t.Errorf("alarm %s actions %v, want the alarm topic", name, actions)
			continue
		}
		topic = actions[0]
	}
	if len(got) != len(want) {
		t.Errorf("%d alarms named %s-*, the template has %d", len(got), prefix, len(want))
	}
	if topic == "" {
		return
	}
	attrs, err := sc.GetTopicAttributes(ctx, &sns.GetTopicAttributesInput{TopicArn: &topic})
	if err != nil {
		t.Errorf("alarm topic %s: %v", topic, err)
		return
	}
	if pol := attrs.Attributes["Policy"]; !strings.Contains(pol, "cloudwatch.amazonaws.com") || !deniesPlainHTTP(pol) {
		t.Errorf("alarm topic policy lets CloudWatch publish over TLS only? %s", pol)
	}
	if attrs.Attributes["KmsMasterKeyId"] == "" {
		t.Errorf("alarm topic %s is not encrypted", topic)
	}
}

func checkNoFunctions(ctx context.Context, t *testing.T, c *lambda.Client, cfg *config.File) {
	t.Helper()
	for _, j := range cfg.Jobs {
		for _, fn := range []string{fnPoller, fnWriter, fnVerify} {
			name := functionName(cfg, j, fn)
			_, err := c.GetFunction(ctx, &lambda.GetFunctionInput{FunctionName: &name})
			var nf *lambdatypes.ResourceNotFoundException
			if !errors.As(err, &nf) {
				t.Errorf("get function %s: %v, want ResourceNotFoundException (the local variant has no functions)", name, err)
			}
		}
	}
}

// deniesPlainHTTP reports whether a resource policy has a statement that
// denies every request made without TLS (aws:SecureTransport false).
func deniesPlainHTTP(policy string) bool {
	var doc struct {
		Statement []struct {
			Effect    string
			Condition map[string]map[string]any
		}
	}
	if err := json.Unmarshal([]byte(policy), &doc); err != nil {
		return false
	}
	for _, st := range doc.Statement {
		if st.Effect == "Deny" && fmt.Sprint(st.Condition["Bool"]["aws:SecureTransport"]) == "false" {
			return true
		}
	}
	return false
}

// putDocs writes n new documents into the source database, doc-<first>
// onwards.
func putDocs(ctx context.Context, t *testing.T, db string, first, n int) {
	t.Helper()
	var docs []map[string]any
	for i := first; i < first+n; i++ {
		docs = append(docs, map[string]any{"_id": fmt.Sprintf("doc-%03d", i), "n": i})
	}
	body, _ := json.Marshal(map[string]any{"docs": docs})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, db+"/_bulk_docs", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("bulk docs: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		t.Fatalf("bulk docs: status %d", resp.StatusCode)
	}
}

func waitStack(ctx context.Context, cfn *cloudformation.Client, name string) (cfntypes.StackStatus, string) {
	for {
		out, err := cfn.DescribeStacks(ctx, &cloudformation.DescribeStacksInput{StackName: &name})
		if err != nil {
			return "", err.Error()
		}
		st := out.Stacks[0]
		if !strings.HasSuffix(string(st.StackStatus), "_IN_PROGRESS") {
			return st.StackStatus, aws.ToString(st.StackStatusReason)
		}
		select {
		case <-ctx.Done():
			return st.StackStatus, "gave up waiting: " + ctx.Err().Error()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func stackEvents(ctx context.Context, cfn *cloudformation.Client, name string) string {
	out, err := cfn.DescribeStackEvents(ctx, &cloudformation.DescribeStackEventsInput{StackName: &name})
	if err != nil {
		return "describe stack events: " + err.Error()
	}
	var b strings.Builder
	for _, e := range out.StackEvents {
		fmt.Fprintf(&b, "%s %s %s %s\n", aws.ToString(e.LogicalResourceId), aws.ToString(e.ResourceType), e.ResourceStatus, aws.ToString(e.ResourceStatusReason))
	}
	return b.String()
}

// deleteStack deletes the test stack and waits for it to go.
func deleteStack(ctx context.Context, t *testing.T, cfn *cloudformation.Client, name string) {
	if _, err := cfn.DeleteStack(ctx, &cloudformation.DeleteStackInput{StackName: &name}); err != nil {
		t.Logf("delete stack %s: %v", name, err)
		return
	}
	if status, reason := waitStack(ctx, cfn, name); status != "" && status != cfntypes.StackStatusDeleteComplete {
		t.Logf("delete stack %s: %s %s", name, status, reason)
	}
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
