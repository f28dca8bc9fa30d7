package main

//lint:file-ignore SA1019 the Go CDK reads synthesis messages (errors, warnings, cdk-nag findings) only through cxapi.SynthesisMessage; its replacement is not published for Go.

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2/cxapi"
)

// CloudFormation's quotas per template, and IAM's for a role's inline
// policies (the CDK attaches each role's statements as one AWS::IAM::Policy).
const (
	maxTemplateBytes   = 1 << 20 // a template read from S3, as the CDK deploys them
	maxResources       = 500
	maxOutputs         = 200
	maxParameters      = 200
	maxMappings        = 200
	maxRolePolicyBytes = 10240 // aggregate size of a role's inline policies
)

// scaleConfig is a configuration of n jobs with three outputs each
// (PostgreSQL on a standard queue, HTTP on a FIFO queue, S3), in the shape
// of the demo's job, with attachments, secrets, a VPC and an alarm e-mail.
func scaleConfig(n int) string {
	var jobs []string
	for i := range n {
		jobs = append(jobs, fmt.Sprintf(`{
      "id": "job-%03d",
      "source": {"type": "sync_gateway", "url": "https://sgw.example.com:4984/db%03d",
        "auth": {"type": "basic", "username": "worker", "password": {"secret": "sources/job-%03d"}}},
      "attachments": {"enabled": true},
      "outputs": [
        {"id": "pg", "type": "postgres", "postgres": {"dsn": {"env": "PG_DSN"}, "table": "docs_%03d"}},
        {"id": "rest", "type": "http", "http": {"url": "https://api.example.com/db%03d/{doc_id}", "auth": {"type": "bearer", "token": {"env": "API_TOKEN"}}}},
        {"id": "archive", "type": "s3", "s3": {"prefix": "archive/job-%03d/"}}
      ]
    }`, i, i, i, i, i, i))
	}
	return fmt.Sprintf(`{
  "stack": {
    "prefix": "cwscale", "alarm_email": "oncall@example.com",
    "vpc": {"id": "vpc-0123456789abcdef0", "subnet_ids": ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"], "security_group_ids": ["sg-0123456789abcdef0"]}
  },
  "jobs": [%s]
}`, strings.Join(jobs, ",\n    "))
}

// lintSample is how many job templates cfn-lint reads, besides the shared
// stack's: the job templates of one configuration come from the same code and
// differ in names only, and cfn-lint takes about three seconds a template.
const lintSample = 10

// TestScale synthesizes 1, 10 and 100 jobs of three outputs each and
// requires every template, the shared stack's and each job's, to be inside
// CloudFormation's quotas, every role's policy inside IAM's, no cdk-nag
// error (cdk-nag checks every stack), every suppression with its reason, and
// cfn-lint clean (on the shared stack and up to lintSample job stacks). A
// job's stack does not grow with the number of jobs. It logs the synth time
// and the sizes (docs/scale.md quotes them). It runs beside the other
// parallel tests (the deploys among them), its syntheses one at a time
// through the jsii runtime (jsiiMu), so the synth times it logs are of a
// machine busy with the rest of the tests.
func TestScale(t *testing.T) {
	synthesized(t) // the shared synthesis first, before the parallel tests
	t.Parallel()
	type scaled struct {
		n    int
		syn  *synthesis
		took time.Duration
	}
	var runs []scaled
	for _, n := range []int{1, 10, 100} {
		start := time.Now()
		syn, err := synthesizeDoc(t, scaleConfig(n))
		if err != nil {
			t.Fatalf("synthesize %d jobs: %v", n, err)
		}
		runs = append(runs, scaled{n, syn, time.Since(start)})
	}
	var perJob []int
	for _, r := range runs {
		n, syn, took := r.n, r.syn, r.took
		t.Run(fmt.Sprintf("%d jobs", n), func(t *testing.T) {
			if len(syn.templates) != n+1 {
				t.Errorf("%d templates, want %d (the shared stack and one per job)", len(syn.templates), n+1)
			}
			var largest, most, sharedBytes, sharedResources int
			for path, tmpl := range syn.templates {
				size, resources := checkTemplateQuotas(t, path, tmpl)
				if path == syn.templatePath {
					sharedBytes, sharedResources = size, resources
					continue
				}
				largest, most = max(largest, size), max(most, resources)
			}
			biggestPolicy := checkRolePolicySizes(t, syn)
			for _, m := range syn.messages {
				if m.level == string(cxapi.SynthesisMessageLevel_ERROR) {
					t.Errorf("%s: %s", m.path, firstLine(m.text))
				}
			}
			checkSuppressions(t, syn)
			assets, kinds := codeAssets(syn)
			if len(assets) != len(functionKinds) || len(kinds) != len(functionKinds) {
				t.Errorf("%d jobs: %d distinct code assets for the %d function kinds (%s), want one per kind (%s), shared by every job",
					n, len(assets), len(kinds), strings.Join(sortedKeys(kinds), ", "), strings.Join(functionKinds, ", "))
			}
			assembly := dirSize(t, syn.outdir)
			lintStart := time.Now()
			cfnLint(t, syn, lintSample)
			t.Logf("%d jobs: synth %.1f s (cfn-lint %.1f s); cloud assembly %d bytes with stand-in code, %d code assets; shared stack %d bytes, %d resources; largest job stack %d bytes, %d resources; largest role policy %d bytes",
				n, took.Seconds(), time.Since(lintStart).Seconds(), assembly, len(assets), sharedBytes, sharedResources, largest, most, biggestPolicy)
			perJob = append(perJob, most)
		})
	}
	for i := 1; i < len(perJob); i++ {
		if perJob[i] != perJob[0] {
			t.Errorf("the largest job stack's resources grow with the number of jobs: %v at 1, 10, 100 jobs", perJob)
		}
	}
}

