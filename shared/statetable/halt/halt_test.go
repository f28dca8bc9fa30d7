package halt_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/changes-worker/changes-worker/shared/statetable"
	"github.com/changes-worker/changes-worker/shared/statetable/halt"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

func newStore(t *testing.T) *halt.Store {
	t.Helper()
	db, name := testenv.StateTable(t)
	// A job item beside the halt items: List must not return it.
	if _, err := db.PutItem(t.Context(), &dynamodb.PutItemInput{TableName: &name,
		Item: map[string]types.AttributeValue{"job_id": &types.AttributeValueMemberS{Value: "j"}}}); err != nil {
		t.Fatal(err)
	}
	return &halt.Store{DB: db, Table: name}
}

// Against DynamoDB Local: attempts accumulate on the same message with its
// first time kept, the operator's request survives the writer's next record,
// a halt at another message replaces the record, and Clear removes only the
// record of the message it names.
func TestStoreLifecycle(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newStore(t)
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	st := halt.State{Job: "j", Output: "o", Group: "o", MessageID: "m1", ReceiptHandle: "rh1", DocID: "x", Rev: "1-a", Seq: `"12-g1"`,
		Class: "permanent", Reason: "http_status", Error: "permanent http_status (http 400): no", HTTPStatus: 400,
		Since: t0, LastAt: t0, Body: `{"v":1}`}
	if _, err := s.Record(ctx, st); err != nil {
		t.Fatal(err)
	}
	st.Since, st.LastAt, st.ReceiptHandle = t0.Add(time.Minute), t0.Add(time.Minute), "rh2"
	got, err := s.Record(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	if got.Attempts != 2 || !got.Since.Equal(t0) || !got.LastAt.Equal(t0.Add(time.Minute)) || got.ReceiptHandle != "rh2" ||
		got.Seq != `"12-g1"` || got.HTTPStatus != 400 || got.Body != `{"v":1}` {
		t.Errorf("after two records: %+v", got)
	}
	if _, err := s.Request(ctx, "j", "o", "o", "other", halt.Skip, t0); !errors.Is(err, halt.ErrNotHalted) {
		t.Errorf("request for another message: %v, want ErrNotHalted", err)
	}
	if _, err := s.Request(ctx, "j", "o", "o", "m1", halt.Skip, t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got, err = s.Record(ctx, st); err != nil || got.Action != halt.Skip || got.Attempts != 3 {
		t.Errorf("record after a request: %+v, %v; want the skip kept and 3 attempts", got, err)
	}
	// Another group halts later; List returns both, oldest first, and no
	// job item.
	other := st
	other.Group, other.MessageID, other.Since = "x2", "m9", t0.Add(time.Hour)
	if _, err := s.Record(ctx, other); err != nil {
		t.Fatal(err)
	}
	list, err := s.List(ctx, "j", "o")
	if err != nil || len(list) != 2 || list[0].Group != "o" || list[1].Group != "x2" {
		t.Fatalf("list = %+v, %v", list, err)
	}
	// A halt at another message of the group starts afresh.
	st.MessageID, st.Since = "m2", t0.Add(3*time.Hour)
	if got, err = s.Record(ctx, st); err != nil || got.Attempts != 1 || got.Action != halt.None || !got.Since.Equal(t0.Add(3*time.Hour)) {
		t.Errorf("record of a new message: %+v, %v", got, err)
	}
	if err := s.Clear(ctx, "j", "o", "o", "m1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(ctx, "j", "o", "o"); got == nil || got.MessageID != "m2" {
		t.Errorf("clear of an old message removed the record: %+v", got)
	}
	if err := s.Clear(ctx, "j", "o", "o", "m2"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "j", "o", "o"); got != nil || err != nil {
		t.Errorf("after clear: %+v, %v", got, err)
	}
	if err := s.Clear(ctx, "j", "o", "o", "m2"); err != nil {
		t.Errorf("clear of a gone record: %v", err)
	}
	// A body too large for an item is not kept.
	st.MessageID, st.Body = "m3", strings.Repeat("x", halt.MaxBody+1)
	if got, err = s.Record(ctx, st); err != nil || got.Body != "" {
		t.Errorf("record with a large body: body %d bytes, %v", len(got.Body), err)
	}
}

// Against DynamoDB Local: Check follows the records through the output's
// index. An output that never halted is Unhalted; it is Halted while any
// group has a record, Resumed once (and only once) after its last record
// was cleared, then Unhalted again; a group whose record was deleted by hand
// is dropped from the index. List never returns the index.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newStore(t)
	check := func(want halt.OutputStatus) {
		t.Helper()
		got, err := s.Check(ctx, "j", "o")
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("Check = %d, want %d", got, want)
		}
	}
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	rec := func(group, msg string) {
		t.Helper()
		if _, err := s.Record(ctx, halt.State{Job: "j", Output: "o", Group: group, MessageID: msg, Class: "permanent", Reason: "http_status", Since: t0, LastAt: t0}); err != nil {
			t.Fatal(err)
		}
	}
	clear := func(group, msg string) {
		t.Helper()
		if err := s.Clear(ctx, "j", "o", group, msg); err != nil {
			t.Fatal(err)
		}
	}
	check(halt.Unhalted)
	rec("a", "m1")
	rec("b", "m2")
	rec("b", "m3") // another message of b replaces its record
	check(halt.Halted)
	if list, err := s.List(ctx, "j", "o"); err != nil || len(list) != 2 {
		t.Errorf("List = %+v, %v; want the two groups only", list, err)
	}
	clear("a", "m1")
	clear("b", "m2") // about another message: b stays halted
	check(halt.Halted)
	clear("b", "m3")
	check(halt.Resumed)
	check(halt.Unhalted)

	// A record deleted by hand: the index drops its group.
	rec("c", "m4")
	if _, err := s.DB.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: &s.Table, Key: statetable.Key(halt.Key("j", "o", "c"))}); err != nil {
		t.Fatal(err)
	}
	check(halt.Resumed)
	check(halt.Unhalted)
	// Another output's index is its own.
	if got, err := s.Check(ctx, "j", "o2"); err != nil || got != halt.Unhalted {
		t.Errorf("Check of another output = %d, %v; want Unhalted", got, err)
	}
}
