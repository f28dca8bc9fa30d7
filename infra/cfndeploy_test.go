package main

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	cfntypes "github.com/aws/aws-sdk-go-v2/service/cloudformation/types"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// emulatorSupported are the resource types of the stack that moto's
// CloudFormation creates. The others of the template (alarms, queue, bucket
// and topic policies, secrets, the e-mail subscription, the Lambda async
// invoke configuration, CDK metadata) it accepts and skips: the stack still
// reaches CREATE_COMPLETE, but they exist only in the template. The test
// reports both lists.
var emulatorSupported = []string{
	"AWS::CloudWatch::Dashboard",
	"AWS::DynamoDB::Table",
	"AWS::Events::Rule",
	"AWS::IAM::Policy",
	"AWS::IAM::Role",
	"AWS::KMS::Key",
	"AWS::Lambda::EventSourceMapping",
	"AWS::Lambda::Function",
	"AWS::Lambda::Permission",
	"AWS::Logs::LogGroup",
	"AWS::S3::Bucket",
	"AWS::SNS::Topic",
	"AWS::SQS::Queue",
}

// TestDeployToEmulator creates the synthesized stack through the
// CloudFormation API of the local AWS emulator (moto, or LocalStack where
// Docker runs), as `cdk deploy` would after `cdk bootstrap`: the function
// code is zipped and uploaded to the bootstrap bucket under the key the
// template names, and the template itself goes through S3 because it is
// larger than CreateStack accepts inline. It then reads back what the
// emulator created.
//
// The emulator is shared with other tests, so the copy of the template that
// is deployed differs from the synthesized one in three ways: every name
// prefix "cwtest" becomes a prefix unique to this run; the bootstrap version
// parameter and rule go (nothing bootstrapped the emulator's SSM); and the
// Retain policies become Delete, so deleting the stack leaves nothing behind.
func TestDeployToEmulator(t *testing.T) {
	syn := synthesized(t)
	awsCfg := testenv.AWS(t)
	requireLoopback(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	id, err := sts.NewFromConfig(awsCfg).GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if err != nil {
		t.Fatalf("get caller identity: %v", err)
	}
	account, region := aws.ToString(id.Account), awsCfg.Region
	s3c := s3.NewFromConfig(awsCfg, awsconf.S3Options)
	cfn := cloudformation.NewFromConfig(awsCfg)

	bucket, keys, madeBucket, err := publishAssets(ctx, s3c, syn.outdir, account, region)
	// Leave the emulator as it was: a bootstrap bucket made here would stop
	// a later `cdklocal bootstrap` ("bucket already exists").
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, k := range keys {
			s3c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: aws.String(k)})
		}
		if madeBucket {
			s3c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: &bucket})
		}
	})
	if err != nil {
		t.Fatalf("publish assets: %v", err)
	}
	prefix := "cwd" + randomHex(t, 4)
	body, tmpl, err := emulatorTemplate(syn.templatePath, syn.cfg.Stack.Prefix, prefix)
	if err != nil {
		t.Fatalf("prepare template: %v", err)
	}
	templateKey := "templates/" + prefix + ".json"
	keys = append(keys, templateKey)
	if _, err := s3c.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &templateKey, Body: bytes.NewReader(body)}); err != nil {
		t.Fatalf("upload template: %v", err)
	}
	// The URL form the CDK CLI passes; the emulator reads the object from its own S3.
	templateURL := "https://s3." + region + ".amazonaws.com/" + bucket + "/" + templateKey

	stackName := prefix
	_, err = cfn.CreateStack(ctx, &cloudformation.CreateStackInput{
		StackName:    &stackName,
		TemplateURL:  &templateURL,
		Capabilities: []cfntypes.Capability{cfntypes.CapabilityCapabilityIam, cfntypes.CapabilityCapabilityNamedIam},
	})
	if err != nil {
		t.Fatalf("create stack: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		deleteStack(ctx, t, awsCfg, stackName, prefix+"-state")
	})
	status, reason := waitStack(ctx, cfn, stackName)
	if status != cfntypes.StackStatusCreateComplete {
		t.Fatalf("stack %s: %s %s\n%s", stackName, status, reason, stackEvents(ctx, cfn, stackName))
	}

	created, skipped := stackResources(ctx, t, cfn, stackName, tmpl)
	t.Logf("emulator created: %s", strings.Join(created, ", "))
	t.Logf("emulator skipped (not supported by its CloudFormation): %s", strings.Join(skipped, ", "))
	for _, typ := range emulatorSupported {
		if !contains(created, typ) {
			t.Errorf("the emulator did not create the stack's %s resources", typ)
		}
	}

	renamed := *syn.cfg
	renamed.Stack.Prefix = prefix
	checkEmulatorQueues(ctx, t, sqs.NewFromConfig(awsCfg), &renamed)
	checkEmulatorTable(ctx, t, dynamodb.NewFromConfig(awsCfg), &renamed)
	checkEmulatorFunctions(ctx, t, lambda.NewFromConfig(awsCfg), &renamed)
	checkEmulatorSchedules(ctx, t, eventbridge.NewFromConfig(awsCfg), &renamed)
}

