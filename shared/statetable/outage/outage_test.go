package outage_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/statetable/outage"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// Against DynamoDB Local: two writers' marks make one record with the first
// Since, the last error and the sum of what they held; Clear removes it, and
// clearing again does nothing.
func TestStoreLifecycle(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, name := testenv.StateTable(t)
	s := &outage.Store{DB: db, Table: name}
	t0 := time.Date(2026, 11, 26, 8, 0, 0, 0, time.UTC)
	if got, err := s.Get(ctx, "j", "o"); err != nil || got != nil {
		t.Fatalf("before any mark: %+v, %v", got, err)
	}
	for _, st := range []outage.State{
		{Job: "j", Output: "o", Since: t0, LastAt: t0, LastError: "transient connection: refused", Held: 4},
		{Job: "j", Output: "o", Since: t0.Add(time.Minute), LastAt: t0.Add(2 * time.Minute), LastError: "transient connection: reset", Held: 6},
	} {
		if err := s.Mark(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Get(ctx, "j", "o")
	if err != nil {
		t.Fatal(err)
	}
	want := &outage.State{Job: "j", Output: "o", Since: t0, LastAt: t0.Add(2 * time.Minute), LastError: "transient connection: reset", Held: 10}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("record (-want +got):\n%s", d)
	}
	for i, want := range []bool{true, false} {
		cleared, err := s.Clear(ctx, "j", "o")
		if err != nil {
			t.Fatal(err)
		}
		if cleared != want {
			t.Errorf("clear %d: cleared %v, want %v", i+1, cleared, want)
		}
	}
	if got, err := s.Get(ctx, "j", "o"); err != nil || got != nil {
		t.Errorf("after clear: %+v, %v", got, err)
	}
}
