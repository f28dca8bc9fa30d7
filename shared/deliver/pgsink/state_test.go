package pgsink

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/delivertest"
)

// stateOf returns the state reader of the output s writes.
func stateOf(t *testing.T, db Querier, s *Sink, out config.PostgresOutput) *State {
	t.Helper()
	st, err := NewState(db, out, s.output)
	if err != nil {
		t.Fatalf("NewState: %v", err)
	}
	return st
}

func TestStateConformance(t *testing.T) {
	t.Parallel()
	t.Run("document mode", func(t *testing.T) {
		t.Parallel()
		delivertest.RunState(t, delivertest.StateHarness{
			Digests: true,
			New: func(t *testing.T) (deliver.Sink, delivertest.StateReader) {
				s, pool := newSink(t)
				return s, stateOf(t, pool, s, config.PostgresOutput{Table: s.names.table})
			},
		})
	})
	t.Run("mapping mode", func(t *testing.T) {
		t.Parallel()
		m := &config.Mapping{Tables: []*config.MappedTable{{Name: "docs", Columns: []*config.MappedColumn{
			{Name: "observed", Path: "observed", Type: "text", Required: true},
		}}}}
		delivertest.RunState(t, delivertest.StateHarness{
			New: func(t *testing.T) (deliver.Sink, delivertest.StateReader) {
				s, pool, schema := newMappedSink(t, nil, m)
				return s, stateOf(t, pool, s, config.PostgresOutput{Schema: schema, Table: mappedOutput, Mapping: m})
			},
		})
	})
}

// TestStateDocumentMode reads tables written by the sink, then tampered
// with behind its back.
func TestStateDocumentMode(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, pool := newSink(t)
	st := stateOf(t, pool, s, config.PostgresOutput{Table: s.names.table})
	var changes []*change.Envelope
	for i, id := range []string{"live", "gone-row", "edited", "deleted", "no-version", "deletion-recorded"} {
		changes = append(changes, live(id, "1-"+id, v(1, int64(i+1))))
	}
	changes = append(changes, deleted("deleted", "2-deleted", v(1, 10)))
	for i, err := range s.Apply(ctx, changes) {
		if err != nil {
			t.Fatalf("apply %d: %v", i, err)
		}
	}
	for _, stmt := range []string{
		`DELETE FROM ` + s.names.data + ` WHERE doc_id = 'gone-row'`,
		`UPDATE ` + s.names.data + ` SET rev = '0-edited' WHERE doc_id = 'edited'`,
		`DELETE FROM ` + s.names.versions + ` WHERE doc_id = 'no-version'`,
		`UPDATE ` + s.names.versions + ` SET deleted = true WHERE doc_id = 'deletion-recorded'`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	want := map[string]deliver.Stored{
		"live":              {ID: "live", Version: v(1, 1), Rev: "1-live", Held: true},
		"gone-row":          {ID: "gone-row", Version: v(1, 2), Rev: "1-gone-row", Problem: `versions table records rev "1-gone-row" but the data row is gone`},
		"edited":            {ID: "edited", Version: v(1, 3), Rev: "0-edited", Held: true, Problem: `versions table records rev "1-edited"`},
		"no-version":        {ID: "no-version", Rev: "1-no-version", Held: true, Problem: "data row without a versions row"},
		"deletion-recorded": {ID: "deletion-recorded", Version: v(1, 6), Rev: "1-deletion-recorded", Held: true, Deleted: true, Problem: `versions table records a deletion (rev "1-deletion-recorded")`},
	}
	got := delivertest.ScanAll(t, st)
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(deliver.Stored{}, "Digest")); diff != "" {
		t.Errorf("Scan (-want +got):\n%s", diff)
	}
	for id, d := range got {
		if (d.Digest != "") != d.Held {
			t.Errorf("%s: digest %q, held %t: want a digest exactly when a data row is held", id, d.Digest, d.Held)
		}
	}
	looked, err := st.Lookup(ctx, []string{"live", "edited", "deleted", "never"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"edited", "live"}, slices.Sorted(maps.Keys(looked))); diff != "" {
		t.Errorf("Lookup found (-want +got):\n%s", diff)
	}
}