// requireLoopback refuses to create stacks anywhere but on this machine.
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

// publishAssets does what the CDK CLI's asset publishing does for file
// assets: it zips each asset directory (or takes each file) named by the
// assets manifest and puts it where the template expects it. It returns the
// bootstrap bucket, the keys it wrote there, and whether it had to create the
// bucket.
func publishAssets(ctx context.Context, s3c *s3.Client, outdir, account, region string) (bucket string, keys []string, created bool, err error) {
	manifests, err := filepath.Glob(filepath.Join(outdir, "*.assets.json"))
	if err != nil || len(manifests) != 1 {
		return "", nil, false, fmt.Errorf("want one assets manifest in %s, found %v (%v)", outdir, manifests, err)
	}
	b, err := os.ReadFile(manifests[0])
	if err != nil {
		return "", nil, false, err
	}
	var manifest struct {
		Files map[string]struct {
			Source struct {
				Path      string `json:"path"`
				Packaging string `json:"packaging"`
			} `json:"source"`
			Destinations map[string]struct {
				BucketName string `json:"bucketName"`
				ObjectKey  string `json:"objectKey"`
			} `json:"destinations"`
		} `json:"files"`
	}
	if err := json.Unmarshal(b, &manifest); err != nil {
		return "", nil, false, fmt.Errorf("decode %s: %w", manifests[0], err)
	}
	expand := strings.NewReplacer("${AWS::AccountId}", account, "${AWS::Region}", region, "${AWS::Partition}", "aws")
	for hash, f := range manifest.Files {
		src := filepath.Join(outdir, f.Source.Path)
		var data []byte
		switch f.Source.Packaging {
		case "zip":
			data, err = zipDir(src)
		case "file":
			data, err = os.ReadFile(src)
		default:
			err = fmt.Errorf("packaging %q", f.Source.Packaging)
		}
		if err != nil {
			return bucket, keys, created, fmt.Errorf("asset %s: %w", hash, err)
		}
		for _, d := range f.Destinations {
			if b := expand.Replace(d.BucketName); b != bucket {
				if bucket != "" {
					return bucket, keys, created, fmt.Errorf("assets go to two buckets, %s and %s", bucket, b)
				}
				bucket = b
				if created, err = ensureBucket(ctx, s3c, bucket); err != nil {
					return bucket, keys, created, err
				}
			}
			key := d.ObjectKey
			if _, err := s3c.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: bytes.NewReader(data)}); err != nil {
				return bucket, keys, created, fmt.Errorf("upload asset %s: %w", hash, err)
			}
			keys = append(keys, key)
		}
	}
	if bucket == "" {
		return "", nil, false, errors.New("the assets manifest names no destination")
	}
	return bucket, keys, created, nil
}

// ensureBucket creates bucket unless it exists, reporting whether it did.
func ensureBucket(ctx context.Context, s3c *s3.Client, bucket string) (bool, error) {
	if _, err := s3c.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &bucket}); err == nil {
		return false, nil
	}
	_, err := s3c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &bucket})
	var owned *s3types.BucketAlreadyOwnedByYou
	if errors.As(err, &owned) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("create bucket %s: %w", bucket, err)
	}
	return true, nil
}

