package lease_test

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/changes-worker/changes-worker/shared/statetable"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// TestHolderVersion: a take writes the taker's version into the job item,
// beside the owner, as holder_version {owner, version}, and Get reads it as
// the holder's. A test binary has no stamped version, so it writes "devel".
// A take by a release that records no version (before 1.0.0) leaves the
// map naming the owner before it: the holder's version is then unknown,
// never the previous holder's.
func TestHolderVersion(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, table := testenv.StateTable(t)
	s := lease.New(db, table)
	if _, _, err := s.Acquire(ctx, "job", "a", "host-a", time.Minute); err != nil {
		t.Fatal(err)
	}
	out, err := db.GetItem(ctx, &dynamodb.GetItemInput{TableName: &table, Key: statetable.Key("job"), ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	hv, ok := out.Item["holder_version"].(*types.AttributeValueMemberM)
	if !ok {
		t.Fatalf("the job item has no holder_version map after a take; its attributes: %v", slices.Sorted(maps.Keys(out.Item)))
	}
	if owner, v := statetable.String(hv.Value, "owner"), statetable.String(hv.Value, "version"); owner != "a" || v != "devel" {
		t.Errorf("holder_version is {owner %q, version %q}, want {a, devel}", owner, v)
	}
	st, err := s.Get(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if st.HolderVersion != "devel" {
		t.Errorf("Get: holder version %q, want devel", st.HolderVersion)
	}

	// The previous release's take: its update, which sets no version.
	_, err = db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &table, Key: statetable.Key("job"),
		UpdateExpression:         aws.String("SET #owner = :owner, #host = :host, #gen = #gen + :one, #released = :false"),
		ExpressionAttributeNames: map[string]string{"#owner": "owner", "#host": "owner_host", "#gen": "generation", "#released": "released"},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":owner": statetable.Str("older"), ":host": statetable.Str("host-b"), ":one": statetable.Num(1),
			":false": &types.AttributeValueMemberBOOL{Value: false},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if st, err = s.Get(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	if st.Owner != "older" || st.HolderVersion != "" {
		t.Errorf("after an older release's take: owner %q holder version %q, want older and none", st.Owner, st.HolderVersion)
	}
}
