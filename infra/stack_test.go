package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/metrics"
)

func TestQueues(t *testing.T) {
	syn := synthesized(t)
	cfg := syn.cfg
	visibilityMin := 6 * cfg.Stack.WriterTimeout.D().Seconds()
	n := 0
	for _, j := range cfg.Jobs {
		for _, o := range j.Outputs {
			n++
			t.Run(j.ID+"/"+o.ID, func(t *testing.T) {
				queueID, queue := syn.resource(t, "AWS::SQS::Queue", "QueueName", cfg.QueueName(j, o))
				dlqID, dlq := syn.resource(t, "AWS::SQS::Queue", "QueueName", cfg.DLQName(j, o))
				q, d := props(queue), props(dlq)

				for name, p := range map[string]map[string]any{"queue": q, "dlq": d} {
					if got := p["FifoQueue"] == true; got != o.FIFO() {
						t.Errorf("%s FifoQueue = %v, want %v", name, p["FifoQueue"], o.FIFO())
					}
					if got := p["MaximumMessageSize"]; got != float64(1048576) {
						t.Errorf("%s MaximumMessageSize = %v, want 1048576", name, got)
					}
					if got := p["SqsManagedSseEnabled"]; got != true {
						t.Errorf("%s SqsManagedSseEnabled = %v, want true", name, got)
					}
					if got := p["MessageRetentionPeriod"]; got != float64(14*24*3600) {
						t.Errorf("%s MessageRetentionPeriod = %v, want 14 days", name, got)
					}
					if o.FIFO() {
						if p["DeduplicationScope"] != "messageGroup" || p["FifoThroughputLimit"] != "perMessageGroupId" {
							t.Errorf("%s is not high-throughput FIFO: %s", name, compact(p))
						}
					}
				}
				if o.FIFO() && q["ContentBasedDeduplication"] != false {
					t.Errorf("work queue ContentBasedDeduplication = %v, want false (the poller sends explicit ids)", q["ContentBasedDeduplication"])
				}
				if !o.FIFO() && q["ContentBasedDeduplication"] != nil {
					t.Errorf("standard queue has ContentBasedDeduplication %v", q["ContentBasedDeduplication"])
				}
				if vt, _ := q["VisibilityTimeout"].(float64); vt < visibilityMin {
					t.Errorf("VisibilityTimeout = %v, want >= %v (6 x writer timeout)", q["VisibilityTimeout"], visibilityMin)
				}

				redrive, _ := q["RedrivePolicy"].(map[string]any)
				if refID(redrive["deadLetterTargetArn"]) != dlqID {
					t.Errorf("redrive target = %s, want the DLQ %s", compact(redrive["deadLetterTargetArn"]), dlqID)
				}
				if redrive["maxReceiveCount"] != float64(o.QueueMaxReceiveCount()) {
					t.Errorf("maxReceiveCount = %v, want %d", redrive["maxReceiveCount"], o.QueueMaxReceiveCount())
				}
				if o.Halts() && redrive["maxReceiveCount"] != float64(1000) {
					t.Errorf("halting output: maxReceiveCount = %v, want SQS's maximum 1000", redrive["maxReceiveCount"])
				}
				allow, _ := d["RedriveAllowPolicy"].(map[string]any)
				if allow["redrivePermission"] != "byQueue" {
					t.Errorf("DLQ redrivePermission = %v, want byQueue", allow["redrivePermission"])
				}
				sources, _ := allow["sourceQueueArns"].([]any)
				if len(sources) != 1 || !strings.HasSuffix(compact(sources[0]), ":"+cfg.QueueName(j, o)+`"]]}`) {
					t.Errorf("DLQ sourceQueueArns = %s, want the ARN of %s", compact(sources), cfg.QueueName(j, o))
				}
				if _, ok := q["RedriveAllowPolicy"]; ok {
					t.Errorf("work queue has a redrive-allow policy")
				}
				_ = queueID
			})
		}
	}
	assert(t, "queue count", func() {
		syn.template.ResourceCountIs(jsii.String("AWS::SQS::Queue"), jsii.Number(float64(2*n)))
	})
}

// TestTLSOnly checks every queue, bucket and topic has a policy that denies
// requests not made over TLS.
func TestTLSOnly(t *testing.T) {
	syn := synthesized(t)
	denied := map[string]bool{}
	for _, c := range []struct{ policyType, targetKey string }{
		{"AWS::SQS::QueuePolicy", "Queues"},
		{"AWS::S3::BucketPolicy", "Bucket"},
		{"AWS::SNS::TopicPolicy", "Topics"},
	} {
		for _, r := range syn.resources(c.policyType) {
			p := props(r)
			doc, _ := p["PolicyDocument"].(map[string]any)
			tlsOnly := false
			for _, st := range statements(doc) {
				cond := compact(st["Condition"])
				principal := compact(st["Principal"])
				if st["Effect"] == "Deny" && strings.Contains(cond, `"aws:SecureTransport":"false"`) && (principal == `{"AWS":"*"}` || principal == `"*"`) {
					tlsOnly = true
				}
			}
			if !tlsOnly {
				continue
			}
			targets := p[c.targetKey]
			if list, ok := targets.([]any); ok {
				for _, e := range list {
					denied[refID(e)] = true
				}
			} else {
				denied[refID(targets)] = true
			}
		}
	}
	for _, typ := range []string{"AWS::SQS::Queue", "AWS::S3::Bucket", "AWS::SNS::Topic"} {
		for id := range syn.resources(typ) {
			if !denied[id] {
				t.Errorf("%s %s has no TLS-only policy", typ, id)
			}
		}
	}
}

func TestEventSourceMappings(t *testing.T) {
	syn := synthesized(t)
	byQueue := map[string]map[string]any{}
	for _, r := range syn.resources("AWS::Lambda::EventSourceMapping") {
		p := props(r)
		byQueue[refID(p["EventSourceArn"])] = p
	}
	for _, j := range syn.cfg.Jobs {
		writerID, _ := syn.resource(t, "AWS::Lambda::Function", "FunctionName", functionName(syn.cfg, j, fnWriter))
		for _, o := range j.Outputs {
			queueID, _ := syn.resource(t, "AWS::SQS::Queue", "QueueName", syn.cfg.QueueName(j, o))
			p, ok := byQueue[queueID]
			if !ok {
				t.Errorf("%s/%s: no event source mapping on its queue", j.ID, o.ID)
				continue
			}
			if refID(p["FunctionName"]) != writerID {
				t.Errorf("%s/%s: event source mapping for %s, want the job's writer", j.ID, o.ID, compact(p["FunctionName"]))
			}
			if got := strs(p["FunctionResponseTypes"]); !contains(got, "ReportBatchItemFailures") {
				t.Errorf("%s/%s: FunctionResponseTypes = %v", j.ID, o.ID, got)
			}
			if p["BatchSize"] != float64(o.BatchSize) {
				t.Errorf("%s/%s: BatchSize = %v, want %d", j.ID, o.ID, p["BatchSize"], o.BatchSize)
			}
			scaling, _ := p["ScalingConfig"].(map[string]any)
			if want := float64(max(2, o.MaxConcurrency)); scaling["MaximumConcurrency"] != want {
				t.Errorf("%s/%s: MaximumConcurrency = %v, want %v", j.ID, o.ID, scaling["MaximumConcurrency"], want)
			}
			window, hasWindow := p["MaximumBatchingWindowInSeconds"]
			if o.FIFO() && hasWindow {
				t.Errorf("%s/%s: FIFO queue has a batching window %v", j.ID, o.ID, window)
			}
			if !o.FIFO() && window != float64(1) {
				t.Errorf("%s/%s: MaximumBatchingWindowInSeconds = %v, want 1", j.ID, o.ID, window)
			}
		}
	}
}

