package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2/awsdynamodb"
	"github.com/aws/jsii-runtime-go"
)

// stateKey is the partition key of the state table: one item per job holding
// its lease and checkpoint.
const stateKey = "job_id"

// addState creates the state table under the name the functions look for.
// Its removal policy keeps it when the stack is deleted (stack.retain); it
// has no deletion protection, which would make the rollback of a failed
// first deploy fail on it.
func (s *changesStack) addState() {
	s.table = awsdynamodb.NewTable(s.stack, jsii.String("State"), &awsdynamodb.TableProps{
		TableName:    jsii.String(s.cfg.TableName()),
		PartitionKey: &awsdynamodb.Attribute{Name: jsii.String(stateKey), Type: awsdynamodb.AttributeType_STRING},
		BillingMode:  awsdynamodb.BillingMode_PAY_PER_REQUEST,
		PointInTimeRecoverySpecification: &awsdynamodb.PointInTimeRecoverySpecification{
			PointInTimeRecoveryEnabled: jsii.Bool(true),
		},
		Encryption:         awsdynamodb.TableEncryption_AWS_MANAGED,
		DeletionProtection: jsii.Bool(false),
		RemovalPolicy:      s.removalPolicy(),
	})
}
