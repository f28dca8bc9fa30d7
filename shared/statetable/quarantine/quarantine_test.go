package quarantine_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/statetable/quarantine"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

func TestRecordAndList(t *testing.T) {
	t.Parallel()
	db, table := testenv.StateTable(t)
	now := time.Date(2026, 11, 3, 10, 0, 0, 0, time.UTC)
	s := &quarantine.Store{DB: db, Table: table, Clock: func() time.Time { return now }}
	ctx := t.Context()
	row := quarantine.Entry{Job: "orders", Kind: quarantine.Row, Seq: json.RawMessage(`"12:40"`), After: json.RawMessage(`"12:39"`),
		Reason: "the row has no id", Raw: []byte(`{"seq":"12:40","changes":[]}`), Attempts: 3}
	noSeq := quarantine.Entry{Job: "orders", Kind: quarantine.Row, After: json.RawMessage(`"12:40"`),
		Reason: "the row is not a JSON object", Raw: []byte(strings.Repeat("\xff", 3*quarantine.RawMax))}
	page := quarantine.Entry{Job: "orders", Kind: quarantine.Page, Seq: json.RawMessage(`"12:41"`), Reason: "changes: malformed response: x"}
	other := quarantine.Entry{Job: "orders-2", Kind: quarantine.Page, Reason: "elsewhere"}
	for _, e := range []quarantine.Entry{row, noSeq, page, other} {
		if err := s.Record(ctx, e); err != nil {
			t.Fatalf("Record: %v", err)
		}
		now = now.Add(time.Second)
	}
	// The page fails again later: one more attempt, first seen kept.
	now = now.Add(time.Minute)
	if err := s.Record(ctx, page); err != nil {
		t.Fatalf("Record again: %v", err)
	}
	got, err := quarantine.List(ctx, db, table, "orders")
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	t0 := time.Date(2026, 11, 3, 10, 0, 0, 0, time.UTC)
	row.FirstSeen, row.LastSeen = t0, t0
	noSeq.Raw, noSeq.Attempts, noSeq.FirstSeen, noSeq.LastSeen = noSeq.Raw[:quarantine.RawMax], 1, t0.Add(time.Second), t0.Add(time.Second)
	page.Attempts, page.FirstSeen, page.LastSeen = 2, t0.Add(2*time.Second), t0.Add(64*time.Second)
	if diff := cmp.Diff([]quarantine.Entry{row, noSeq, page}, got); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
}

func TestKey(t *testing.T) {
	t.Parallel()
	long := json.RawMessage(`"` + strings.Repeat("9", 2000) + `"`)
	tests := []struct {
		e    quarantine.Entry
		want string
	}{
		{quarantine.Entry{Job: "j", Kind: quarantine.Row, Seq: json.RawMessage(`17`)}, "quarantine/j/17"},
		{quarantine.Entry{Job: "j", Kind: quarantine.Row, Seq: json.RawMessage(`"3::17"`)}, `quarantine/j/"3::17"`},
		{quarantine.Entry{Job: "j", Kind: quarantine.Page, Seq: json.RawMessage(` "12-g1A" `)}, `quarantine/j/page "12-g1A"`},
		{quarantine.Entry{Job: "j", Kind: quarantine.Page}, `quarantine/j/page beginning`},
		{quarantine.Entry{Job: "j", Kind: quarantine.Row, After: json.RawMessage(`5`), Raw: []byte(`[1]`)}, "quarantine/j/after 5 "},
		{quarantine.Entry{Job: "j", Kind: quarantine.Row, Seq: long}, "quarantine/j/sha256:"},
		{quarantine.Entry{Job: "j", Kind: quarantine.Attachment, Seq: json.RawMessage(`17`), Raw: []byte(`{"f":{}}`)}, "quarantine/j/attachment 17 "},
	}
	for _, tt := range tests {
		if got := tt.e.Key(); !strings.HasPrefix(got, tt.want) || len(got) > 600 {
			t.Errorf("Key(%s %s) = %q, want %q…", tt.e.Kind, tt.e.Seq, got, tt.want)
		}
	}
	a := quarantine.Entry{Job: "j", Kind: quarantine.Row, After: json.RawMessage(`5`), Raw: []byte(`[1]`)}
	b := a
	b.Raw = []byte(`[2]`)
	if a.Key() == b.Key() {
		t.Errorf("two different rows after the same position share key %q", a.Key())
	}
}