// checkTemplateQuotas checks one template against CloudFormation's quotas
// and returns its size in bytes (as the CDK writes it) and its resources.
func checkTemplateQuotas(t *testing.T, path string, tmpl map[string]any) (size, resources int) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	count := func(section string) int {
		m, _ := tmpl[section].(map[string]any)
		return len(m)
	}
	name := filepath.Base(path)
	for _, c := range []struct {
		what      string
		got, want int
	}{
		{"bytes", int(st.Size()), maxTemplateBytes},
		{"resources", count("Resources"), maxResources},
		{"outputs", count("Outputs"), maxOutputs},
		{"parameters", count("Parameters"), maxParameters},
		{"mappings", count("Mappings"), maxMappings},
	} {
		if c.got > c.want {
			t.Errorf("%s: %d %s, CloudFormation allows %d", name, c.got, c.what, c.want)
		}
	}
	return int(st.Size()), count("Resources")
}

// checkRolePolicySizes requires the inline policies of every role to fit
// IAM's aggregate quota, with every reference to a resource counted as a
// long ARN, and returns the largest.
func checkRolePolicySizes(t *testing.T, syn *synthesis) int {
	t.Helper()
	perRole := map[string]int{}
	for _, r := range syn.resources("AWS::IAM::Policy") {
		size := len(compact(resolvedEstimate(props(r)["PolicyDocument"])))
		for _, role := range props(r)["Roles"].([]any) {
			perRole[refID(role)] += size
		}
	}
	if n := len(syn.resources("AWS::IAM::ManagedPolicy")); n != 0 {
		t.Errorf("%d managed policies: a role's policy outgrew its inline quota and was split", n)
	}
	largest := 0
	for role, size := range perRole {
		largest = max(largest, size)
		if size > maxRolePolicyBytes {
			t.Errorf("role %s: inline policies of about %d bytes, IAM allows %d", role, size, maxRolePolicyBytes)
		}
	}
	return largest
}

// estimatedARN stands for the value of a reference (Ref, Fn::GetAtt) in a
// policy: as long as a queue ARN with the longest queue name SQS allows.
var estimatedARN = "arn:aws:sqs:ap-southeast-2:123456789012:" + strings.Repeat("q", 80)

// resolvedEstimate replaces the intrinsic functions of a policy document by
// strings at least as long as what CloudFormation would put there.
func resolvedEstimate(v any) any {
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = resolvedEstimate(e)
		}
		return out
	case map[string]any:
		if ref, ok := v["Ref"].(string); ok {
			switch ref {
			case "AWS::Partition":
				return "aws-us-gov"
			case "AWS::Region":
				return "ap-southeast-2"
			case "AWS::AccountId":
				return "123456789012"
			case "AWS::URLSuffix":
				return "amazonaws.com.cn"
			}
			return estimatedARN
		}
		if _, ok := v["Fn::GetAtt"]; ok {
			return estimatedARN
		}
		if join, ok := v["Fn::Join"].([]any); ok && len(join) == 2 {
			sep, _ := join[0].(string)
			var parts []string
			for _, p := range join[1].([]any) {
				s, _ := resolvedEstimate(p).(string)
				parts = append(parts, s)
			}
			return strings.Join(parts, sep)
		}
		out := map[string]any{}
		for k, e := range v {
			out[k] = resolvedEstimate(e)
		}
		return out
	}
	return v
}

// codeAssets returns the distinct code locations (S3 bucket and key) of the
// app's functions and the function kinds, the part of each function's name
// after its job (<prefix>-<job>-<kind>).
func codeAssets(syn *synthesis) (assets, kinds map[string]bool) {
	assets, kinds = map[string]bool{}, map[string]bool{}
	for _, fn := range syn.resources("AWS::Lambda::Function") {
		p := props(fn)
		assets[compact(p["Code"])] = true
		name, _ := p["FunctionName"].(string)
		kinds[name[strings.LastIndexByte(name, '-')+1:]] = true
	}
	return assets, kinds
}

// dirSize is the size in bytes of the files under dir.
func dirSize(t *testing.T, dir string) int64 {
	t.Helper()
	var size int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		size += info.Size()
		return nil
	})
	if err != nil {
		t.Fatalf("size of %s: %v", dir, err)
	}
	return size
}
