package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// addChecks runs cdk-nag's AwsSolutions rules over every stack of app at
// synth, nested stacks included. An unsuppressed finding of error level is
// reported as an error annotation, which fails `cdk synth` and `cdk deploy`.
func addChecks(app awscdk.App) {
	awscdk.Aspects_Of(app).Add(cdknag.NewAwsSolutionsChecks(&cdknag.NagPackProps{Verbose: jsii.Bool(true)}), nil)
}

// suppress records, on c and its children, why a cdk-nag rule does not apply.
func suppress(c constructs.IConstruct, rule, reason string) {
	cdknag.NagSuppressions_AddResourceSuppressions(c, &[]*cdknag.NagPackSuppression{{
		Id:     jsii.String(rule),
		Reason: jsii.String(reason),
	}}, jsii.Bool(true))
}

// Why the wildcards cdk-nag finds (AwsSolutions-IAM5) in a job's policies
// are needed.
const (
	nagObjectsReason = "Object grants end in a prefix and '*': claim checks, attachments and archived DLQ messages have generated keys and S3 outputs one key per document; " +
		"each grant is confined to this job's claim-check/<job>/<stack prefix>/ prefix of the stack bucket (to read, claim-check/<job>/), its dlq-archive/<stack prefix>/<job>/ prefix, its attachments prefix or one output's s3.prefix."
	nagVPCReason = "Lambda creates and deletes the function's network interfaces in the configured subnets with the execution role; " +
		"ec2:DescribeNetworkInterfaces and ec2:DescribeSubnets support no resource-level permissions."
	nagMappingsReason = "The writer turns its own event source mappings off and on: lambda:ListEventSourceMappings supports no resource-level permissions, " +
		"and mapping ids are generated, so lambda:UpdateEventSourceMapping is granted on every mapping under the condition lambda:FunctionArn, the writer's own function."
)

// allowWildcards accepts AwsSolutions-IAM5 findings in the job's stack whose
// finding matches the regular expression pattern (e.g. a resource ARN ending
// in a prefix and "*"), for the reason given; any other wildcard is still
// reported. The suppressions are recorded on the job's stack when it is
// complete (suppressFindings), so that they also cover the policies the CDK
// splits off a role whose policy outgrows its size limit.
func (js *jobStack) allowWildcards(reason, pattern string) {
	if js.wildcards == nil {
		js.wildcards = map[string][]string{}
	}
	for _, p := range js.wildcards[reason] {
		if p == pattern {
			return
		}
	}
	js.wildcards[reason] = append(js.wildcards[reason], pattern)
}

// suppressFindings records the job's accepted wildcards on its stack, one
// suppression per reason, each naming the patterns it covers.
func (js *jobStack) suppressFindings() {
	var suppressions []*cdknag.NagPackSuppression
	for _, reason := range []string{nagObjectsReason, nagVPCReason, nagMappingsReason} {
		patterns := js.wildcards[reason]
		if len(patterns) == 0 {
			continue
		}
		appliesTo := make([]any, 0, len(patterns))
		for _, p := range patterns {
			appliesTo = append(appliesTo, &cdknag.RegexAppliesTo{Regex: jsii.String("/" + p + "/")})
		}
		suppressions = append(suppressions, &cdknag.NagPackSuppression{
			Id:        jsii.String("AwsSolutions-IAM5"),
			Reason:    jsii.String(reason),
			AppliesTo: &appliesTo,
		})
	}
	if len(suppressions) > 0 {
		cdknag.NagSuppressions_AddStackSuppressions(js.stack, &suppressions, jsii.Bool(false))
	}
}
