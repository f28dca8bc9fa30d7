package testenv

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/changes-worker/changes-worker/shared/statetable"
)

// StateTable creates a state table of the test's own on the local DynamoDB,
// keyed as the stack's (statetable.Create), and deletes it when the test
// ends. It returns the client and the table name.
func StateTable(t testing.TB) (*dynamodb.Client, string) {
	t.Helper()
	db := dynamodb.NewFromConfig(AWS(t))
	name := Name(t)
	if err := statetable.Create(t.Context(), db, name); err != nil {
		t.Fatalf("state table: %v", err)
	}
	t.Cleanup(func() {
		db.DeleteTable(context.WithoutCancel(t.Context()), &dynamodb.DeleteTableInput{TableName: &name})
	})
	return db, name
}