func TestSchedules(t *testing.T) {
	syn := synthesized(t)
	want := map[string]string{"orders": "rate(1 minute)", "catalog": "rate(2 minutes)"}
	for _, j := range syn.cfg.Jobs {
		pollerID, _ := syn.resource(t, "AWS::Lambda::Function", "FunctionName", functionName(syn.cfg, j, fnPoller))
		_, rule := syn.resource(t, "AWS::Events::Rule", "Name", "cwtest-"+j.ID+"-schedule")
		p := props(rule)
		if p["ScheduleExpression"] != want[j.ID] {
			t.Errorf("%s: ScheduleExpression = %v, want %s", j.ID, p["ScheduleExpression"], want[j.ID])
		}
		if p["State"] != "ENABLED" {
			t.Errorf("%s: State = %v", j.ID, p["State"])
		}
		targets, _ := p["Targets"].([]any)
		if len(targets) != 1 {
			t.Fatalf("%s: %d targets", j.ID, len(targets))
		}
		target := targets[0].(map[string]any)
		if refID(target["Arn"]) != pollerID {
			t.Errorf("%s: target %s, want the job's poller", j.ID, compact(target["Arn"]))
		}
		if target["Input"] != fmt.Sprintf(`{"job":"%s"}`, j.ID) {
			t.Errorf("%s: Input = %v", j.ID, target["Input"])
		}
	}
	// Each job of the test configuration has a FIFO output, so its writer
	// has a probe rule too (TestProbeSchedules).
	assert(t, "the poller and the writer may be invoked by each rule", func() {
		syn.template.ResourcePropertiesCountIs(jsii.String("AWS::Lambda::Permission"), &map[string]any{
			"Action":    "lambda:InvokeFunction",
			"Principal": "events.amazonaws.com",
		}, jsii.Number(float64(2*len(syn.cfg.Jobs))))
	})
}

// TestProbeSchedules: a job with an output on a FIFO queue has a rule that
// invokes its writer every minute with {"probe": {"job": "<id>"}}, enabled
// (it queues nothing), never retried nor delivered late.
func TestProbeSchedules(t *testing.T) {
	syn := synthesized(t)
	for _, j := range syn.cfg.Jobs {
		writerID, _ := syn.resource(t, "AWS::Lambda::Function", "FunctionName", functionName(syn.cfg, j, fnWriter))
		_, rule := syn.resource(t, "AWS::Events::Rule", "Name", probeName(syn.cfg, j))
		p := props(rule)
		if p["ScheduleExpression"] != "rate(1 minute)" || p["State"] != "ENABLED" {
			t.Errorf("%s: %v %v, want ENABLED rate(1 minute)", j.ID, p["State"], p["ScheduleExpression"])
		}
		targets, _ := p["Targets"].([]any)
		if len(targets) != 1 {
			t.Fatalf("%s: %d targets", j.ID, len(targets))
		}
		target := targets[0].(map[string]any)
		if refID(target["Arn"]) != writerID {
			t.Errorf("%s: target %s, want the job's writer", j.ID, compact(target["Arn"]))
		}
		if want := fmt.Sprintf(`{"probe":{"job":"%s"}}`, j.ID); target["Input"] != want {
			t.Errorf("%s: Input = %v, want %s", j.ID, target["Input"], want)
		}
		retry, _ := target["RetryPolicy"].(map[string]any)
		if retry["MaximumRetryAttempts"] != float64(0) || retry["MaximumEventAgeInSeconds"] != float64(60) {
			t.Errorf("%s: RetryPolicy = %s, want no retry and at most 60 s of age", j.ID, compact(retry))
		}
	}
}

func TestFunctions(t *testing.T) {
	syn := synthesized(t)
	cfg := syn.cfg
	for _, j := range cfg.Jobs {
		for _, c := range []struct {
			name     string
			timeout  float64
			memory   float64
			reserved any
		}{
			// The active invocation, its standby, and one a failover starts.
			{fnPoller, cfg.Stack.PollerTimeout.D().Seconds(), float64(cfg.Stack.PollerMemoryMB), float64(3)},
			{fnWriter, cfg.Stack.WriterTimeout.D().Seconds(), float64(cfg.Stack.WriterMemoryMB), nil},
			// Invoked by changesctl verify --remote, for at most Lambda's
			// longest timeout.
			{fnVerify, 900, 1024, nil},
		} {
			t.Run(j.ID+"/"+c.name, func(t *testing.T) {
				name := functionName(cfg, j, c.name)
				_, fn := syn.resource(t, "AWS::Lambda::Function", "FunctionName", name)
				p := props(fn)
				if p["Runtime"] != "provided.al2023" || p["Handler"] != "bootstrap" || compact(p["Architectures"]) != `["arm64"]` {
					t.Errorf("runtime %v handler %v architectures %v", p["Runtime"], p["Handler"], p["Architectures"])
				}
				if p["Timeout"] != c.timeout {
					t.Errorf("Timeout = %v, want %v", p["Timeout"], c.timeout)
				}
				if p["MemorySize"] != c.memory {
					t.Errorf("MemorySize = %v, want %v", p["MemorySize"], c.memory)
				}
				if p["ReservedConcurrentExecutions"] != c.reserved {
					t.Errorf("ReservedConcurrentExecutions = %v, want %v", p["ReservedConcurrentExecutions"], c.reserved)
				}
				env, _ := p["Environment"].(map[string]any)
				vars, _ := env["Variables"].(map[string]any)
				if vars[envJobConfig] == nil || vars[envConfigFile] != nil || vars[envSecretPrefix] != "cwtest/" || vars[envAWSCalls] != nil {
					t.Errorf("environment = %s", compact(vars))
				}
				// The stack bucket's generated name comes from the shared
				// stack, as a parameter of the job's nested stack.
				if b := compact(vars[envBucket]); !strings.Contains(b, `{"Ref":"`) || !strings.Contains(b, "DataBucket") {
					t.Errorf("%s = %s, want the stack bucket", envBucket, b)
				}
				logging, _ := p["LoggingConfig"].(map[string]any)
				group, ok := syn.resources("AWS::Logs::LogGroup")[refID(logging["LogGroup"])]
				if !ok {
					t.Fatalf("LoggingConfig = %s, want the function's log group", compact(logging))
				}
				if logging["LogFormat"] != "JSON" {
					t.Errorf("LoggingConfig.LogFormat = %v, want JSON", logging["LogFormat"])
				}
				if lp := props(group); lp["RetentionInDays"] != float64(cfg.Stack.LogRetentionDays) || lp["LogGroupName"] != "/aws/lambda/"+name {
					t.Errorf("log group = %s", compact(lp))
				}
				vpc, _ := p["VpcConfig"].(map[string]any)
				if compact(vpc["SubnetIds"]) != compact(cfg.Stack.VPC.SubnetIDs) || compact(vpc["SecurityGroupIds"]) != compact(cfg.Stack.VPC.SecurityGroupIDs) {
					t.Errorf("VpcConfig = %s", compact(vpc))
				}
			})
		}
	}
	assert(t, "log groups", func() {
		syn.template.ResourceCountIs(jsii.String("AWS::Logs::LogGroup"), jsii.Number(float64(3*len(cfg.Jobs))))
	})
}