// zipDir zips the files of dir (Lambda code: flat, modes kept).
func zipDir(dir string) ([]byte, error) {
	var buf bytes.Buffer
	w := zip.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		h, err := zip.FileInfoHeader(info)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h.Name = filepath.ToSlash(rel)
		h.Method = zip.Deflate
		f, err := w.CreateHeader(h)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		_, err = f.Write(b)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// emulatorTemplate returns the copy of the template the test deploys (see
// TestDeployToEmulator), encoded and decoded.
func emulatorTemplate(path, fromPrefix, toPrefix string) ([]byte, map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	b = bytes.ReplaceAll(b, []byte(fromPrefix), []byte(toPrefix))
	var tmpl map[string]any
	if err := json.Unmarshal(b, &tmpl); err != nil {
		return nil, nil, err
	}
	if params, ok := tmpl["Parameters"].(map[string]any); ok {
		delete(params, "BootstrapVersion")
		if len(params) == 0 {
			delete(tmpl, "Parameters")
		}
	}
	delete(tmpl, "Rules")
	for _, r := range tmpl["Resources"].(map[string]any) {
		r := r.(map[string]any)
		for _, k := range []string{"DeletionPolicy", "UpdateReplacePolicy"} {
			if r[k] == "Retain" {
				r[k] = "Delete"
			}
		}
	}
	out, err := json.Marshal(tmpl)
	return out, tmpl, err
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

// stackResources compares what the stack lists with the template: the types
// the emulator created, and those of the template it skipped.
func stackResources(ctx context.Context, t *testing.T, cfn *cloudformation.Client, name string, tmpl map[string]any) (created, skipped []string) {
	t.Helper()
	listed := map[string]bool{}
	p := cloudformation.NewListStackResourcesPaginator(cfn, &cloudformation.ListStackResourcesInput{StackName: &name})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatalf("list stack resources: %v", err)
		}
		for _, r := range page.StackResourceSummaries {
			if r.ResourceStatus == cfntypes.ResourceStatusCreateComplete {
				listed[aws.ToString(r.LogicalResourceId)] = true
			}
		}
	}
	createdSet, skippedSet := map[string]int{}, map[string]int{}
	for id, r := range tmpl["Resources"].(map[string]any) {
		typ := r.(map[string]any)["Type"].(string)
		if listed[id] {
			createdSet[typ]++
		} else {
			skippedSet[typ]++
		}
	}
	return sortedKeys(createdSet), sortedKeys(skippedSet)
}

func checkEmulatorQueues(ctx context.Context, t *testing.T, c *sqs.Client, cfg *config.File) {
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
	visibility := strconv.Itoa(int(6 * cfg.Stack.WriterTimeout.D().Seconds()))
	for _, j := range cfg.Jobs {
		for _, o := range j.Outputs {
			q, d := attrs(cfg.QueueName(j, o)), attrs(cfg.DLQName(j, o))
			if q == nil || d == nil {
				continue
			}
			where := j.ID + "/" + o.ID
			fifo := strconv.FormatBool(o.FIFO())
			for name, a := range map[string]map[string]string{"queue": q, "dlq": d} {
				if got := a["FifoQueue"]; got != fifo && !(got == "" && !o.FIFO()) {
					t.Errorf("%s %s FifoQueue = %q, want %s", where, name, got, fifo)
				}
				if a["MaximumMessageSize"] != "1048576" || a["SqsManagedSseEnabled"] != "true" || a["MessageRetentionPeriod"] != "1209600" {
					t.Errorf("%s %s attributes = %v", where, name, a)
				}
			}
			if q["VisibilityTimeout"] != visibility {
				t.Errorf("%s VisibilityTimeout = %s, want %s", where, q["VisibilityTimeout"], visibility)
			}
			if o.FIFO() && (q["ContentBasedDeduplication"] != "false" || q["FifoThroughputLimit"] != "perMessageGroupId" || q["DeduplicationScope"] != "messageGroup") {
				t.Errorf("%s FIFO attributes = %v", where, q)
			}
			var redrive struct {
				Target string `json:"deadLetterTargetArn"`
				Max    any    `json:"maxReceiveCount"`
			}
			if err := json.Unmarshal([]byte(q["RedrivePolicy"]), &redrive); err != nil {
				t.Errorf("%s RedrivePolicy %q: %v", where, q["RedrivePolicy"], err)
				continue
			}
			if redrive.Target != d["QueueArn"] || fmt.Sprint(redrive.Max) != strconv.Itoa(o.MaxReceiveCount) {
				t.Errorf("%s RedrivePolicy = %s, want %s after %d receives", where, q["RedrivePolicy"], d["QueueArn"], o.MaxReceiveCount)
			}
			// moto 5.2 knows no RedriveAllowPolicy attribute (GetQueueAttributes
			// answers InvalidAttributeName): only the template test checks it.
		}
	}
}

func checkEmulatorTable(ctx context.Context, t *testing.T, c *dynamodb.Client, cfg *config.File) {
	t.Helper()
	out, err := c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(cfg.TableName())})
	if err != nil {
		t.Errorf("describe table: %v", err)
		return
	}
	tbl := out.Table
	if len(tbl.KeySchema) != 1 || aws.ToString(tbl.KeySchema[0].AttributeName) != stateKey || tbl.KeySchema[0].KeyType != "HASH" {
		t.Errorf("table key schema = %+v", tbl.KeySchema)
	}
	if tbl.BillingModeSummary == nil || tbl.BillingModeSummary.BillingMode != "PAY_PER_REQUEST" {
		t.Errorf("table billing = %+v", tbl.BillingModeSummary)
	}
	if !aws.ToBool(tbl.DeletionProtectionEnabled) {
		t.Errorf("table deletion protection is off")
	}
}

