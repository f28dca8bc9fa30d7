package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/jsii-runtime-go"

	"github.com/changes-worker/changes-worker/shared/config"
)

// fnVerify is the job's verify function; `make build` builds it into
// <build dir>/verify/bootstrap.
const fnVerify = config.FunctionVerify

const (
	// verifyTimeoutSeconds is the longest timeout Lambda allows: one remote
	// verify, its repair included, must end within it.
	verifyTimeoutSeconds = 900
	// verifyMemoryMB holds the comparison's state (about 200 bytes per
	// document: a million documents in about 200 MB) with room for a page
	// of bodies, and buys the CPU to compare them.
	verifyMemoryMB = 1024
)

// addVerify creates the job's verify function, P-<job>-verify, with a role
// of its own: `changesctl verify --remote` invokes it to compare one of the
// job's outputs with the source, and to repair it, from inside the stack
// (its VPC, with stack.vpc), where both are reachable. Only operators
// invoke it: it has no schedule, event source or alarm, and the poller's
// and writer's roles stay as they are. In the local variant only its role
// and log group exist, as for the other two.
func (js *jobStack) addVerify() {
	js.verify = js.newFunction("Verify", fnVerify, functionOptions{
		description: "changes-worker verify of job " + js.job.ID + ": compares an output with the source and repairs it, for changesctl verify --remote",
		timeout:     verifyTimeoutSeconds,
		memoryMB:    verifyMemoryMB,
	})
	js.grantVerify()
}

// grantVerify lets the verify function read the job's source and the state
// of its outputs that keep one (PostgreSQL through its DSN secret, S3
// through its prefix), and repair them as a poller would queue: under the
// job's lease (its item only), to the job's work queues, with claim checks
// under the job's prefix. It reads no HTTP output's secrets, consumes no
// queue and writes no output.
func (js *jobStack) grantVerify() {
	j, role := js.job, js.verify.role
	// The lease and the pending count the poller recorded (Busy), read and
	// taken by a repair.
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("RepairLease"),
		Actions:   jsii.Strings("dynamodb:GetItem", "dynamodb:UpdateItem"),
		Resources: &[]*string{js.table.TableArn()},
		Conditions: &map[string]any{
			"ForAllValues:StringLike": map[string]any{"dynamodb:LeadingKeys": []string{j.ID}},
		},
	}))
	// The work queue's URL and depth (Busy), and the repair's sends.
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("RepairToWorkQueues"),
		Actions:   jsii.Strings("sqs:GetQueueUrl", "sqs:GetQueueAttributes", "sqs:SendMessage"),
		Resources: js.workQueueARNs(),
	}))
	// A repaired document too large for a message travels as a claim check,
	// as the poller writes it.
	role.AddToPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:       jsii.String("RepairClaimChecks"),
		Actions:   jsii.Strings("s3:PutObject"),
		Resources: &[]*string{js.claimCheckObjects()},
	}))
	js.allowWildcards(nagObjectsReason, js.claimCheckPattern())
	var dsns refSet
	for n, r := range js.routes {
		o := r.out
		switch {
		case o.Postgres != nil:
			dsns.add(&o.Postgres.DSN)
		case o.S3 != nil:
			// The state reader lists the prefix and reads each object's
			// metadata (HEAD) and, to compare content, its body.
			js.grantS3Output(role, n, o, "ReadS3Output", "s3:GetObject")
		}
	}
	sources, _ := jobSecretRefs(j)
	js.grantSecrets(role, sources)
	js.grantSecrets(role, dsns.sorted())
}
