package statetable_test

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/changes-worker/changes-worker/shared/statetable"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// What the encoders write, the decoders read back; a missing attribute or
// one of another type reads as the zero value.
func TestValuesRoundTrip(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 23, 10, 0, 0, 123456789, time.FixedZone("x", 3600))
	item := map[string]types.AttributeValue{
		"s": statetable.Str("text"), "n": statetable.Num(-42), "t": statetable.Stamp(at),
		"b": &types.AttributeValueMemberBOOL{Value: true},
	}
	if got := statetable.String(item, "s"); got != "text" {
		t.Errorf("String = %q, want text", got)
	}
	if got := statetable.Int(item, "n"); got != -42 {
		t.Errorf("Int = %d, want -42", got)
	}
	if got := statetable.Time(item, "t"); !got.Equal(at) || got.Location() != time.UTC {
		t.Errorf("Time = %v, want %v in UTC", got, at)
	}
	if got := statetable.String(item, "n"); got != "" {
		t.Errorf("String of a number = %q, want empty", got)
	}
	if got := statetable.Int(item, "b"); got != 0 {
		t.Errorf("Int of a bool = %d, want 0", got)
	}
	if got := statetable.Time(item, "missing"); !got.IsZero() {
		t.Errorf("Time of a missing attribute = %v, want zero", got)
	}
}

// Against DynamoDB Local: Create is idempotent, and ScanPrefix returns the
// items under the prefix and no other.
func TestCreateAndScanPrefix(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, table := testenv.StateTable(t)
	if err := statetable.Create(ctx, db, table); err != nil {
		t.Fatalf("create an existing table: %v", err)
	}
	for _, k := range []string{"job", "halt/job/o/g", "halt/job/o/h", "halt/job/other/g", "quarantine/job/1"} {
		if _, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: &table, Item: statetable.Key(k)}); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	items, err := statetable.ScanPrefix(ctx, db, table, "halt/job/o/")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, it := range items {
		got[statetable.String(it, statetable.KeyAttr)] = true
	}
	if len(got) != 2 || !got["halt/job/o/g"] || !got["halt/job/o/h"] {
		t.Errorf("ScanPrefix = %v, want halt/job/o/g and halt/job/o/h", got)
	}
}
