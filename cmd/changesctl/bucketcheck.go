package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/dlq"
)

// cmdBucket checks the stack bucket. `bucket check` reads its lifecycle
// configuration and fails unless claim checks expire as they do in a bucket
// the stack creates (it prints the rule to add), or when a rule expires the
// DLQ archive. It never changes the bucket:
// S3 replaces a lifecycle configuration as a whole, and an existing bucket's
// other rules are its owner's.
func cmdBucket(ctx context.Context, env *cliEnv, args []string) error {
	if len(args) == 0 || args[0] != "check" {
		return errors.New("bucket: usage: changesctl bucket check --config FILE")
	}
	fs := newFlags(env, "bucket check")
	sc := scopeFlags(fs, "", "")
	verbose := fs.Bool("v", false, "debug logging")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bucket check: unexpected argument %q", fs.Arg(0))
	}
	deps, err := sc.load(ctx, env, *verbose)
	if err != nil {
		return err
	}
	defer deps.Close()
	bucket := deps.Config.Stack.Bucket
	id, err := claimcheck.CheckExpiry(ctx, deps.S3, bucket)
	if errors.Is(err, claimcheck.ErrNoExpiry) || errors.Is(err, claimcheck.ErrExpiresTooSoon) {
		fmt.Fprintf(env.stdout, "%v\n\nThe bucket's lifecycle configuration needs this rule, beside its other rules (a put replaces them all):\n%s", err, ruleJSON())
		return fmt.Errorf("bucket check: %w", err)
	}
	if err != nil {
		return fmt.Errorf("bucket check: %w", err)
	}
	fmt.Fprintf(env.stdout, "bucket %s: claim checks under %s expire (rule %q)\n", bucket, config.ClaimCheckPrefix, id)
	if err := dlq.CheckKept(ctx, deps.S3, bucket); err != nil {
		if errors.Is(err, dlq.ErrArchiveExpires) {
			fmt.Fprintf(env.stdout, "%v\n\nNo rule may expire objects under %s: the changes archived there wait for changesctl dlq redrive or purge.\n", err, config.ArchivePrefix)
		}
		return fmt.Errorf("bucket check: %w", err)
	}
	fmt.Fprintf(env.stdout, "bucket %s: no rule expires the DLQ archive under %s\n", bucket, config.ArchivePrefix)
	return nil
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