func checkEmulatorFunctions(ctx context.Context, t *testing.T, c *lambda.Client, cfg *config.File) {
	t.Helper()
	for _, name := range []string{fnPoller, fnWriter} {
		fn := cfg.Stack.Prefix + "-" + name
		out, err := c.GetFunction(ctx, &lambda.GetFunctionInput{FunctionName: &fn})
		if err != nil {
			t.Errorf("get function %s: %v", fn, err)
			continue
		}
		conf := out.Configuration
		vars := map[string]string{}
		if conf.Environment != nil {
			vars = conf.Environment.Variables
		}
		if conf.Runtime != "provided.al2023" || aws.ToString(conf.Handler) != "bootstrap" ||
			vars[envConfigFile] != "/var/task/jobs.json" || vars[envSecretPrefix] != cfg.Stack.Prefix+"/" || vars[envBucket] == "" {
			t.Errorf("function %s: runtime %s handler %s environment %v", fn, conf.Runtime, aws.ToString(conf.Handler), vars)
		}
	}
	poller := cfg.Stack.Prefix + "-" + fnPoller
	conc, err := c.GetFunctionConcurrency(ctx, &lambda.GetFunctionConcurrencyInput{FunctionName: &poller})
	if err != nil || aws.ToInt32(conc.ReservedConcurrentExecutions) != int32(2*len(cfg.Jobs)) {
		t.Errorf("poller reserved concurrency = %v (%v), want %d", conc, err, 2*len(cfg.Jobs))
	}

	writer := cfg.Stack.Prefix + "-" + fnWriter
	out, err := c.ListEventSourceMappings(ctx, &lambda.ListEventSourceMappingsInput{FunctionName: &writer})
	if err != nil {
		t.Errorf("list event source mappings: %v", err)
		return
	}
	byQueue := map[string]bool{}
	for _, m := range out.EventSourceMappings {
		arn := aws.ToString(m.EventSourceArn)
		queue := arn[strings.LastIndex(arn, ":")+1:]
		byQueue[queue] = true
		report := len(m.FunctionResponseTypes) == 1 && m.FunctionResponseTypes[0] == "ReportBatchItemFailures"
		if !report || m.ScalingConfig == nil || aws.ToInt32(m.ScalingConfig.MaximumConcurrency) < 2 {
			t.Errorf("event source mapping on %s: response types %v scaling %+v", queue, m.FunctionResponseTypes, m.ScalingConfig)
		}
	}
	for _, j := range cfg.Jobs {
		for _, o := range j.Outputs {
			if !byQueue[cfg.QueueName(j, o)] {
				t.Errorf("no event source mapping on %s", cfg.QueueName(j, o))
			}
		}
	}
}

func checkEmulatorSchedules(ctx context.Context, t *testing.T, c *eventbridge.Client, cfg *config.File) {
	t.Helper()
	for _, j := range cfg.Jobs {
		rule := cfg.Stack.Prefix + "-" + j.ID + "-schedule"
		r, err := c.DescribeRule(ctx, &eventbridge.DescribeRuleInput{Name: &rule})
		if err != nil {
			t.Errorf("describe rule %s: %v", rule, err)
			continue
		}
		minutes := int(j.Schedule.D().Minutes())
		want := fmt.Sprintf("rate(%d minutes)", minutes)
		if minutes == 1 {
			want = "rate(1 minute)"
		}
		if aws.ToString(r.ScheduleExpression) != want {
			t.Errorf("rule %s schedule = %s, want %s", rule, aws.ToString(r.ScheduleExpression), want)
		}
		targets, err := c.ListTargetsByRule(ctx, &eventbridge.ListTargetsByRuleInput{Rule: &rule})
		if err != nil || len(targets.Targets) != 1 {
			t.Errorf("rule %s targets = %v (%v)", rule, targets, err)
			continue
		}
		tg := targets.Targets[0]
		if !strings.HasSuffix(aws.ToString(tg.Arn), ":function:"+cfg.Stack.Prefix+"-"+fnPoller) || aws.ToString(tg.Input) != `{"job":"`+j.ID+`"}` {
			t.Errorf("rule %s target %s input %s", rule, aws.ToString(tg.Arn), aws.ToString(tg.Input))
		}
	}
}

// deleteStack deletes the test stack. The table's deletion protection is
// turned off first, as an operator tearing down would have to.
func deleteStack(ctx context.Context, t *testing.T, awsCfg aws.Config, name, table string) {
	ddb := dynamodb.NewFromConfig(awsCfg)
	ddb.UpdateTable(ctx, &dynamodb.UpdateTableInput{TableName: &table, DeletionProtectionEnabled: aws.Bool(false)})
	cfn := cloudformation.NewFromConfig(awsCfg)
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
