package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	cwconfig "github.com/changes-worker/changes-worker/shared/config"
)

// accountTimeout bounds the one sts:GetCallerIdentity call that names the
// account: an STS that does not answer costs a command at most this long.
const accountTimeout = 2 * time.Second

// callerIdentity is the STS call that names the account.
type callerIdentity interface {
	GetCallerIdentity(ctx context.Context, in *sts.GetCallerIdentityInput, optFns ...func(*sts.Options)) (*sts.GetCallerIdentityOutput, error)
}

// announceAWS writes to w, in one line, which AWS a command is about to talk
// to: awsNotice of cfg, with the account where accountOf asks for it.
func announceAWS(ctx context.Context, w io.Writer, cfg aws.Config, lookup func(string) (string, bool)) {
	fmt.Fprintln(w, awsNotice(cfg, lookup, accountOf(ctx, cfg, sts.NewFromConfig(cfg))))
}

// accountOf names the account (see account) when cfg sends STS calls to AWS
// itself, and is empty when an endpoint setting sends them elsewhere. On AWS
// the account is what tells one AWS from another, and STS answers one call
// at once; elsewhere the endpoint already says where the calls go, an
// emulator's account is a made-up one, and the call costs what that
// endpoint makes it cost (LocalStack loads its STS at the first call:
// seconds on a busy machine).
func accountOf(ctx context.Context, cfg aws.Config, id callerIdentity) string {
	if sts.NewFromConfig(cfg).Options().BaseEndpoint != nil {
		return ""
	}
	return account(ctx, id)
}

// serviceEndpoints are the services changesctl's clients call, each with its
// setting and the endpoint the SDK resolves for it from cfg (the general
// endpoint, or the service's own in the environment or the shared config).
var serviceEndpoints = []struct {
	name, env string
	endpoint  func(aws.Config) *string
}{
	{"SQS", "AWS_ENDPOINT_URL_SQS", func(c aws.Config) *string { return sqs.NewFromConfig(c).Options().BaseEndpoint }},
	{"DynamoDB", "AWS_ENDPOINT_URL_DYNAMODB", func(c aws.Config) *string { return dynamodb.NewFromConfig(c).Options().BaseEndpoint }},
	{"S3", "AWS_ENDPOINT_URL_S3", func(c aws.Config) *string { return s3.NewFromConfig(c).Options().BaseEndpoint }},
	{"Secrets Manager", "AWS_ENDPOINT_URL_SECRETS_MANAGER", func(c aws.Config) *string {
		return secretsmanager.NewFromConfig(c).Options().BaseEndpoint
	}},
	{"CloudFormation", "AWS_ENDPOINT_URL_CLOUDFORMATION", func(c aws.Config) *string {
		return cloudformation.NewFromConfig(c).Options().BaseEndpoint
	}},
	{"EventBridge", "AWS_ENDPOINT_URL_EVENTBRIDGE", func(c aws.Config) *string { return eventbridge.NewFromConfig(c).Options().BaseEndpoint }},
}

// awsNotice is the line that names the AWS a command talks to: the general
// endpoint and the setting it came from (or AWS itself when there is
// none), each service endpoint that differs from it, the region and, unless
// it is empty, acct (what accountOf returned):
//
//	changesctl: AWS endpoint http://127.0.0.1:4566 (AWS_ENDPOINT_URL), S3 http://127.0.0.1:4567 (AWS_ENDPOINT_URL_S3), region us-east-1
//	changesctl: AWS endpoint: AWS itself (no AWS_ENDPOINT_URL), region eu-west-1, account 123456789012
//
// Endpoints are shown without user information, query or fragment.
func awsNotice(cfg aws.Config, lookup func(string) (string, bool), acct string) string {
	parts := make([]string, 0, len(serviceEndpoints)+3)
	general := cfg.BaseEndpoint
	if general == nil {
		parts = append(parts, "changesctl: AWS endpoint: AWS itself (no AWS_ENDPOINT_URL)")
	} else {
		parts = append(parts, "changesctl: AWS endpoint "+shownEndpoint(*general)+" ("+endpointSource(cfg, "AWS_ENDPOINT_URL", *general, lookup)+")")
	}
	for _, s := range serviceEndpoints {
		e := s.endpoint(cfg)
		if e == nil || (general != nil && *e == *general) {
			continue
		}
		parts = append(parts, s.name+" "+shownEndpoint(*e)+" ("+endpointSource(cfg, s.env, *e, lookup)+")")
	}
	if cfg.Region == "" {
		parts = append(parts, "no region")
	} else {
		parts = append(parts, "region "+cfg.Region)
	}
	if acct != "" {
		parts = append(parts, acct)
	}
	return strings.Join(parts, ", ")
}

// endpointSource names the setting an endpoint came from: the environment
// variable env when it holds it, else the shared config's profile.
func endpointSource(cfg aws.Config, env, endpoint string, lookup func(string) (string, bool)) string {
	if v, ok := lookup(env); ok && v == endpoint {
		return env
	}
	for _, src := range cfg.ConfigSources {
		if sc, ok := src.(config.SharedConfig); ok && sc.Profile != "" {
			return "profile " + sc.Profile + " of the shared config"
		}
	}
	return "the shared config"
}

// shownEndpoint is an endpoint URL as it may be printed.
func shownEndpoint(u string) string {
	if s, ok := cwconfig.ShownURL(u); ok {
		return s
	}
	return "(not a URL)"
}

// account names the account the credentials belong to, as STS answers
// within accountTimeout, or says why it is unknown. One attempt: the SDK's
// retries would outlast the bound.
func account(ctx context.Context, id callerIdentity) string {
	ctx, cancel := context.WithTimeout(ctx, accountTimeout)
	defer cancel()
	out, err := id.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{}, func(o *sts.Options) { o.RetryMaxAttempts = 1 })
	switch {
	case err != nil:
		return "account unknown (" + err.Error() + ")"
	case out.Account == nil:
		return "account unknown (STS named none)"
	}
	return "account " + *out.Account
}
