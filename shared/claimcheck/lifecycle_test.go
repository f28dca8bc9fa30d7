package claimcheck_test

import (
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/testbucket"
)

// CheckExpiry against the emulator's lifecycle configurations: the rule the
// stack puts on its own bucket passes, alone or among other rules; a bucket
// without it, or with a rule that deletes claim checks sooner, does not.
func TestCheckExpiry(t *testing.T) {
	t.Parallel()
	client := s3.NewFromConfig(testenv.AWS(t), awsconf.S3Options)
	rule := func(id, prefix string, days int32) s3types.LifecycleRule {
		return s3types.LifecycleRule{ID: aws.String(id), Status: s3types.ExpirationStatusEnabled,
			Filter: &s3types.LifecycleRuleFilter{Prefix: aws.String(prefix)}, Expiration: &s3types.LifecycleExpiration{Days: aws.Int32(days)}}
	}
	disabled := claimcheck.Rule()
	disabled.Status = s3types.ExpirationStatusDisabled
	tagged := claimcheck.Rule()
	tagged.Filter = &s3types.LifecycleRuleFilter{And: &s3types.LifecycleRuleAndOperator{
		Prefix: aws.String("claim-check/"), Tags: []s3types.Tag{{Key: aws.String("k"), Value: aws.String("v")}}}}
	dated := rule("on-a-date", "", 0)
	dated.Expiration = &s3types.LifecycleExpiration{Date: aws.Time(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))}
	tests := []struct {
		name   string
		rules  []s3types.LifecycleRule // nil: no lifecycle configuration
		want   error
		wantID string
	}{
		{name: "no configuration", want: claimcheck.ErrNoExpiry},
		{name: "the stack's rule", rules: []s3types.LifecycleRule{claimcheck.Rule()}, wantID: claimcheck.RuleID},
		{name: "among other rules", rules: []s3types.LifecycleRule{rule("logs", "logs/", 1), claimcheck.Rule()}, wantID: claimcheck.RuleID},
		{name: "whole bucket, long enough", rules: []s3types.LifecycleRule{rule("all", "", 365)}, wantID: "all"},
		{name: "other prefixes only", rules: []s3types.LifecycleRule{rule("logs", "logs/", 1)}, want: claimcheck.ErrNoExpiry},
		{name: "disabled", rules: []s3types.LifecycleRule{disabled}, want: claimcheck.ErrNoExpiry},
		{name: "only tagged objects", rules: []s3types.LifecycleRule{tagged}, want: claimcheck.ErrNoExpiry},
		{name: "one job's prefix only", rules: []s3types.LifecycleRule{rule("orders", "claim-check/orders/", 30)}, want: claimcheck.ErrNoExpiry},
		{name: "whole bucket too soon", rules: []s3types.LifecycleRule{claimcheck.Rule(), rule("week", "", 7)}, want: claimcheck.ErrExpiresTooSoon},
		{name: "one job too soon", rules: []s3types.LifecycleRule{claimcheck.Rule(), rule("orders", "claim-check/orders/", 2)}, want: claimcheck.ErrExpiresTooSoon},
		{name: "on a date", rules: []s3types.LifecycleRule{claimcheck.Rule(), dated}, want: claimcheck.ErrExpiresTooSoon},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			bucket := testbucket.Create(t, client)
			if tt.rules != nil {
				if _, err := client.PutBucketLifecycleConfiguration(ctx, &s3.PutBucketLifecycleConfigurationInput{
					Bucket: &bucket, LifecycleConfiguration: &s3types.BucketLifecycleConfiguration{Rules: tt.rules},
				}); err != nil {
					t.Fatalf("put lifecycle configuration: %v", err)
				}
			}
			id, err := claimcheck.CheckExpiry(ctx, client, bucket)
			if tt.want == nil && (err != nil || id != tt.wantID) || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("CheckExpiry = %q, %v; want %q, %v", id, err, tt.wantID, tt.want)
			}
		})
	}
}
