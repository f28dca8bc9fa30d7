package pgsink

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/delivertest"
)

// withBody returns a live change of id carrying body.
func withBody(id, rev string, ver change.Version, body string) *change.Envelope {
	c := live(id, rev, ver)
	c.Doc = json.RawMessage(body)
	return c
}

// sourceDocs returns the source documents of changes, as CompareContent
// takes them.
func sourceDocs(changes ...*change.Envelope) []deliver.SourceDoc {
	docs := make([]deliver.SourceDoc, len(changes))
	for i, c := range changes {
		docs[i] = deliver.SourceDoc{ID: c.DocID, Rev: c.Rev, Body: c.Doc}
	}
	return docs
}

// TestCompareContentDocumentMode tampers with bodies written by the sink
// and compares them with the source bodies.
func TestCompareContentDocumentMode(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, pool := newSink(t)
	st := stateOf(t, pool, s, config.PostgresOutput{Table: s.names.table})
	changes := []*change.Envelope{
		withBody("same", "1-s", v(1, 1), `{"_id":"same","_rev":"1-s","n":1.50,"tags":["a","b"],"o":{"x":null}}`),
		withBody("tampered", "1-t", v(1, 2), `{"_id":"tampered","_rev":"1-t","total":10}`),
		withBody("row-gone", "1-g", v(1, 3), `{"_id":"row-gone","_rev":"1-g"}`),
		withBody("nul", "1-n", v(1, 4), `{"_id":"nul","_rev":"1-n","s":"x"}`),
	}
	for i, err := range s.Apply(ctx, changes) {
		if err != nil {
			t.Fatalf("apply %s: %v", changes[i].DocID, err)
		}
	}
	for _, stmt := range []string{
		`UPDATE ` + s.names.data + ` SET body = jsonb_set(body, '{total}', '11') WHERE doc_id = 'tampered'`,
		`DELETE FROM ` + s.names.data + ` WHERE doc_id = 'row-gone'`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	source := sourceDocs(changes...)
	// The same content written otherwise: members reordered, other spacing,
	// 1.50 as 1.5, an escaped character.
	source[0].Body = json.RawMessage(`{ "o": {"x": null}, "tags": ["\u0061", "b"], "n": 1.5, "_rev": "1-s", "_id": "same" }`)
	// A body PostgreSQL refuses as jsonb cannot be what the output holds.
	source[3].Body = json.RawMessage(`{"_id":"nul","_rev":"1-n","s":"x\u0000"}`)

	delivertest.CheckContent(t, st, source, map[string]string{
		"tampered": "the stored body differs from the source's",
		"row-gone": "no data row",
		"nul":      "the source body cannot be stored as jsonb (sqlstate 22P05)",
	})
}

// TestCompareContentMappingMode maps source bodies as the sink does and
// compares the rows with those stored, tampered with behind its back.
func TestCompareContentMappingMode(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	m := &config.Mapping{
		Filter: &config.MappingFilter{Path: "type", Equals: json.RawMessage(`"order"`)},
		Tables: []*config.MappedTable{
			{Name: "orders", Columns: []*config.MappedColumn{
				{Name: "total", Path: "total", Type: "numeric"},
				{Name: "at", Path: "at", Type: "timestamptz"},
				{Name: "paid", Path: "paid", Type: "boolean"},
				{Name: "extra", Path: "extra", Type: "jsonb"},
				{Name: "code", Path: "code", Type: "integer", OnError: "reject"},
			}},
			{Name: "items", Parent: "orders", From: "items", IndexColumn: "idx", Columns: []*config.MappedColumn{
				{Name: "sku", Path: "sku", Type: "text"},
				{Name: "qty", Path: "qty", Type: "integer"},
			}},
		},
	}
	s, pool, schema := newMappedSink(t, nil, m)
	st := stateOf(t, pool, s, config.PostgresOutput{Schema: schema, Table: mappedOutput, Mapping: m})
	order := func(id string) *change.Envelope {
		return withBody(id, "1-"+id, v(1, 1), `{"type":"order","total":"12.50","at":"2024-05-01T10:00:00+02:00","paid":"true",
			"extra":{"b":1,"a":[1,2]},"code":7,"items":[{"sku":"x","qty":2},{"sku":"y","qty":"3"}]}`)
	}
	changes := []*change.Envelope{
		order("same"), order("qty-changed"), order("item-gone"), order("item-added"), order("order-gone"),
		withBody("note", "1-note", v(1, 2), `{"type":"note","total":1}`),
		order("refused"),
	}
	for i, err := range s.Apply(ctx, changes) {
		if err != nil {
			t.Fatalf("apply %s: %v", changes[i].DocID, err)
		}
	}
	items, orders := quote(schema)+".items", quote(schema)+".orders"
	for _, stmt := range []string{
		`UPDATE ` + items + ` SET qty = 4 WHERE doc_id = 'qty-changed' AND idx = 1`,
		`DELETE FROM ` + items + ` WHERE doc_id = 'item-gone' AND idx = 0`,
		`INSERT INTO ` + items + ` (doc_id, idx, sku, qty) VALUES ('item-added', 2, 'z', 1)`,
		`DELETE FROM ` + orders + ` WHERE doc_id = 'order-gone'`,
		// A filtered document must have no rows.
		`INSERT INTO ` + orders + ` (doc_id, total) VALUES ('note', 1)`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	source := sourceDocs(changes...)
	// The same rows from a body written otherwise: 12.5 for 12.50, the
	// same instant in UTC, true for "true", the jsonb value reordered.
	source[0].Body = json.RawMessage(`{"items":[{"qty":"2","sku":"x"},{"sku":"y","qty":3}],"code":"7","extra":{"a":[1,2],"b":1},
		"paid":true,"at":"2024-05-01T08:00:00Z","total":12.5,"type":"order"}`)
	// A value the reject column cannot take.
	source[6].Body = json.RawMessage(`{"type":"order","code":"seven"}`)

	got, err := st.CompareContent(ctx, source)
	if err != nil {
		t.Fatalf("CompareContent: %v", err)
	}
	want := map[string]string{
		"qty-changed": "table items: 1 stored rows the mapping does not produce, 1 mapped rows not stored",
		"item-gone":   "table items: 0 stored rows the mapping does not produce, 1 mapped rows not stored",
		"item-added":  "table items: 1 stored rows the mapping does not produce, 0 mapped rows not stored",
		"order-gone":  "table orders: 0 stored rows the mapping does not produce, 1 mapped rows not stored",
		"note":        "table orders: 1 stored rows the mapping does not produce, 0 mapped rows not stored",
	}
	why, ok := got["refused"]
	if !ok || !strings.Contains(why, "the mapping refuses the source body") || !strings.Contains(why, "orders.code") || strings.Contains(why, "seven") {
		t.Errorf("refused: %q, want the mapping's reason naming the column, not the value", why)
	}
	delete(got, "refused")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("CompareContent (-want +got):\n%s", diff)
	}
	if got, err := st.CompareContent(ctx, source[:1]); err != nil || len(got) != 0 {
		t.Errorf("CompareContent(same) alone = %v, %v; want no difference", got, err)
	}
}