// TestFunctionCode checks the functions' code and configuration: the
// functions of one kind run the same code asset, the built bootstrap alone,
// and each gets the configuration of its job alone (jobConfig) in its
// environment, so that a change to another job leaves it unchanged.
func TestFunctionCode(t *testing.T) {
	syn := synthesized(t)
	codeOf := map[string]string{} // by kind
	for _, j := range syn.cfg.Jobs {
		want, err := jobConfig(syn.raw, j.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, kind := range functionKinds {
			name := functionName(syn.cfg, j, kind)
			p := functionProps(t, syn, j.ID, kind)
			code := compact(p["Code"])
			if other, ok := codeOf[kind]; ok && code != other {
				t.Errorf("%s: code %s, want the %s code every job's %s runs, %s", name, code, kind, kind, other)
			}
			codeOf[kind] = code
			files := assetFiles(t, syn, p)
			if len(files) != 1 || files[0] != "bootstrap" {
				t.Errorf("%s: its code holds %v, want the bootstrap alone", name, files)
			}
			vars := environment(p)
			if got := vars[envJobConfig]; got != compactJSON(t, want) {
				t.Errorf("%s: %s = %v, want job %s of %s, compact:\n%s", name, envJobConfig, got, j.ID, testConfig, want)
			}
			if f, err := config.Parse([]byte(fmt.Sprint(vars[envJobConfig]))); err != nil || len(f.Jobs) != 1 || f.Jobs[0].ID != j.ID {
				t.Errorf("%s: %s is not a valid configuration of job %s alone: %v", name, envJobConfig, j.ID, err)
			}
		}
	}
	if len(codeOf) != len(functionKinds) {
		t.Errorf("code of %d function kinds, want %d", len(codeOf), len(functionKinds))
	}
}

// TestFunctionCodeOfItsOwn checks a job whose configuration does not fit in
// its functions' environment (Lambda takes 4 KB): its functions get code of
// their own, the bootstrap with the job's configuration as jobs.json, named
// by CHANGES_CONFIG_FILE; the other job's functions still share their
// kind's code.
func TestFunctionCodeOfItsOwn(t *testing.T) {
	synthesized(t) // one synthesis at a time through the jsii runtime
	var columns []string
	for i := range 100 {
		columns = append(columns, fmt.Sprintf(`{"name": "c%02d", "path": "c%02d", "type": "text"}`, i, i))
	}
	doc := `{
  "stack": {"prefix": "cwwide"},
  "jobs": [
    {"id": "narrow", "source": {"type": "couchdb", "url": "https://couch.example.com/narrow"},
     "outputs": [{"id": "archive", "type": "s3", "s3": {"prefix": "narrow/"}}]},
    {"id": "wide", "source": {"type": "couchdb", "url": "https://couch.example.com/wide"},
     "outputs": [{"id": "pg", "type": "postgres", "postgres": {"dsn": {"env": "PG_DSN"},
       "mapping": {"tables": [{"name": "wide", "columns": [` + strings.Join(columns, ", ") + `]}]}}}]}
  ]
}`
	syn, err := synthesizeDoc(t, doc)
	if err != nil {
		t.Fatal(err)
	}
	wide, err := jobConfig(syn.raw, "wide")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(compactJSON(t, wide)); n <= maxEnvironmentBytes {
		t.Fatalf("job wide's configuration is %d bytes compact: the test needs more than %d", n, maxEnvironmentBytes)
	}
	for _, kind := range functionKinds {
		narrow := functionProps(t, syn, "narrow", kind)
		p := functionProps(t, syn, "wide", kind)
		name := p["FunctionName"]
		if compact(p["Code"]) == compact(narrow["Code"]) {
			t.Errorf("%s: the %s code every job shares, want code of its own", name, kind)
		}
		vars := environment(p)
		if vars[envConfigFile] != bundledConfigName || vars[envJobConfig] != nil {
			t.Errorf("%s: environment %s, want %s=%s and no %s", name, compact(vars), envConfigFile, bundledConfigName, envJobConfig)
		}
		if environment(narrow)[envJobConfig] == nil {
			t.Errorf("%s: no %s", narrow["FunctionName"], envJobConfig)
		}
		files := assetFiles(t, syn, p)
		if strings.Join(files, " ") != "bootstrap "+bundledConfigName {
			t.Errorf("%s: its code holds %v, want the bootstrap and %s", name, files, bundledConfigName)
			continue
		}
		got, err := os.ReadFile(filepath.Join(assetDir(t, syn, p), bundledConfigName))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(wide) {
			t.Errorf("%s: %s is not job wide's configuration:\n%s", name, bundledConfigName, got)
		}
	}
}

// environment returns a function's environment variables.
func environment(p map[string]any) map[string]any {
	env, _ := p["Environment"].(map[string]any)
	vars, _ := env["Variables"].(map[string]any)
	return vars
}

// assetDir returns the directory in the cloud assembly of a function's code.
func assetDir(t *testing.T, syn *synthesis, p map[string]any) string {
	t.Helper()
	code, _ := p["Code"].(map[string]any)
	key, _ := code["S3Key"].(string)
	if !strings.HasSuffix(key, ".zip") {
		t.Fatalf("%v: code %s is not a zip asset", p["FunctionName"], compact(code))
	}
	return filepath.Join(syn.outdir, "asset."+strings.TrimSuffix(key, ".zip"))
}

// assetFiles lists the files of a function's code, checking that its
// bootstrap is executable.
func assetFiles(t *testing.T, syn *synthesis, p map[string]any) []string {
	t.Helper()
	dir := assetDir(t, syn, p)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("%v: %v", p["FunctionName"], err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if st, err := os.Stat(filepath.Join(dir, "bootstrap")); err != nil || st.Mode().Perm()&0o111 == 0 {
		t.Errorf("%v: bootstrap missing or not executable: %v", p["FunctionName"], err)
	}
	return names
}

// compactJSON returns doc without insignificant space.
func compactJSON(t *testing.T, doc []byte) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, doc); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// functionProps returns the properties of job's function of kind.
func functionProps(t *testing.T, syn *synthesis, job, kind string) map[string]any {
	t.Helper()
	_, fn := syn.resource(t, "AWS::Lambda::Function", "FunctionName", functionName(syn.cfg, syn.cfg.Job(job), kind))
	return props(fn)
}

func TestStateTable(t *testing.T) {
	syn := synthesized(t)
	assert(t, "state table", func() {
		syn.template.HasResource(jsii.String("AWS::DynamoDB::Table"), &map[string]any{
			"DeletionPolicy":      "RetainExceptOnCreate",
			"UpdateReplacePolicy": "Retain",
			"Properties": &map[string]any{
				"TableName":                        syn.cfg.TableName(),
				"KeySchema":                        []any{map[string]any{"AttributeName": "job_id", "KeyType": "HASH"}},
				"AttributeDefinitions":             []any{map[string]any{"AttributeName": "job_id", "AttributeType": "S"}},
				"BillingMode":                      "PAY_PER_REQUEST",
				"PointInTimeRecoverySpecification": map[string]any{"PointInTimeRecoveryEnabled": true},
				"SSESpecification":                 map[string]any{"SSEEnabled": true},
				"DeletionProtectionEnabled":        false,
			},
		})
	})
	assert(t, "one table", func() {
		syn.template.ResourceCountIs(jsii.String("AWS::DynamoDB::Table"), jsii.Number(1))
	})
}

// TestRetainExceptOnCreate: with stack.retain (the default) the stateful
// resources (the table, the buckets, the secrets, the log groups) outlive
// a deleted stack, a removed job and a replacement, but not the creation
// that made them: when a first deploy fails and rolls back (Lambda refusing
// the pollers' reserved concurrency on an account of low limits, say), the
// rollback deletes them, and the retry does not find their fixed names
// taken. Nothing is plain Retain, and the table has no deletion protection,
// which would make that rollback fail.
func TestRetainExceptOnCreate(t *testing.T) {
	syn := synthesized(t)
	stateful := map[string]int{"AWS::DynamoDB::Table": 0, "AWS::S3::Bucket": 0, "AWS::SecretsManager::Secret": 0, "AWS::Logs::LogGroup": 0}
	for id, r := range syn.tmpl["Resources"].(map[string]any) {
		r := r.(map[string]any)
		typ, _ := r["Type"].(string)
		n, ok := stateful[typ]
		switch {
		case ok && (r["DeletionPolicy"] != "RetainExceptOnCreate" || r["UpdateReplacePolicy"] != "Retain"):
			t.Errorf("%s %s: DeletionPolicy %v, UpdateReplacePolicy %v; want RetainExceptOnCreate, Retain", typ, id, r["DeletionPolicy"], r["UpdateReplacePolicy"])
		case r["DeletionPolicy"] == "Retain":
			t.Errorf("%s %s is kept by a failed creation's rollback too (DeletionPolicy Retain)", typ, id)
		}
		if ok {
			stateful[typ] = n + 1
		}
		if typ == "AWS::DynamoDB::Table" && props(r)["DeletionProtectionEnabled"] == true {
			t.Errorf("table %s has deletion protection: the rollback of a failed first deploy cannot delete it", id)
		}
	}
	for typ, n := range stateful {
		if n == 0 {
			t.Errorf("no %s in the stack", typ)
		}
	}
}

func TestBucket(t *testing.T) {
	syn := synthesized(t)
	blocked := map[string]any{"BlockPublicAcls": true, "BlockPublicPolicy": true, "IgnorePublicAcls": true, "RestrictPublicBuckets": true}
	sse := map[string]any{"ServerSideEncryptionConfiguration": []any{
		map[string]any{"ServerSideEncryptionByDefault": map[string]any{"SSEAlgorithm": "AES256"}},
	}}
	assert(t, "data bucket", func() {
		syn.template.HasResource(jsii.String("AWS::S3::Bucket"), &map[string]any{
			"DeletionPolicy": "RetainExceptOnCreate",
			"Properties": &map[string]any{
				"PublicAccessBlockConfiguration": blocked,
				"BucketEncryption":               sse,
				"VersioningConfiguration":        assertions.Match_Absent(),
				"LoggingConfiguration":           assertions.Match_ObjectLike(&map[string]any{"LogFilePrefix": "data-bucket/"}),
				"LifecycleConfiguration": map[string]any{"Rules": assertions.Match_ArrayWith(&[]any{
					map[string]any{"Id": "expire-claim-checks", "Prefix": config.ClaimCheckPrefix, "ExpirationInDays": claimCheckExpiryDays, "Status": "Enabled"},
				})},
			},
		})
	})
	assert(t, "every bucket blocks public access and is encrypted", func() {
		syn.template.AllResourcesProperties(jsii.String("AWS::S3::Bucket"), &map[string]any{
			"PublicAccessBlockConfiguration": blocked,
			"BucketEncryption":               sse,
		})
	})
	for id, r := range syn.resources("AWS::S3::Bucket") {
		if _, ok := props(r)["BucketName"]; ok {
			t.Errorf("bucket %s has an explicit name; created buckets get generated names", id)
		}
	}
}

func TestSecrets(t *testing.T) {
	syn := synthesized(t)
	for _, name := range []string{"CRM_TOKEN", "CATALOG_SOURCE_TOKEN"} {
		_, r := syn.resource(t, "AWS::SecretsManager::Secret", "Name", "cwtest/"+name)
		p := props(r)
		if _, ok := p["GenerateSecretString"]; !ok {
			t.Errorf("secret %s has no generated placeholder", name)
		}
		if _, ok := p["SecretString"]; ok {
			t.Errorf("secret %s has a value in the template", name)
		}
	}
	assert(t, "one secret per distinct env reference", func() {
		syn.template.ResourceCountIs(jsii.String("AWS::SecretsManager::Secret"), jsii.Number(2))
	})

	// Each job's functions read their own job's secrets only; a secret of
	// an env reference is named, in the shared stack.
	read := func(doc string, secret string) bool {
		for _, st := range statementsOf(doc) {
			if contains(strs(st["Action"]), "secretsmanager:GetSecretValue") && strings.Contains(compact(st["Resource"]), secret) {
				return true
			}
		}
		return false
	}
	const (
		catalogToken = ":secret:cwtest/CATALOG_SOURCE_TOKEN-??????"
		crmToken     = ":secret:cwtest/CRM_TOKEN-??????"
		sgwPassword  = ":secret:orders/sgw-password-??????"
		pgDSN        = "arn:aws:secretsmanager:us-east-1:123456789012:secret:orders/pg-dsn-AbCdEf"
	)
	all := []string{catalogToken, crmToken, sgwPassword, pgDSN}
	for _, c := range []struct {
		fn   string
		want []string
	}{
		{"cwtest-orders-poller", []string{sgwPassword}},
		{"cwtest-orders-writer", []string{crmToken, pgDSN}},
		{"cwtest-catalog-poller", []string{catalogToken}},
		{"cwtest-catalog-writer", []string{crmToken}},
	} {
		doc := rolePolicy(t, syn, c.fn)
		for _, secret := range all {
			if got, want := read(doc, secret), contains(c.want, secret); got != want {
				t.Errorf("%s reads %s = %v, want %v", c.fn, secret, got, want)
			}
		}
	}
}

// TestGrants checks each function's policy statement by statement: exactly
// these actions, on these resources, all of them the function's own job's.
func TestGrants(t *testing.T) {
	syn := synthesized(t)
	const table = ":table/cwtest-state"
	leading := func(keys ...string) string {
		return compact(map[string]any{"ForAllValues:StringLike": map[string]any{"dynamodb:LeadingKeys": keys}})
	}
	for _, j := range syn.cfg.Jobs {
		ownQueue := func(q map[string]any) bool {
			return strings.HasPrefix(q["QueueName"].(string), "cwtest-"+j.ID+"-")
		}
		poller := statementsOf(rolePolicy(t, syn, functionName(syn.cfg, j, fnPoller)))
		wantActions(t, j.ID+" poller", poller, "dynamodb:", []string{"dynamodb:GetItem", "dynamodb:UpdateItem"})
		for _, st := range poller {
			if !hasPrefixAny(strs(st["Action"])[0], "dynamodb:") {
				continue
			}
			if !strings.Contains(compact(st["Resource"]), table) {
				t.Errorf("%s poller dynamodb resource = %s, want the table only", j.ID, compact(st["Resource"]))
			}
			// The job's item (lease and checkpoint), its quarantine entries
			// and the claim on its DLQs' archive sweep.
			if want := leading(j.ID, "quarantine/"+j.ID+"/*", "dlq-archive/"+j.ID); compact(st["Condition"]) != want {
				t.Errorf("%s poller dynamodb condition = %s, want %s", j.ID, compact(st["Condition"]), want)
			}
		}
		wantActions(t, j.ID+" poller", poller, "sqs:", []string{"sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:ReceiveMessage", "sqs:SendMessage"})
		wantResources(t, syn, j.ID+" poller", poller, "sqs:SendMessage", func(q map[string]any) bool {
			return ownQueue(q) && !strings.Contains(q["QueueName"].(string), "-dlq")
		})
		// It archives its job's DLQs: receives and deletes there only.
		for _, action := range []string{"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"} {
			wantResources(t, syn, j.ID+" poller", poller, action, func(q map[string]any) bool {
				return ownQueue(q) && strings.Contains(q["QueueName"].(string), "-dlq")
			})
		}
		// After a failover it starts a standby: it invokes its own
		// function, and no other.
		wantActions(t, j.ID+" poller", poller, "lambda:", []string{"lambda:InvokeFunction"})
		for _, st := range poller {
			if contains(strs(st["Action"]), "lambda:InvokeFunction") {
				if res := compact(st["Resource"]); !strings.HasSuffix(res, `:function:`+functionName(syn.cfg, j, fnPoller)+`"]]}`) {
					t.Errorf("%s poller invokes %s, want its own function only", j.ID, res)
				}
			}
		}

		writer := statementsOf(rolePolicy(t, syn, functionName(syn.cfg, j, fnWriter)))
		halting := false
		for _, o := range j.Outputs {
			halting = halting || o.Halts()
		}
		// Every writer records, reads and clears its job's outage items
		// (an output that is down); a job with a halting output (orders/crm)
		// its halt items too; no other item of the table.
		keys := []string{"outage/" + j.ID + "/*"}
		if halting {
			keys = append(keys, "halt/"+j.ID+"/*")
		}
		wantActions(t, j.ID+" writer", writer, "dynamodb:", []string{"dynamodb:DeleteItem", "dynamodb:GetItem", "dynamodb:UpdateItem"})
		for _, st := range writer {
			if !hasPrefixAny(strs(st["Action"])[0], "dynamodb:") {
				continue
			}
			if !strings.Contains(compact(st["Resource"]), table) {
				t.Errorf("%s writer dynamodb resource = %s, want the table only", j.ID, compact(st["Resource"]))
			}
			if want := leading(keys...); compact(st["Condition"]) != want {
				t.Errorf("%s writer dynamodb condition = %s, want %s", j.ID, compact(st["Condition"]), want)
			}
		}
		wantActions(t, j.ID+" writer", writer, "sqs:", []string{"sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:ReceiveMessage", "sqs:SendMessage"})
		// It turns its own event source mappings off and on (each job here
		// has a FIFO output): it lists them (no resource) and updates only
		// its own function's.
		wantActions(t, j.ID+" writer", writer, "lambda:", []string{"lambda:ListEventSourceMappings", "lambda:UpdateEventSourceMapping"})
		for _, st := range writer {
			switch a := strs(st["Action"]); {
			case contains(a, "lambda:UpdateEventSourceMapping"):
				if res := compact(st["Resource"]); !strings.HasSuffix(res, `:event-source-mapping:*"]]}`) {
					t.Errorf("%s writer updates mappings %s, want event-source-mapping:*", j.ID, res)
				}
				if cond := compact(st["Condition"]); !strings.Contains(cond, `"lambda:FunctionArn"`) || !strings.Contains(cond, ":function:"+functionName(syn.cfg, j, fnWriter)+`"`) {
					t.Errorf("%s writer updates mappings under %s, want lambda:FunctionArn its own function", j.ID, cond)
				}
			case contains(a, "lambda:ListEventSourceMappings") && len(a) != 1:
				t.Errorf("%s writer lists mappings with %v on Resource \"*\": want that action alone", j.ID, a)
			}
		}
		// The writer moves failures to the DLQs and sends a message of a
		// standard queue it holds back (an output that is down or asks to
		// slow down) to its work queue again, with a fresh receive count.
		wantResources(t, syn, j.ID+" writer", writer, "sqs:SendMessage", ownQueue)
		wantResources(t, syn, j.ID+" writer", writer, "sqs:ReceiveMessage", func(q map[string]any) bool {
			return ownQueue(q) && !strings.Contains(q["QueueName"].(string), "-dlq")
		})
	}

	// Object grants are confined to the job's claim-check prefix, its DLQ
	// archive prefix, its attachments prefix and its outputs' prefixes.
	for _, c := range []struct {
		fn      string
		actions []string
		allowed []string
		want    []string
		list    []string
	}{
		{"cwtest-orders-poller", []string{"s3:AbortMultipartUpload", "s3:GetObject", "s3:ListBucket", "s3:PutObject"},
			[]string{"/claim-check/orders/cwtest/*", "/claim-check/orders/*", "/attachments/cwtest/orders/*", "/dlq-archive/cwtest/orders/*"},
			[]string{"/attachments/cwtest/orders/*", "/dlq-archive/cwtest/orders/*"},
			[]string{`"s3:prefix":["attachments/cwtest/orders/*"]`, `"s3:prefix":["dlq-archive/cwtest/orders/*"]`}},
		{"cwtest-catalog-poller", []string{"s3:GetObject", "s3:ListBucket", "s3:PutObject"},
			[]string{"/claim-check/catalog/cwtest/*", "/claim-check/catalog/*", "/dlq-archive/cwtest/catalog/*"}, []string{"/dlq-archive/cwtest/catalog/*"},
			[]string{`"s3:prefix":["dlq-archive/cwtest/catalog/*"]`}},
		{"cwtest-orders-writer", []string{"s3:DeleteObject", "s3:GetObject", "s3:ListBucket", "s3:PutObject"},
			[]string{"/claim-check/orders/*", "/archive/orders/*"}, []string{"/archive/orders/*"}, []string{`"s3:prefix":["archive/orders/*"]`}},
		{"cwtest-catalog-writer", []string{"s3:DeleteObject", "s3:GetObject", "s3:ListBucket", "s3:PutObject"},
			[]string{"/claim-check/catalog/*", "partner-exports/catalog/*"}, []string{"arn:\",{\"Ref\":\"AWS::Partition\"},\":s3:::partner-exports/catalog/*"}, []string{`"s3:prefix":["catalog/*"]`}},
	} {
		sts := statementsOf(rolePolicy(t, syn, c.fn))
		wantActions(t, c.fn, sts, "s3:", c.actions)
		var objects []string
		for _, st := range sts {
			for _, a := range strs(st["Action"]) {
				if a == "s3:GetObject" || a == "s3:PutObject" || a == "s3:DeleteObject" || a == "s3:AbortMultipartUpload" {
					objects = append(objects, compact(st["Resource"]))
				}
			}
			if contains(strs(st["Action"]), "s3:ListBucket") && !hasAny(compact(st["Condition"]), c.list...) {
				t.Errorf("%s lists the bucket beyond its prefix: %s", c.fn, compact(st))
			}
		}
		for _, res := range objects {
			if !hasAny(res, c.allowed...) {
				t.Errorf("%s object grant on %s", c.fn, res)
			}
		}
		for _, w := range c.want {
			if !strings.Contains(strings.Join(objects, " "), w) {
				t.Errorf("%s has no object grant on %s: %v", c.fn, w, objects)
			}
		}
	}
}

func hasAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// TestClaimCheckGrants: the poller may write claim checks only under the
// claim-check prefix of its own job and stack, and the writer read them only
// under its job's (which holds its stack's and those a release before 1.0.0
// wrote, without the stack prefix), in the stack bucket: never another
// job's, so a message naming another job's claim check is refused by IAM
// too.
func TestClaimCheckGrants(t *testing.T) {
	syn := synthesized(t)
	claimRes := regexp.MustCompile(`/claim-check/[^"]*`)
	for _, j := range syn.cfg.Jobs {
		for _, c := range []struct{ fn, action string }{
			{functionName(syn.cfg, j, fnPoller), "s3:PutObject"},
			{functionName(syn.cfg, j, fnWriter), "s3:GetObject"},
		} {
			got := map[string]bool{}
			for _, st := range statementsOf(rolePolicy(t, syn, c.fn)) {
				if !contains(strs(st["Action"]), c.action) {
					continue
				}
				res := st["Resource"]
				list, ok := res.([]any)
				if !ok {
					list = []any{res}
				}
				for _, r := range list {
					js := compact(r)
					for _, m := range claimRes.FindAllString(js, -1) {
						got[m] = true
						if !strings.Contains(js, `DataBucket`) {
							t.Errorf("%s %s on %s: not the stack bucket", c.fn, c.action, js)
						}
					}
				}
			}
			want := []string{"/claim-check/" + j.ID + "/" + syn.cfg.Stack.Prefix + "/*"}
			if c.action == "s3:GetObject" {
				want = []string{"/claim-check/" + j.ID + "/*"}
			}
			if d := cmp.Diff(want, sortedKeys(got)); d != "" {
				t.Errorf("%s %s claim-check resources (-want +got):\n%s", c.fn, c.action, d)
			}
		}
	}
}

func TestAlarms(t *testing.T) {
	syn := synthesized(t)
	topicID, topic := syn.resource(t, "AWS::SNS::Topic", "TopicName", "cwtest-alarms")
	// The jobs' stacks name the topic: its ARN, built from the name.
	topicARN := compact([]any{"arn:", map[string]any{"Ref": "AWS::Partition"}, ":sns:", map[string]any{"Ref": "AWS::Region"}, ":",
		map[string]any{"Ref": "AWS::AccountId"}, ":cwtest-alarms"})
	if props(topic)["KmsMasterKeyId"] == nil {
		t.Errorf("alarm topic is not encrypted")
	}
	assert(t, "e-mail subscription", func() {
		syn.template.HasResourceProperties(jsii.String("AWS::SNS::Subscription"), &map[string]any{
			"Protocol": "email", "Endpoint": syn.cfg.Stack.AlarmEmail, "TopicArn": map[string]any{"Ref": topicID},
		})
	})
	alarms := map[string]map[string]any{}
	for id, r := range syn.resources("AWS::CloudWatch::Alarm") {
		p := props(r)
		name, _ := p["AlarmName"].(string)
		alarms[name] = p
		if actions := p["AlarmActions"].([]any); len(actions) != 1 || !strings.Contains(compact(actions[0]), topicARN) {
			t.Errorf("alarm %s (%s) actions = %s, want the topic", name, id, compact(actions))
		}
	}
	var want []string
	for _, j := range syn.cfg.Jobs {
		want = append(want, j.ID+"-functions", j.ID+"-poller-errors", j.ID+"-no-progress", j.ID+"-no-lease-holder", j.ID+"-source-auth-failures", j.ID+"-flood",
			j.ID+"-malformed-rows", j.ID+"-blocked-page")
		if a := j.Attachments; a != nil && a.Enabled {
			want = append(want, j.ID+"-attachments-not-copied")
		}
		for _, o := range j.Outputs {
			want = append(want, j.ID+"-"+o.ID+"-dlq-not-empty", j.ID+"-"+o.ID+"-dlq-waiting", j.ID+"-"+o.ID+"-latency", j.ID+"-"+o.ID+"-output-auth-failures",
				j.ID+"-"+o.ID+"-backpressure", j.ID+"-"+o.ID+"-output-down")
			if o.Halts() {
				want = append(want, j.ID+"-"+o.ID+"-halted")
			}
		}
	}
	for _, w := range want {
		if _, ok := alarms["cwtest-"+w]; !ok {
			t.Errorf("no alarm cwtest-%s", w)
		}
	}
	if len(alarms) != len(want) {
		t.Errorf("%d alarms, want %d: %v", len(alarms), len(want), sortedKeys(alarms))
	}

	for _, j := range syn.cfg.Jobs {
		fns := compact(alarms["cwtest-"+j.ID+"-functions"]["Metrics"])
		for _, m := range []string{"FILL(pollerErrors, 0) + FILL(writerErrors, 0) + FILL(writerThrottles, 0)", `"MetricName":"Errors"`, `"MetricName":"Throttles"`} {
			if !strings.Contains(fns, m) {
				t.Errorf("%s functions alarm lacks %q: %s", j.ID, m, fns)
			}
		}
		checkLeaseAlarm(t, syn, j, alarms["cwtest-"+j.ID+"-no-lease-holder"])
		checks := map[string]string{"-malformed-rows": metrics.MalformedRows, "-blocked-page": metrics.MalformedPages}
		if a := j.Attachments; a != nil && a.Enabled {
			checks["-attachments-not-copied"] = metrics.AttachmentsQuarantined
		}
		for suffix, metric := range checks {
			a := alarms["cwtest-"+j.ID+suffix]
			if a["MetricName"] != metric || a["Statistic"] != "Sum" || a["Threshold"] != float64(0) ||
				a["ComparisonOperator"] != "GreaterThanThreshold" || !strings.Contains(compact(a["Dimensions"]), j.ID) ||
				!strings.Contains(fmt.Sprint(a["AlarmDescription"]), "changesctl status") {
				t.Errorf("%s%s alarm = %s, want %s summed > 0, pointing at changesctl status", j.ID, suffix, compact(a), metric)
			}
		}
		progress := compact(alarms["cwtest-"+j.ID+"-no-progress"]["Metrics"])
		for _, m := range []string{metrics.Checkpoints, metrics.PendingChanges, "IF(pending > 0 AND FILL(checkpoints, 0) == 0, 1, 0)"} {
			if !strings.Contains(progress, m) {
				t.Errorf("%s no-progress alarm lacks %q: %s", j.ID, m, progress)
			}
		}
		for name, metric := range map[string]string{"-source-auth-failures": metrics.SourceAuthFailures, "-flood": metrics.FloodBatches} {
			a := alarms["cwtest-"+j.ID+name]
			if a["MetricName"] != metric || a["Statistic"] != "Sum" || a["Threshold"] != float64(0) || a["ComparisonOperator"] != "GreaterThanThreshold" ||
				compact(a["Dimensions"]) != compact([]any{map[string]any{"Name": "Job", "Value": j.ID}}) {
				t.Errorf("%s%s alarm = %s, want %s sum > 0 for the job", j.ID, name, compact(a), metric)
			}
		}
		for _, o := range j.Outputs {
			// Labelled output metrics render as one MetricStat query.
			stat := func(name string) string {
				want := compact(map[string]any{"Metric": map[string]any{
					"Dimensions": []any{map[string]any{"Name": "Job", "Value": j.ID}, map[string]any{"Name": "Output", "Value": o.ID}},
					"MetricName": name, "Namespace": metrics.Namespace,
				}})
				return want[:len(want)-1]
			}
			auth := alarms["cwtest-"+j.ID+"-"+o.ID+"-output-auth-failures"]
			if q := compact(auth["Metrics"]); !strings.Contains(q, stat(metrics.OutputAuthFailures)) || !strings.Contains(q, `"Stat":"Sum"`) ||
				auth["Threshold"] != float64(0) || auth["ComparisonOperator"] != "GreaterThanThreshold" {
				t.Errorf("%s/%s output auth alarm = %s", j.ID, o.ID, compact(auth))
			}
			bp := alarms["cwtest-"+j.ID+"-"+o.ID+"-backpressure"]
			if q := compact(bp["Metrics"]); !strings.Contains(q, stat(metrics.BackpressureActive)) || !strings.Contains(q, `"Stat":"Minimum"`) ||
				bp["Threshold"] != float64(1) || bp["EvaluationPeriods"] != float64(3) || bp["ComparisonOperator"] != "GreaterThanOrEqualToThreshold" {
				t.Errorf("%s/%s backpressure alarm = %s", j.ID, o.ID, compact(bp))
			}
			down := alarms["cwtest-"+j.ID+"-"+o.ID+"-output-down"]
			if q := compact(down["Metrics"]); !strings.Contains(q, stat(metrics.OutputDown)) || !strings.Contains(q, `"Stat":"Maximum"`) ||
				down["Threshold"] != float64(1) || down["ComparisonOperator"] != "GreaterThanOrEqualToThreshold" || down["TreatMissingData"] != "ignore" {
				t.Errorf("%s/%s output-down alarm = %s, want OutputDown max >= 1, missing data ignored", j.ID, o.ID, compact(down))
			}
			age := alarms["cwtest-"+j.ID+"-"+o.ID+"-latency"]
			if age["MetricName"] != "ApproximateAgeOfOldestMessage" || age["Threshold"] != j.LatencyObjective.D().Seconds() {
				t.Errorf("%s/%s latency alarm = %s", j.ID, o.ID, compact(age))
			}
			if o.Halts() {
				h := alarms["cwtest-"+j.ID+"-"+o.ID+"-halted"]
				m := compact(h["Metrics"])
				if !strings.Contains(m, `"MetricName":"`+metrics.OutputHalted+`"`) || !strings.Contains(m, `"Stat":"Maximum"`) ||
					!strings.Contains(m, `{"Name":"Output","Value":"`+o.ID+`"}`) || h["Threshold"] != float64(1) ||
					h["ComparisonOperator"] != "GreaterThanOrEqualToThreshold" || h["TreatMissingData"] != "ignore" {
					t.Errorf("%s/%s halted alarm = %s, want OutputHalted max >= 1, missing data ignored", j.ID, o.ID, compact(h))
				}
			}
			dlq := alarms["cwtest-"+j.ID+"-"+o.ID+"-dlq-not-empty"]
			dlqID, _ := syn.resource(t, "AWS::SQS::Queue", "QueueName", syn.cfg.DLQName(j, o))
			if dlq["MetricName"] != "ApproximateNumberOfMessagesVisible" || dlq["Threshold"] != float64(0) ||
				!strings.Contains(compact(dlq["Dimensions"]), dlqID) {
				t.Errorf("%s/%s DLQ alarm = %s", j.ID, o.ID, compact(dlq))
			}
			// The console's redrive to the source queue cannot return what
			// the writer moved itself, nor any message of a FIFO DLQ: the
			// text names the command that does.
			desc := fmt.Sprint(dlq["AlarmDescription"])
			if want := "changesctl dlq redrive --job " + j.ID + " --output " + o.ID; !strings.Contains(desc, want) || strings.Contains(desc, "redrive them from the SQS console") {
				t.Errorf("%s/%s DLQ alarm description = %q, want it to point at %q", j.ID, o.ID, desc, want)
			}
			if strings.Contains(desc, "console") && (o.FIFO() || !strings.Contains(desc, syn.cfg.QueueName(j, o))) {
				t.Errorf("%s/%s DLQ alarm description = %q: the console's redrive works only for a standard DLQ, with the work queue %s as a custom destination", j.ID, o.ID, desc, syn.cfg.QueueName(j, o))
			}
		}
	}
}

// checkLeaseAlarm checks job j's lease-holder alarm. It reads two metrics
// that arrive late: the poller's Role, extracted from its logs (EMF), and
// its Invocations, which Lambda reports when an invocation ends. So it
// fires only when every one of its periods breaches, the latest of which
// (those whose metrics may still be on their way: a poller's timeout plus
// ten minutes, and the period under way) always may: the periods before
// them must show no holder for longer than any healthy job goes without
// one. A period breaches when the poller was not invoked in it (one
// invocation a schedule period, reported within the poller's timeout of its
// start) or when only standbys reported Role; a period without Role is no
// breach by itself while the poller is invoked. Standard resolution: a
// period of whole minutes.
func checkLeaseAlarm(t *testing.T, syn *synthesis, j *config.Job, a map[string]any) {
	t.Helper()
	expr, stats := mathAlarm(a)
	s, timeout := j.Schedule.D(), syn.cfg.Stack.PollerTimeout.D()
	role, inv := stats[metrics.Role], stats[lambdaInvocations]
	if expr != "IF(FILL(invocations, 0) < 1 OR FILL(role, 1) < 1, 1, 0)" || len(stats) != 2 {
		t.Errorf("%s no-lease-holder alarm = %s, want metric math over Role and Invocations, a breach without an invocation or with Role < 1", j.ID, compact(a))
		return
	}
	roleMetric, _ := role["Metric"].(map[string]any)
	if role["Stat"] != "Maximum" || role["Period"] != s.Seconds() || roleMetric["Namespace"] != metrics.Namespace ||
		compact(roleMetric["Dimensions"]) != compact([]any{map[string]any{"Name": "Job", "Value": j.ID}}) {
		t.Errorf("%s no-lease-holder alarm's Role = %s, want the job's maximum over its schedule (%s)", j.ID, compact(role), s)
	}
	invMetric, _ := inv["Metric"].(map[string]any)
	pollerID, _ := syn.resource(t, "AWS::Lambda::Function", "FunctionName", functionName(syn.cfg, j, fnPoller))
	if inv["Stat"] != "Sum" || inv["Period"] != s.Seconds() || invMetric["Namespace"] != "AWS/Lambda" ||
		!strings.Contains(compact(invMetric["Dimensions"]), `{"Name":"FunctionName","Value":{"Ref":"`+pollerID+`"}}`) {
		t.Errorf("%s no-lease-holder alarm's Invocations = %s, want the job's poller's sum over its schedule (%s)", j.ID, compact(inv), s)
	}
	if a["Threshold"] != float64(1) || a["ComparisonOperator"] != "GreaterThanOrEqualToThreshold" || a["TreatMissingData"] != "breaching" {
		t.Errorf("%s no-lease-holder alarm = %s, want >= 1, missing data breaching (no data: nothing runs)", j.ID, compact(a))
	}
	n, _ := a["EvaluationPeriods"].(float64)
	if a["DatapointsToAlarm"] != nil && a["DatapointsToAlarm"] != n {
		t.Errorf("%s no-lease-holder alarm: %v of %v periods, want all of them", j.ID, a["DatapointsToAlarm"], n)
	}
	periods := func(d time.Duration) int { return int((d + s - 1) / s) }
	late := periods(timeout+10*time.Minute) + 1
	held := int(n) - late
	want := max(2, periods(s+timeout), periods(2*j.Lease.TTL.D()+j.Feed.Timeout.D()))
	if held != want {
		t.Errorf("%s no-lease-holder alarm: %v periods of %s, %d of them before the %d late ones, want %d: two at least, as many as a poller "+
			"invocation (schedule %s plus poller timeout %s) and a failover (twice the TTL %s plus the feed timeout %s) take",
			j.ID, n, s, held, late, want, s, timeout, j.Lease.TTL.D(), j.Feed.Timeout.D())
	}
}

// TestAlarmWindows: every alarm of jobs at the configuration's bounds (a
// schedule of 24h, a lease TTL of 10m, the longest feed timeout and poller
// timeout) is one PutMetricAlarm accepts: whole minutes or 10, 20, 30 s a
// period, and periods times evaluation periods at most a day for periods
// under an hour, at most seven days otherwise. The lease-holder alarms keep
// their rules there too.
func TestAlarmWindows(t *testing.T) {
	synthesized(t) // one synthesis at a time through the jsii runtime
	doc := `{"stack": {"prefix": "cwbounds", "poller_timeout": "15m", "writer_timeout": "15m"},
  "jobs": [
    {"id": "daily", "schedule": "24h", "idle": "sleep", "lease": {"ttl": "10m"}, "feed": {"timeout": "5m"},
     "source": {"type": "couchdb", "url": "https://couch.example.com/a"},
     "outputs": [{"id": "pg", "type": "postgres", "postgres": {"dsn": {"env": "PG_DSN"}, "table": "daily"}}]},
    {"id": "hour", "schedule": "59m", "lease": {"ttl": "10m"}, "feed": {"timeout": "5m"},
     "source": {"type": "couchdb", "url": "https://couch.example.com/b"},
     "outputs": [{"id": "pg", "type": "postgres", "postgres": {"dsn": {"env": "PG_DSN"}, "table": "hour"}}]},
    {"id": "minute", "schedule": "1m", "lease": {"ttl": "10m"}, "feed": {"timeout": "5m"},
     "source": {"type": "couchdb", "url": "https://couch.example.com/c"},
     "outputs": [{"id": "pg", "type": "postgres", "postgres": {"dsn": {"env": "PG_DSN"}, "table": "minute"}}]}
  ]}`
	bounds, err := synthesizeDoc(t, doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, syn := range []*synthesis{synthesized(t), bounds} {
		for id, r := range syn.resources("AWS::CloudWatch::Alarm") {
			p := props(r)
			period, _ := p["Period"].(float64)
			queries, _ := p["Metrics"].([]any)
			for _, q := range queries {
				ms, _ := q.(map[string]any)["MetricStat"].(map[string]any)
				if qp, ok := ms["Period"].(float64); ok {
					if period != 0 && qp != period {
						t.Errorf("alarm %s reads metrics of periods %v and %v", p["AlarmName"], period, qp)
					}
					period = qp
				}
			}
			n, _ := p["EvaluationPeriods"].(float64)
			limit := 24 * time.Hour
			if period >= 3600 {
				limit = 7 * 24 * time.Hour
			}
			switch {
			case period == 0 || n == 0:
				t.Errorf("alarm %s (%s): no period or evaluation periods: %s", p["AlarmName"], id, compact(p))
			case math.Mod(period, 60) != 0 && period != 10 && period != 20 && period != 30:
				t.Errorf("alarm %s: period %v s, which PutMetricAlarm refuses", p["AlarmName"], period)
			case time.Duration(period*n)*time.Second > limit:
				t.Errorf("alarm %s: %v periods of %v s, over PutMetricAlarm's %s", p["AlarmName"], n, period, limit)
			}
		}
	}
	alarms := map[string]map[string]any{}
	for _, r := range bounds.resources("AWS::CloudWatch::Alarm") {
		alarms[fmt.Sprint(props(r)["AlarmName"])] = props(r)
	}
	for _, j := range bounds.cfg.Jobs {
		checkLeaseAlarm(t, bounds, j, alarms["cwbounds-"+j.ID+"-no-lease-holder"])
	}
}

func TestDashboard(t *testing.T) {
	syn := synthesized(t)
	for _, j := range syn.cfg.Jobs {
		// Dashboard names are global, not regional: the name carries the
		// region, so a copy of the stack in another region (staging, DR)
		// has dashboards of its own.
		var d map[string]any
		var names []string
		for _, r := range syn.resources("AWS::CloudWatch::Dashboard") {
			names = append(names, compact(props(r)["DashboardName"]))
			if dashboardJob(props(r)["DashboardName"]) == "cwtest-"+j.ID {
				d = r
			}
		}
		if d == nil {
			t.Errorf("no dashboard named cwtest-%s-<region>: %v", j.ID, names)
			continue
		}
		body := compact(props(d)["DashboardBody"])
		for _, want := range []string{
			"## job " + j.ID,
			metrics.PendingChanges, metrics.LagSeconds, metrics.DocumentsEnqueued, metrics.Delivered,
			metrics.EndToEndLatencyMs, "ApproximateNumberOfMessagesVisible", metrics.Role,
			metrics.CheckpointAgeSeconds, "lease acquired",
			metrics.SourceAuthFailures, metrics.OutputAuthFailures, metrics.SourceRequestTime, metrics.OutputRequestTime,
			metrics.LargestBatch, metrics.FloodBatches, metrics.BackpressureActive, metrics.BackpressureDelays, metrics.BackpressureDelaySeconds,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("dashboard of %s lacks %q", j.ID, want)
			}
		}
		for _, other := range syn.cfg.Jobs {
			if other != j && strings.Contains(body, "## job "+other.ID) {
				t.Errorf("dashboard of %s shows job %s", j.ID, other.ID)
			}
		}
	}
	assert(t, "a dashboard per job", func() {
		syn.template.ResourceCountIs(jsii.String("AWS::CloudWatch::Dashboard"), jsii.Number(float64(len(syn.cfg.Jobs))))
	})
}

// dashboardJob returns <prefix>-<job> of a dashboard named
// <prefix>-<job>-<region> ({"Fn::Join": ["", ["<prefix>-<job>-", {"Ref":
// "AWS::Region"}]]}), "" for any other name.
func dashboardJob(name any) string {
	m, _ := name.(map[string]any)
	join, _ := m["Fn::Join"].([]any)
	if len(join) != 2 || join[0] != "" {
		return ""
	}
	parts, _ := join[1].([]any)
	if len(parts) != 2 || compact(parts[1]) != `{"Ref":"AWS::Region"}` {
		return ""
	}
	s, _ := parts[0].(string)
	if !strings.HasSuffix(s, "-") {
		return ""
	}
	return strings.TrimSuffix(s, "-")
}

// rolePolicy returns, as JSON, the policy document attached to the role of
// the named function.
func rolePolicy(t *testing.T, syn *synthesis, function string) string {
	t.Helper()
	_, fn := syn.resource(t, "AWS::Lambda::Function", "FunctionName", function)
	roleID := refID(props(fn)["Role"])
	for _, r := range syn.resources("AWS::IAM::Policy") {
		for _, role := range props(r)["Roles"].([]any) {
			if refID(role) == roleID {
				return compact(props(r)["PolicyDocument"])
			}
		}
	}
	t.Fatalf("no policy on the role of %s", function)
	return ""
}

func wantActions(t *testing.T, who string, sts []map[string]any, prefix string, want []string) {
	t.Helper()
	seen := map[string]bool{}
	for _, st := range sts {
		for _, a := range strs(st["Action"]) {
			if strings.HasPrefix(a, prefix) {
				seen[a] = true
			}
		}
	}
	if got := sortedKeys(seen); compact(got) != compact(want) && !(len(got) == 0 && len(want) == 0) {
		t.Errorf("%s %s* actions = %v, want %v", who, prefix, got, want)
	}
}

// wantResources checks that the statements granting action cover exactly
// the queues for which match is true.
func wantResources(t *testing.T, syn *synthesis, who string, sts []map[string]any, action string, match func(q map[string]any) bool) {
	t.Helper()
	got := map[string]bool{}
	for _, st := range sts {
		if !contains(strs(st["Action"]), action) {
			continue
		}
		res, ok := st["Resource"].([]any)
		if !ok {
			res = []any{st["Resource"]}
		}
		for _, r := range res {
			got[refID(r)] = true
		}
	}
	for id, q := range syn.resources("AWS::SQS::Queue") {
		if want := match(props(q)); got[id] != want {
			t.Errorf("%s %s on %s = %v, want %v", who, action, props(q)["QueueName"], got[id], want)
		}
		delete(got, id)
	}
	for id := range got {
		t.Errorf("%s %s on %s, which is no queue of the stack", who, action, id)
	}
}

// mathAlarm returns the expression of the metric-math alarm a and its
// metrics' MetricStat by metric name.
func mathAlarm(a map[string]any) (expr string, stats map[string]map[string]any) {
	stats = map[string]map[string]any{}
	queries, _ := a["Metrics"].([]any)
	for _, q := range queries {
		q, _ := q.(map[string]any)
		if e, ok := q["Expression"].(string); ok {
			expr = e
			continue
		}
		ms, _ := q["MetricStat"].(map[string]any)
		m, _ := ms["Metric"].(map[string]any)
		name, _ := m["MetricName"].(string)
		stats[name] = ms
	}
	return expr, stats
}