// TestStateMappingMode reads what a mapping sink with a filter wrote:
// filtered documents are recorded but not held, deleted ones not listed.
func TestStateMappingMode(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	m := &config.Mapping{
		VersionsTable: "own_versions",
		Filter:        &config.MappingFilter{Path: "type", Equals: json.RawMessage(`"order"`)},
		Tables: []*config.MappedTable{
			{Name: "orders", Columns: []*config.MappedColumn{{Name: "status", Path: "status", Type: "text"}}},
			{Name: "items", Parent: "orders", From: "items", IndexColumn: "idx", Columns: []*config.MappedColumn{
				{Name: "qty", Path: "qty", Type: "integer"},
			}},
		},
	}
	s, pool, schema := newMappedSink(t, nil, m)
	st := stateOf(t, pool, s, config.PostgresOutput{Schema: schema, Table: mappedOutput, Mapping: m})
	doc := func(id, rev string, ver change.Version, body string) *change.Envelope {
		c := live(id, rev, ver)
		c.Doc = json.RawMessage(body)
		return c
	}
	changes := []*change.Envelope{
		doc("mapped", "1-m", v(1, 1), `{"type":"order","status":"open","items":[{"qty":2},{"qty":"3"}]}`),
		doc("filtered", "1-f", v(1, 2), `{"type":"note"}`),
		doc("deleted", "1-d", v(1, 3), `{"type":"order","status":"x"}`),
		deleted("deleted", "2-d", v(1, 4)),
	}
	for _, batch := range [][]*change.Envelope{changes[:3], changes[3:]} {
		for i, err := range s.Apply(ctx, batch) {
			if err != nil {
				t.Fatalf("apply %s: %v", batch[i].DocID, err)
			}
		}
	}
	want := map[string]deliver.Stored{
		"mapped":   {ID: "mapped", Version: v(1, 1), Rev: "1-m", Held: true},
		"filtered": {ID: "filtered", Version: v(1, 2), Rev: "1-f", Filtered: true},
	}
	got, err := st.Lookup(ctx, []string{"mapped", "filtered", "deleted", "never"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Lookup (-want +got):\n%s", diff)
	}

	rows, err := st.Rows(ctx, "mapped")
	if err != nil {
		t.Fatal(err)
	}
	str := func(s string) *string { return &s }
	wantRows := []TableRows{
		{Table: "orders", Columns: []string{"status"}, Values: [][]*string{{str("open")}}},
		{Table: "items", Columns: []string{"idx", "qty"}, Values: [][]*string{{str("0"), str("2")}, {str("1"), str("3")}}},
	}
	if diff := cmp.Diff(wantRows, rows); diff != "" {
		t.Errorf("Rows(mapped) (-want +got):\n%s", diff)
	}
	rows, err = st.Rows(ctx, "deleted")
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range rows {
		if len(tr.Values) != 0 {
			t.Errorf("Rows(deleted): table %s holds %d rows", tr.Table, len(tr.Values))
		}
	}
	if _, _, err := st.Body(ctx, "mapped"); !errors.Is(err, errMode) {
		t.Errorf("Body in mapping mode: %v, want an error saying the mode", err)
	}
}

// TestStateBody reads a document-mode body back.
func TestStateBody(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, pool := newSink(t)
	st := stateOf(t, pool, s, config.PostgresOutput{Table: s.names.table})
	c := live("a", "1-a", v(1, 1))
	c.Doc = json.RawMessage(`{"b": [1, 2.50], "a": "x"}`)
	if err := s.Apply(ctx, []*change.Envelope{c})[0]; err != nil {
		t.Fatal(err)
	}
	body, ok, err := st.Body(ctx, "a")
	if err != nil || !ok {
		t.Fatalf("Body(a) = %s, %t, %v", body, ok, err)
	}
	var got, want any
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	_ = json.Unmarshal(c.Doc, &want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Body(a) (-want +got):\n%s", diff)
	}
	if body, ok, err := st.Body(ctx, "never"); err != nil || ok {
		t.Errorf("Body(never) = %s, %t, %v; want nothing", body, ok, err)
	}
	if _, err := st.Rows(ctx, "a"); !errors.Is(err, errMode) {
		t.Errorf("Rows in document mode: %v, want an error saying the mode", err)
	}
}

// TestStateApplied lists the last change applied to every document,
// deletions included, in both modes.
func TestStateApplied(t *testing.T) {
	t.Parallel()
	m := &config.Mapping{Tables: []*config.MappedTable{{Name: "docs", Columns: []*config.MappedColumn{
		{Name: "observed", Path: "observed", Type: "text"},
	}}}}
	tests := []struct {
		name string
		open func(t *testing.T) (*Sink, *State)
	}{
		{name: "document mode", open: func(t *testing.T) (*Sink, *State) {
			s, pool := newSink(t)
			return s, stateOf(t, pool, s, config.PostgresOutput{Table: s.names.table})
		}},
		{name: "mapping mode", open: func(t *testing.T) (*Sink, *State) {
			s, pool, schema := newMappedSink(t, nil, m)
			return s, stateOf(t, pool, s, config.PostgresOutput{Schema: schema, Table: mappedOutput, Mapping: m})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, st := tt.open(t)
			batches := [][]*change.Envelope{
				{live("a", "1-a", v(1, 1)), live("b", "1-b", v(1, 2)), live("c", "1-c", v(1, 3))},
				{deleted("b", "2-b", v(1, 4)), live("c", "2-c", v(2, 1))},
				{live("c", "1-c", v(1, 3))}, // stale: changes nothing
			}
			for _, b := range batches {
				for i, err := range s.Apply(t.Context(), b) {
					if err != nil {
						t.Fatalf("apply %s: %v", b[i].DocID, err)
					}
				}
			}
			got := map[string]deliver.Stored{}
			if err := st.Applied(t.Context(), func(d deliver.Stored) error {
				got[d.ID] = d
				return nil
			}); err != nil {
				t.Fatalf("Applied: %v", err)
			}
			want := map[string]deliver.Stored{
				"a": {ID: "a", Version: v(1, 1), Rev: "1-a"},
				"b": {ID: "b", Version: v(1, 4), Rev: "2-b", Deleted: true},
				"c": {ID: "c", Version: v(2, 1), Rev: "2-c"},
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Applied (-want +got):\n%s", diff)
			}
			stop := errors.New("stop")
			if err := st.Applied(t.Context(), func(deliver.Stored) error { return stop }); !errors.Is(err, stop) {
				t.Errorf("Applied with fn failing = %v, want fn's error", err)
			}
		})
	}
}

func TestNewStateErrors(t *testing.T) {
	t.Parallel()
	if _, err := NewState(nil, config.PostgresOutput{Table: "t"}, "out-1"); err == nil || !strings.Contains(err.Error(), "db is nil") {
		t.Errorf("NewState without a db: error %v", err)
	}
	long := config.PostgresOutput{Table: strings.Repeat("t", 60)}
	if _, err := NewState(noQueries{}, long, "out-1"); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("NewState of a table too long: error %v", err)
	}
}

// noQueries is a Querier for tests that must not query.
type noQueries struct{ Querier }
