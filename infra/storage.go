package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awss3"
	"github.com/aws/jsii-runtime-go"

	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/config"
)

const (
	// claimCheckExpiryDays bounds how long a claim-check payload is kept
	// (see claimcheck.ExpiryDays for why).
	claimCheckExpiryDays = claimcheck.ExpiryDays
	// accessLogExpiryDays bounds how long S3 server access logs are kept.
	accessLogExpiryDays = 90
)

// addStorage imports the bucket named by stack.bucket, or creates one (with a
// generated name) together with a bucket for its server access logs.
//
// An imported bucket is left exactly as it is. Its claim checks need the
// expiry rule the created bucket has, but S3 replaces a bucket's lifecycle
// configuration as a whole: a stack that put the rule would drop the owner's
// other rules, or have them dropped by whatever else manages the bucket. So
// the configuration's check warns instead (config.CheckForDeploy, shown by
// addWarnings), and `changesctl bucket check` reads the bucket's rules.
func (s *changesStack) addStorage() {
	if s.in.bucketGiven {
		s.bucket = awss3.Bucket_FromBucketName(s.stack, jsii.String("DataBucket"), jsii.String(s.cfg.Stack.Bucket))
		return
	}
	accessLogs := awss3.NewBucket(s.stack, jsii.String("AccessLogs"), &awss3.BucketProps{
		BlockPublicAccess: awss3.BlockPublicAccess_BLOCK_ALL(),
		// Server access log delivery supports SSE-S3 only.
		Encryption:        awss3.BucketEncryption_S3_MANAGED,
		EnforceSSL:        jsii.Bool(true),
		MinimumTLSVersion: jsii.Number(1.2),
		LifecycleRules: &[]*awss3.LifecycleRule{{
			Id:         jsii.String("expire-access-logs"),
			Expiration: awscdk.Duration_Days(jsii.Number(accessLogExpiryDays)),
		}},
		RemovalPolicy: s.removalPolicy(),
	})

	s.bucket = awss3.NewBucket(s.stack, jsii.String("DataBucket"), &awss3.BucketProps{
		BlockPublicAccess:      awss3.BlockPublicAccess_BLOCK_ALL(),
		Encryption:             awss3.BucketEncryption_S3_MANAGED,
		EnforceSSL:             jsii.Bool(true),
		MinimumTLSVersion:      jsii.Number(1.2),
		Versioned:              jsii.Bool(false),
		ServerAccessLogsBucket: accessLogs,
		ServerAccessLogsPrefix: jsii.String("data-bucket/"),
		LifecycleRules: &[]*awss3.LifecycleRule{
			{
				Id:         jsii.String(claimcheck.RuleID),
				Prefix:     jsii.String(config.ClaimCheckPrefix),
				Expiration: awscdk.Duration_Days(jsii.Number(claimCheckExpiryDays)),
			},
			{
				Id:                                  jsii.String("abort-incomplete-uploads"),
				AbortIncompleteMultipartUploadAfter: awscdk.Duration_Days(jsii.Number(7)),
			},
		},
		RemovalPolicy: s.removalPolicy(),
	})
}
