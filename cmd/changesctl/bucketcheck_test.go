package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/testbucket"
)

// TestBucketCheck: `changesctl bucket check` reads the lifecycle rules of an
// existing stack bucket, fails while no rule expires the claim checks and
// prints the rule to add, passes once that very rule is in place, and fails
// again, naming it, when a rule would expire the DLQ archive.
func TestBucketCheck(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	client, bucket := testbucket.New(t)
	cfgPath := writeS3Config(t, "cwb", bucket)
	run := func() (string, error) {
		var out, errb bytes.Buffer
		err := realMain(ctx, &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, lookup: testenv.Lookup},
			[]string{"bucket", "check", "--config", cfgPath})
		return out.String(), err
	}

	out, err := run()
	if err == nil || !strings.Contains(err.Error(), "never expire") {
		t.Fatalf("bucket check without a rule: %v, want a failure saying claim checks never expire\n%s", err, out)
	}
	// The rule printed is the lifecycle configuration to merge, in the form
	// `aws s3api put-bucket-lifecycle-configuration` takes.
	start := strings.Index(out, "{")
	if start < 0 {
		t.Fatalf("no rule printed:\n%s", out)
	}
	var printed struct {
		Rules []struct {
			ID         string
			Status     string
			Filter     struct{ Prefix string }
			Expiration struct{ Days int32 }
		}
	}
	if err := json.NewDecoder(strings.NewReader(out[start:])).Decode(&printed); err != nil {
		t.Fatalf("decode the printed rule: %v\n%s", err, out)
	}
	if len(printed.Rules) != 1 {
		t.Fatalf("printed %d rules, want 1:\n%s", len(printed.Rules), out)
	}
	p := printed.Rules[0]
	rule := s3types.LifecycleRule{ID: &p.ID, Status: s3types.ExpirationStatus(p.Status),
		Filter: &s3types.LifecycleRuleFilter{Prefix: &p.Filter.Prefix}, Expiration: &s3types.LifecycleExpiration{Days: &p.Expiration.Days}}
	other := claimcheck.Rule()
	other.ID, other.Filter = strPtr("tmp"), &s3types.LifecycleRuleFilter{Prefix: strPtr("tmp/")}
	if _, err := client.PutBucketLifecycleConfiguration(ctx, &s3.PutBucketLifecycleConfigurationInput{
		Bucket: &bucket, LifecycleConfiguration: &s3types.BucketLifecycleConfiguration{Rules: []s3types.LifecycleRule{other, rule}},
	}); err != nil {
		t.Fatalf("put the printed rule: %v", err)
	}
	out, err = run()
	if err != nil || !strings.Contains(out, claimcheck.RuleID) {
		t.Errorf("bucket check with the printed rule: %v\n%s", err, out)
	}

	// A rule that expires everything after 90 days would delete the DLQ
	// archive, whose changes wait there for an operator.
	all := claimcheck.Rule()
	all.ID, all.Filter, all.Expiration = strPtr("expire-all"), &s3types.LifecycleRuleFilter{Prefix: strPtr("")}, &s3types.LifecycleExpiration{Days: int32Ptr(90)}
	if _, err := client.PutBucketLifecycleConfiguration(ctx, &s3.PutBucketLifecycleConfigurationInput{
		Bucket: &bucket, LifecycleConfiguration: &s3types.BucketLifecycleConfiguration{Rules: []s3types.LifecycleRule{other, rule, all}},
	}); err != nil {
		t.Fatalf("put a rule expiring everything: %v", err)
	}
	out, err = run()
	if err == nil || !strings.Contains(err.Error(), `rule "expire-all" deletes archived DLQ messages (dlq-archive/) after 90 days`) {
		t.Errorf("bucket check with a rule that expires the DLQ archive: %v, want a failure naming the rule\n%s", err, out)
	}
}

func int32Ptr(n int32) *int32 { return &n }

func strPtr(s string) *string { return &s }
