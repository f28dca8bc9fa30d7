package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// addChecks runs cdk-nag's AwsSolutions rules over every stack of app at
// synth. An unsuppressed finding of error level is reported as an error
// annotation, which fails `cdk synth` and `cdk deploy`.
func addChecks(app awscdk.App) {
	awscdk.Aspects_Of(app).Add(cdknag.NewAwsSolutionsChecks(&cdknag.NagPackProps{Verbose: jsii.Bool(true)}), nil)
}

// suppress records, on c and its children, why a cdk-nag rule does not apply.
func (s *changesStack) suppress(c constructs.IConstruct, rule, reason string) {
	cdknag.NagSuppressions_AddResourceSuppressions(c, &[]*cdknag.NagPackSuppression{{
		Id:     jsii.String(rule),
		Reason: jsii.String(reason),
	}}, jsii.Bool(true))
}

// suppressWildcards accepts AwsSolutions-IAM5 findings on c's policies whose
// finding matches one of the regular expressions (e.g. a resource ARN ending
// in a prefix and "*"); any other wildcard is still reported.
func (s *changesStack) suppressWildcards(c constructs.IConstruct, reason string, patterns ...string) {
	appliesTo := make([]any, 0, len(patterns))
	for _, p := range patterns {
		appliesTo = append(appliesTo, &cdknag.RegexAppliesTo{Regex: jsii.String("/" + p + "/")})
	}
	cdknag.NagSuppressions_AddResourceSuppressions(c, &[]*cdknag.NagPackSuppression{{
		Id:        jsii.String("AwsSolutions-IAM5"),
		Reason:    jsii.String(reason),
		AppliesTo: &appliesTo,
	}}, jsii.Bool(true))
}
