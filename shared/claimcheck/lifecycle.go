package claimcheck

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/changes-worker/changes-worker/shared/config"
)

// ExpiryDays is how long a claim check is kept. A message can wait up to 14
// days in its work queue and, on a FIFO queue (whose DLQ restarts the
// retention clock), 14 more in the DLQ; the object must outlive both or a
// redriven message would point at nothing.
const ExpiryDays = 30

// RuleID is the id of the lifecycle rule that expires claim checks, in the
// bucket the stack creates and in the rule Rule returns.
const RuleID = "expire-claim-checks"

// Rule is the lifecycle rule that expires claim checks after ExpiryDays.
func Rule() s3types.LifecycleRule {
	return s3types.LifecycleRule{
		ID:         aws.String(RuleID),
		Status:     s3types.ExpirationStatusEnabled,
		Filter:     &s3types.LifecycleRuleFilter{Prefix: aws.String(config.ClaimCheckPrefix)},
		Expiration: &s3types.LifecycleExpiration{Days: aws.Int32(ExpiryDays)},
	}
}

// Errors of CheckExpiry.
var (
	// ErrNoExpiry: no enabled rule expires every claim check, so they are
	// kept, and paid for, for ever.
	ErrNoExpiry = errors.New("claim checks never expire")
	// ErrExpiresTooSoon: a rule deletes claim checks before a message that
	// points at one may be done with it.
	ErrExpiresTooSoon = errors.New("claim checks expire too soon")
)

// LifecycleGetter is the S3 call CheckExpiry makes.
type LifecycleGetter interface {
	GetBucketLifecycleConfiguration(ctx context.Context, in *s3.GetBucketLifecycleConfigurationInput, optFns ...func(*s3.Options)) (*s3.GetBucketLifecycleConfigurationOutput, error)
}

// CheckExpiry reads the lifecycle configuration of bucket and tells whether
// it expires claim checks as the stack's own bucket does: it returns the id of
// an enabled rule that expires every object under the claim-check prefix
// after ExpiryDays or more, and an error wrapping ErrExpiresTooSoon when any
// enabled rule that reaches claim checks deletes them sooner (or on a fixed
// date), or ErrNoExpiry when no rule expires them all. It changes nothing.
func CheckExpiry(ctx context.Context, client LifecycleGetter, bucket string) (string, error) {
	out, err := client.GetBucketLifecycleConfiguration(ctx, &s3.GetBucketLifecycleConfigurationInput{Bucket: aws.String(bucket)})
	var rules []s3types.LifecycleRule
	var apiErr smithy.APIError
	switch {
	case err == nil:
		rules = out.Rules
	case errors.As(err, &apiErr) && apiErr.ErrorCode() == "NoSuchLifecycleConfiguration":
	default:
		return "", fmt.Errorf("get lifecycle configuration of bucket %s: %w", bucket, err)
	}
	var tooSoon []error
	covering, days := "", int32(0)
	for _, r := range rules {
		if r.Status != s3types.ExpirationStatusEnabled || r.Expiration == nil {
			continue
		}
		prefix, narrowed := RuleScope(r)
		reaches := strings.HasPrefix(config.ClaimCheckPrefix, prefix) || strings.HasPrefix(prefix, config.ClaimCheckPrefix)
		if !reaches {
			continue
		}
		id := aws.ToString(r.ID)
		d := aws.ToInt32(r.Expiration.Days)
		switch {
		case r.Expiration.Date != nil:
			tooSoon = append(tooSoon, fmt.Errorf("rule %q deletes claim checks on %s, whatever their age", id, r.Expiration.Date.Format("2006-01-02")))
			continue
		case d > 0 && d < ExpiryDays:
			tooSoon = append(tooSoon, fmt.Errorf("rule %q deletes claim checks after %d days, before a message can be done with one (%d days)", id, d, ExpiryDays))
			continue
		case d == 0:
			continue // expired object delete markers only
		}
		if !narrowed && strings.HasPrefix(config.ClaimCheckPrefix, prefix) && (covering == "" || d < days) {
			covering, days = id, d
		}
	}
	if len(tooSoon) > 0 {
		return "", fmt.Errorf("bucket %s: %w: %w", bucket, ErrExpiresTooSoon, errors.Join(tooSoon...))
	}
	if covering == "" {
		return "", fmt.Errorf("bucket %s: %w: no enabled lifecycle rule expires every object under %s", bucket, ErrNoExpiry, config.ClaimCheckPrefix)
	}
	return covering, nil
}

// RuleScope returns the key prefix a rule applies to, and whether it is
// narrowed further (by tags or object size), so that it may leave some
// objects under that prefix alone.
func RuleScope(r s3types.LifecycleRule) (prefix string, narrowed bool) {
	//lint:ignore SA1019 rules written before filters existed still carry a top-level prefix
	prefix = aws.ToString(r.Prefix)
	f := r.Filter
	if f == nil {
		return prefix, false
	}
	if f.Prefix != nil {
		prefix = *f.Prefix
	}
	narrowed = f.Tag != nil || f.ObjectSizeGreaterThan != nil || f.ObjectSizeLessThan != nil
	if a := f.And; a != nil {
		if a.Prefix != nil {
			prefix = *a.Prefix
		}
		narrowed = narrowed || len(a.Tags) > 0 || a.ObjectSizeGreaterThan != nil || a.ObjectSizeLessThan != nil
	}
	return prefix, narrowed
}
