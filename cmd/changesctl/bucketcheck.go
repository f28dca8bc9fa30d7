package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/dlq"
)

const bucketUsage = `usage: changesctl bucket check --config FILE [-o json|table]

  check   read the stack bucket's lifecycle rules: fail, printing the rule to add,
          unless claim checks (claim-check/) expire after 30 days or more, and
          fail when a rule expires the DLQ archive (dlq-archive/)

It never changes the bucket: S3 replaces a lifecycle configuration as a
whole, and the other rules of a bucket named by stack.bucket are its owner's.
`

// cmdBucket checks the stack bucket. `bucket check` reads its lifecycle
// configuration and fails unless claim checks expire as they do in a bucket
// the stack creates (it prints the rule to add), or when a rule expires the
// DLQ archive. It never changes the bucket:
// S3 replaces a lifecycle configuration as a whole, and an existing bucket's
// other rules are its owner's.
func cmdBucket(ctx context.Context, env *cliEnv, args []string) error {
	return runAction(ctx, env, "bucket", bucketUsage, args, command{"check", cmdBucketCheck})
}

// bucketChecked is what `bucket check -o json` prints: the rule that
// expires claim checks (empty: none, or too soon), whether the DLQ archive
// is kept, and the problem found, if any.
type bucketChecked struct {
	Bucket         string `json:"bucket"`
	ClaimCheckRule string `json:"claim_check_rule"`
	ArchiveKept    bool   `json:"archive_kept"`
	Problem        string `json:"problem,omitempty"`
	// RuleToAdd is the lifecycle configuration of the rule that expires
	// claim checks, when the bucket lacks it.
	RuleToAdd string `json:"rule_to_add,omitempty"`
}

func cmdBucketCheck(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "bucket check")
	sc := scopeFlags(fs, "", "")
	verbose := fs.Bool("v", false, "debug logging")
	asJSON := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("bucket check: unexpected argument %q", fs.Arg(0))
	}
	deps, err := sc.load(ctx, env, *verbose)
	if err != nil {
		return err
	}
	defer deps.Close()
	bucket := deps.Config.Stack.Bucket
	res := bucketChecked{Bucket: bucket}
	report := func(err error) error {
		if *asJSON {
			if err != nil {
				res.Problem = err.Error()
			}
			if jerr := writeJSON(env.stdout, res); jerr != nil && err == nil {
				return jerr
			}
		}
		if err != nil {
			return fmt.Errorf("bucket check: %w", err)
		}
		return nil
	}
	id, err := claimcheck.CheckExpiry(ctx, deps.S3, bucket)
	if errors.Is(err, claimcheck.ErrNoExpiry) || errors.Is(err, claimcheck.ErrExpiresTooSoon) {
		res.RuleToAdd = ruleJSON()
		if !*asJSON {
			fmt.Fprintf(env.stdout, "%v\n\nThe bucket's lifecycle configuration needs this rule, beside its other rules (a put replaces them all):\n%s", err, ruleJSON())
		}
		return report(err)
	}
	if err != nil {
		return report(err)
	}
	res.ClaimCheckRule = id
	if !*asJSON {
		fmt.Fprintf(env.stdout, "bucket %s: claim checks under %s expire (rule %q)\n", bucket, config.ClaimCheckPrefix, id)
	}
	if err := dlq.CheckKept(ctx, deps.S3, bucket); err != nil {
		if errors.Is(err, dlq.ErrArchiveExpires) && !*asJSON {
			fmt.Fprintf(env.stdout, "%v\n\nNo rule may expire objects under %s: the changes archived there wait for changesctl dlq redrive or purge.\n", err, config.ArchivePrefix)
		}
		return report(err)
	}
	res.ArchiveKept = true
	if !*asJSON {
		fmt.Fprintf(env.stdout, "bucket %s: no rule expires the DLQ archive under %s\n", bucket, config.ArchivePrefix)
	}
	return report(nil)
}

// ruleJSON is claimcheck.Rule as the lifecycle configuration that
// `aws s3api put-bucket-lifecycle-configuration` takes.
func ruleJSON() string {
	return fmt.Sprintf(`{
  "Rules": [
    {
      "ID": %q,
      "Status": "Enabled",
      "Filter": {"Prefix": %q},
      "Expiration": {"Days": %d}
    }
  ]
}
`, claimcheck.RuleID, config.ClaimCheckPrefix, claimcheck.ExpiryDays)
}
