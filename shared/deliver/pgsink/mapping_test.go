package pgsink

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/delivertest"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// mappedOutput is the output table setting of the mapping tests: it names
// the versions and data-quality tables.
const mappedOutput = "shop"

// newMappedSink returns a mapping-mode sink writing to a fresh schema of the
// test database through pool (nil: a default pool), dropped when the test
// ends.
func newMappedSink(t *testing.T, pool *pgxpool.Pool, m *config.Mapping) (*Sink, *pgxpool.Pool, string) {
	t.Helper()
	if pool == nil {
		pool = testenv.Postgres(t)
	}
	schema := strings.ReplaceAll(testenv.Name(t), "-", "_")
	if _, err := pool.Exec(t.Context(), `CREATE SCHEMA `+quote(schema)); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	execOnCleanup(t, pool, `DROP SCHEMA `+quote(schema)+` CASCADE`)
	s := mustNew(t, pool, config.PostgresOutput{Schema: schema, Table: mappedOutput, Mapping: m}, delivertest.Output)
	if err := s.CreateTables(t.Context()); err != nil {
		t.Fatalf("CreateTables: %v", err)
	}
	return s, pool, schema
}

func loadMapping(t *testing.T, path string) *config.Mapping {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m config.Mapping
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &m
}

// testChange is a change as the golden test data writes it.
type testChange struct {
	DocID   string          `json:"doc_id"`
	Rev     string          `json:"rev"`
	Version [2]int64        `json:"version"`
	Deleted bool            `json:"deleted"`
	Doc     json.RawMessage `json:"doc"`
}

func (tc testChange) envelope() *change.Envelope {
	v := delivertest.V(tc.Version[0], tc.Version[1])
	if tc.Deleted {
		return delivertest.Deleted(tc.DocID, tc.Rev, v)
	}
	e := delivertest.Live(tc.DocID, tc.Rev, v)
	e.Doc = tc.Doc
	return e
}

func loadBatches(t *testing.T, path string) [][]*change.Envelope {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var raw [][]testChange
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	var batches [][]*change.Envelope
	for _, rb := range raw {
		var batch []*change.Envelope
		for _, tc := range rb {
			batch = append(batch, tc.envelope())
		}
		batches = append(batches, batch)
	}
	return batches
}

// golden compares got with the file testdata/name, or rewrites the file
// with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (run with -update to create it): %v", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-want +got; run with -update if the change is intended):\n%s", path, diff)
	}
}

// dump returns every row of the sink's tables as JSON lines, in key order,
// leaving out what differs between runs (times, identity values).
func dump(t *testing.T, pool *pgxpool.Pool, s *Sink) string {
	t.Helper()
	var b strings.Builder
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		// Only for reading back: JSON renders timestamps in the session's zone.
		if _, err := tx.Exec(t.Context(), `SET LOCAL TimeZone = 'UTC'`); err != nil {
			return err
		}
		section := func(title, query string) error {
			fmt.Fprintf(&b, "-- %s\n", title)
			rows, err := tx.Query(t.Context(), query)
			if err != nil {
				return fmt.Errorf("dump %s: %w", title, err)
			}
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return fmt.Errorf("dump %s: %w", title, err)
			}
			for _, l := range lines {
				b.WriteString(l + "\n")
			}
			return nil
		}
		for _, mt := range s.mapping.tables {
			key := make([]string, len(mt.Key))
			for i, k := range mt.Key {
				key[i] = "t." + quote(k)
			}
			if err := section(mt.Name, `SELECT to_jsonb(t)::text FROM `+mt.ident+` t ORDER BY `+strings.Join(key, ", ")); err != nil {
				return err
			}
		}
		if err := section("versions", `SELECT (to_jsonb(t) - 'applied_at')::text FROM `+s.mapping.versions+` t ORDER BY doc_id`); err != nil {
			return err
		}
		return section("data quality", `SELECT (to_jsonb(t) - 'id' - 'recorded_at')::text FROM `+s.mapping.quality+` t
			ORDER BY doc_id, generation, counter, column_name, path`)
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// outcome renders a change's result for a golden file.
func outcome(c *change.Envelope, err error) string {
	if err == nil {
		return fmt.Sprintf("%s %s: ok", c.DocID, c.Version)
	}
	return fmt.Sprintf("%s %s: %v", c.DocID, c.Version, err)
}

// TestMappingGolden applies the changes of testdata/orders_changes.json to
// the three-table mapping of testdata/orders_mapping.json and compares the
// DDL, each change's outcome and every resulting row with golden files. The
// same changes run with pgx's default statement cache and with the exec
// mode RDS Proxy needs, and must leave the same rows.
func TestMappingGolden(t *testing.T) {
	t.Parallel()
	m := loadMapping(t, "testdata/orders_mapping.json")

	ddl, err := DDL(config.PostgresOutput{Schema: "app", Table: mappedOutput, Mapping: m}, "orders-pg")
	if err != nil {
		t.Fatalf("DDL: %v", err)
	}
	golden(t, "orders_mapping.sql", ddl)

	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			pool := poolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = mode })
			s, pool, _ := newMappedSink(t, pool, m)
			var b strings.Builder
			b.WriteString("-- outcomes\n")
			for i, batch := range loadBatches(t, "testdata/orders_changes.json") {
				for j, err := range s.Apply(t.Context(), batch) {
					fmt.Fprintf(&b, "batch %d: %s\n", i, outcome(batch[j], err))
				}
			}
			b.WriteString(dump(t, pool, s))
			if mode == pgx.QueryExecModeCacheStatement {
				golden(t, "orders_rows.txt", b.String())
				return
			}
			want, err := os.ReadFile("testdata/orders_rows.txt")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(want), b.String()); diff != "" {
				t.Errorf("exec mode differs from testdata/orders_rows.txt (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMappingConformance(t *testing.T) {
	t.Parallel()
	// Two tables from the suite's bodies ({"_id", "_rev", "observed"}), so
	// the suite also checks that they change together.
	m := &config.Mapping{Tables: []*config.MappedTable{
		{Name: "docs", Columns: []*config.MappedColumn{
			{Name: "rev", Path: "_rev", Type: "text", Required: true},
			{Name: "id", Path: "$._id", Type: "text"},
		}},
		{Name: "observations", Columns: []*config.MappedColumn{
			{Name: "observed", Path: "observed", Type: "text", Required: true},
		}},
	}}
	delivertest.Run(t, delivertest.Harness{
		New: func(t *testing.T) (deliver.Sink, delivertest.StateFunc) {
			s, pool, _ := newMappedSink(t, nil, m)
			return s, func(t *testing.T, docID string) (string, bool) {
				var rev, observed *string
				err := pool.QueryRow(t.Context(), `SELECT (SELECT rev FROM `+s.mapping.tables[0].ident+` WHERE doc_id = $1),
					(SELECT observed FROM `+s.mapping.tables[1].ident+` WHERE doc_id = $1)`, docID).Scan(&rev, &observed)
				if err != nil {
					t.Fatalf("read %q: %v", docID, err)
				}
				if (rev == nil) != (observed == nil) {
					t.Errorf("document %q: in docs %v, in observations %v: the tables disagree", docID, rev != nil, observed != nil)
				}
				if rev == nil {
					return "", false
				}
				return *rev, true
			}
		},
	})
}

// itemsMapping is orders with an array of items, each with an array of
// parts: three levels, rows carried down by key.
func itemsMapping() *config.Mapping {
	return &config.Mapping{Tables: []*config.MappedTable{
		{Name: "orders", Columns: []*config.MappedColumn{{Name: "status", Path: "status", Type: "text"}}},
		{Name: "items", Parent: "orders", From: "items", Columns: []*config.MappedColumn{
			{Name: "sku", Path: "sku", Type: "text", Required: true},
			{Name: "qty", Path: "qty", Type: "integer"},
		}},
		{Name: "parts", Parent: "items", From: "parts", IndexColumn: "part", Columns: []*config.MappedColumn{
			{Name: "part_no", Path: "@", Type: "text"},
			{Name: "status", Path: "$.status", Type: "text"},
		}},
	}}
}

// orderDoc returns a live change of an order with items, each item a SKU
// with qty 1 and the parts p1..pn.
func orderDoc(id, rev string, ver change.Version, status string, items map[string]int) *change.Envelope {
	type item struct {
		SKU   string   `json:"sku"`
		Qty   any      `json:"qty"`
		Parts []string `json:"parts"`
	}
	var list []item
	for _, sku := range sortedKeys(items) {
		it := item{SKU: sku, Qty: 1}
		for p := range items[sku] {
			it.Parts = append(it.Parts, fmt.Sprintf("p%d", p+1))
		}
		list = append(list, it)
	}
	body, _ := json.Marshal(map[string]any{"_id": id, "status": status, "items": list})
	c := delivertest.Live(id, rev, ver)
	c.Doc = body
	return c
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if keys[j] < keys[i] {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
	return keys
}

// counts returns the number of rows of docID in each mapped table, and its
// number of data-quality records.
func counts(t *testing.T, pool *pgxpool.Pool, s *Sink, docID string) []int {
	t.Helper()
	var got []int
	for _, mt := range s.mapping.tables {
		var n int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM `+mt.ident+` WHERE doc_id = $1`, docID).Scan(&n); err != nil {
			t.Fatalf("count %s: %v", mt.Name, err)
		}
		got = append(got, n)
	}
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM `+s.mapping.quality+` WHERE doc_id = $1`, docID).Scan(&n); err != nil {
		t.Fatalf("count data quality: %v", err)
	}
	return append(got, n)
}

func readMappedVersion(t *testing.T, pool *pgxpool.Pool, s *Sink, docID string) (versionRow, bool) {
	t.Helper()
	return readVersionIn(t, pool, s.mapping.versions, docID)
}

// TestMappingOrdering applies sequences of changes of one document, one
// batch each, and checks the rows of every table (orders, items, parts, data
// quality) and the versions row the last newer change left.
func TestMappingOrdering(t *testing.T) {
	t.Parallel()
	three := map[string]int{"a": 2, "b": 1, "c": 0}
	one := map[string]int{"z": 3}
	stale := orderDoc("o", "1-x", v(1, 1), "open", three)
	newer := orderDoc("o", "2-x", v(1, 5), "paid", one)
	coerced := orderDoc("o", "3-x", v(1, 6), "paid", one)
	coerced.Doc = json.RawMessage(`{"status":"paid","items":[{"sku":"z","qty":"4","parts":["p1"]}]}`)
	tests := []struct {
		name    string
		batches [][]*change.Envelope
		want    []int // rows in orders, items, parts; data-quality records
		version versionRow
	}{
		{
			name:    "children replaced as a whole",
			batches: [][]*change.Envelope{{stale}, {newer}},
			want:    []int{1, 1, 3, 0},
			version: versionRow{Generation: 1, Counter: 5, Rev: "2-x", Seq: `"1:5"`},
		},
		{
			name:    "out of order: the stale change arrives last",
			batches: [][]*change.Envelope{{newer}, {stale}},
			want:    []int{1, 1, 3, 0},
			version: versionRow{Generation: 1, Counter: 5, Rev: "2-x", Seq: `"1:5"`},
		},
		{
			name:    "stale and newer in one batch",
			batches: [][]*change.Envelope{{newer, stale}},
			want:    []int{1, 1, 3, 0},
			version: versionRow{Generation: 1, Counter: 5, Rev: "2-x", Seq: `"1:5"`},
		},
		{
			name:    "duplicates record coercions once",
			batches: [][]*change.Envelope{{coerced}, {coerced, coerced}, {coerced}},
			want:    []int{1, 1, 1, 1},
			version: versionRow{Generation: 1, Counter: 6, Rev: "3-x", Seq: `"1:6"`},
		},
		{
			name:    "delete then a stale update stays deleted",
			batches: [][]*change.Envelope{{stale}, {deleted("o", "2-d", v(1, 3))}, {stale}},
			want:    []int{0, 0, 0, 0},
			version: versionRow{Generation: 1, Counter: 3, Rev: "2-d", Seq: `"1:3"`, Deleted: true},
		},
		{
			name:    "a tombstone arriving first blocks the older insert",
			batches: [][]*change.Envelope{{delivertest.Removed("o", "2-d", v(1, 3))}, {stale}},
			want:    []int{0, 0, 0, 0},
			version: versionRow{Generation: 1, Counter: 3, Rev: "2-d", Seq: `"1:3"`, Deleted: true},
		},
		{
			name:    "a zombie's higher counter loses to a newer generation",
			batches: [][]*change.Envelope{{orderDoc("o", "5-n", v(2, 1), "paid", one)}, {orderDoc("o", "9-z", v(1, 99), "open", three)}},
			want:    []int{1, 1, 3, 0},
			version: versionRow{Generation: 2, Counter: 1, Rev: "5-n", Seq: `"2:1"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, pool, _ := newMappedSink(t, nil, itemsMapping())
			delivertest.ApplyAll(t, s, tt.batches...)
			if diff := cmp.Diff(tt.want, counts(t, pool, s, "o")); diff != "" {
				t.Errorf("rows per table and records (-want +got):\n%s", diff)
			}
			ver, ok := readMappedVersion(t, pool, s, "o")
			if diff := cmp.Diff(tt.version, ver); !ok || diff != "" {
				t.Errorf("versions row (present %v) (-want +got):\n%s", ok, diff)
			}
		})
	}
}

// TestMappingRollback makes the child table refuse a row (a check
// constraint the mapping cannot see) and checks that the document's whole
// transaction rolls back: no rows in any table, no data-quality record, the
// version not advanced; its neighbours in the batch are applied.
func TestMappingRollback(t *testing.T) {
	t.Parallel()
	s, pool, _ := newMappedSink(t, nil, itemsMapping())
	if _, err := pool.Exec(t.Context(), `ALTER TABLE `+s.mapping.tables[1].ident+` ADD CONSTRAINT qty_positive CHECK (qty > 0)`); err != nil {
		t.Fatalf("add constraint: %v", err)
	}
	good := orderDoc("bad", "1-a", v(1, 1), "open", map[string]int{"a": 1})
	for _, err := range s.Apply(t.Context(), []*change.Envelope{good}) {
		if err != nil {
			t.Fatalf("apply first version: %v", err)
		}
	}
	bad := delivertest.Live("bad", "2-a", v(1, 5))
	bad.Doc = json.RawMessage(`{"status":"paid","items":[{"sku":"a","qty":1,"parts":["p"]},{"sku":"b","qty":"0"}]}`)
	fresh := delivertest.Live("fresh", "1-f", v(1, 6))
	fresh.Doc = json.RawMessage(`{"status":"x","items":[{"sku":"b","qty":"0"}]}`)
	neighbour := orderDoc("n", "1-n", v(1, 7), "open", map[string]int{"a": 1, "b": 2})

	errs := s.Apply(t.Context(), []*change.Envelope{neighbour, bad, fresh})
	if errs[0] != nil {
		t.Errorf("neighbour: %v", errs[0])
	}
	for i, id := range map[int]string{1: "bad", 2: "fresh"} {
		e := deliver.Classify(errs[i])
		if errs[i] == nil || e.Class != deliver.Permanent || e.SQLState != "23514" {
			t.Errorf("%s: got %v, want a permanent check violation (23514)", id, errs[i])
		}
	}
	for id, want := range map[string][]int{
		"bad":   {1, 1, 1, 0}, // the first version, untouched
		"fresh": {0, 0, 0, 0},
		"n":     {1, 2, 3, 0},
	} {
		if diff := cmp.Diff(want, counts(t, pool, s, id)); diff != "" {
			t.Errorf("%s: rows per table and records (-want +got):\n%s", id, diff)
		}
	}
	if ver, _ := readMappedVersion(t, pool, s, "bad"); ver.Counter != 1 {
		t.Errorf("version of bad = %+v, want still 1.1", ver)
	}
	if _, ok := readMappedVersion(t, pool, s, "fresh"); ok {
		t.Error("fresh has a versions row; a failed first change must leave none")
	}
}

// TestMappingCoercionRecords checks the data-quality records of one
// document: what each holds, that on_error null stores NULL, and that
// reject and required fail the document permanently without writing.
func TestMappingCoercionRecords(t *testing.T) {
	t.Parallel()
	m := &config.Mapping{Tables: []*config.MappedTable{
		{Name: "readings", Columns: []*config.MappedColumn{
			{Name: "count", Path: "count", Type: "bigint"},
			{Name: "at", Path: "at", Type: "timestamptz"},
			{Name: "ok", Path: "ok", Type: "boolean"},
			{Name: "label", Path: "meta", Type: "text"},
			{Name: "level", Path: "level", Type: "integer", OnError: "reject"},
			{Name: "sensor", Path: "sensor", Type: "uuid", Required: true},
		}},
	}}
	s, pool, _ := newMappedSink(t, nil, m)
	doc := func(id string, body string) *change.Envelope {
		c := delivertest.Live(id, "1-"+id, v(1, int64(len(id))))
		c.Doc = json.RawMessage(body)
		return c
	}
	const sensor = `"sensor":"0b4e9b8c-1d2e-4f3a-8b7c-6d5e4f3a2b1c"`
	batch := []*change.Envelope{
		doc("r1", `{"count":"12","at":1700000000,"ok":"soon","meta":{"k":"v\u0000"},"level":3,`+sensor+`}`),
		doc("r22", `{"level":"high",`+sensor+`}`),
		doc("r333", `{"level":1}`),
	}
	errs := s.Apply(t.Context(), batch)
	if errs[0] != nil {
		t.Fatalf("r1: %v", errs[0])
	}
	for i, want := range map[int]struct{ reason, text string }{
		1: {"coercion", "readings.level: a string at level cannot be stored as integer: not_a_number"},
		2: {"required", "readings.sensor: no value at sensor"},
	} {
		e := deliver.Classify(errs[i])
		if errs[i] == nil || e.Class != deliver.Permanent || e.Reason != want.reason || !strings.Contains(e.Error(), want.text) {
			t.Errorf("%s: got %v, want permanent %s mentioning %q", batch[i].DocID, errs[i], want.reason, want.text)
		}
		if strings.Contains(e.Error(), "high") {
			t.Errorf("%s: the error quotes the value: %v", batch[i].DocID, errs[i])
		}
	}

	type record struct {
		Column, Path, Original, Reason string
		Stored                         *string
	}
	rows, err := pool.Query(t.Context(), `SELECT output, doc_id, rev, generation, counter, column_name, path, original::text, stored, reason
		FROM `+s.mapping.quality+` ORDER BY column_name`)
	if err != nil {
		t.Fatal(err)
	}
	var got []record
	for rows.Next() {
		var r record
		var output, docID, rev string
		var gen, counter int64
		if err := rows.Scan(&output, &docID, &rev, &gen, &counter, &r.Column, &r.Path, &r.Original, &r.Stored, &r.Reason); err != nil {
			t.Fatal(err)
		}
		if output != delivertest.Output || docID != "r1" || rev != "1-r1" || gen != 1 || counter != 2 {
			t.Errorf("record %s: output %q doc %q rev %q version %d.%d, want %s r1 1-r1 1.2", r.Column, output, docID, rev, gen, counter, delivertest.Output)
		}
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	ptr := func(s string) *string { return &s }
	want := []record{
		{Column: "readings.at", Path: "at", Original: "1700000000", Stored: ptr("2023-11-14T22:13:20Z"), Reason: "epoch_seconds"},
		{Column: "readings.count", Path: "count", Original: `"12"`, Stored: ptr("12"), Reason: "parsed_string"},
		{Column: "readings.label", Path: "meta", Original: "{\"k\": \"v\uFFFD\"}", Stored: ptr(`{"k":"v\u0000"}`), Reason: "json_as_text"},
		{Column: "readings.ok", Path: "ok", Original: `"soon"`, Stored: nil, Reason: "not_a_boolean"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("data-quality records (-want +got):\n%s", diff)
	}

	var count int64
	var ok *bool
	if err := pool.QueryRow(t.Context(), `SELECT count, ok FROM `+s.mapping.tables[0].ident+` WHERE doc_id = 'r1'`).Scan(&count, &ok); err != nil {
		t.Fatal(err)
	}
	if count != 12 || ok != nil {
		t.Errorf("stored count %d ok %v, want 12 and NULL", count, ok)
	}
	for _, id := range []string{"r22", "r333"} {
		if diff := cmp.Diff([]int{0, 0}, counts(t, pool, s, id)); diff != "" {
			t.Errorf("%s: rows and records (-want +got):\n%s", id, diff)
		}
	}
}

// TestMappingTombstoneWaitsForConcurrentInsert pins the race the separate
// lock statement prevents, in mapping mode: a tombstone that waits for
// another transaction's first insert of the document must delete the rows
// that transaction wrote, in every table.
func TestMappingTombstoneWaitsForConcurrentInsert(t *testing.T) {
	t.Parallel()
	s, pool, _ := newMappedSink(t, nil, itemsMapping())
	ctx := t.Context()

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(context.Background())
	first := orderDoc("a", "1-a", v(1, 5), "open", map[string]int{"x": 2})
	md, err := s.mapping.mapDoc(first)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.writeMapped(ctx, tx, []*mappedChange{{c: first, doc: md}}); err != nil {
		t.Fatalf("apply in open transaction: %v", err)
	}

	applyTombstoneBehind(t, pool, s, tx, s.mapping.lockSeed)
	if diff := cmp.Diff([]int{0, 0, 0, 0}, counts(t, pool, s, "a")); diff != "" {
		t.Errorf("rows survived a newer tombstone (-want +got):\n%s", diff)
	}
}

func TestMappingNew(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	table := func(name string) *config.MappedTable {
		return &config.MappedTable{Name: name, Columns: []*config.MappedColumn{{Name: "a", Path: "a", Type: "text"}}}
	}
	tests := []struct {
		name    string
		out     config.PostgresOutput
		wantErr string
		wantDDL []string
	}{
		{name: "invalid mapping", out: config.PostgresOutput{Mapping: &config.Mapping{}}, wantErr: "mapping.tables: at least one table is required"},
		{name: "table named like the versions table", out: config.PostgresOutput{Table: "shop", Mapping: &config.Mapping{Tables: []*config.MappedTable{table("shop_versions")}}},
			wantErr: `"shop_versions" is also the versions or quality table`},
		{name: "derived names too long", out: config.PostgresOutput{Table: strings.Repeat("s", 51), Mapping: &config.Mapping{Tables: []*config.MappedTable{table("t")}}},
			wantErr: "would be truncated"},
		{name: "default names", out: config.PostgresOutput{Mapping: &config.Mapping{Tables: []*config.MappedTable{table("t")}}},
			wantDDL: []string{`"public"."t"`, `"public"."out_1_versions"`, `"public"."out_1_data_quality"`}},
		{name: "configured names", out: config.PostgresOutput{Schema: "s", Mapping: &config.Mapping{Tables: []*config.MappedTable{table("t")}, VersionsTable: "v", QualityTable: "q"}},
			wantDDL: []string{`"s"."t"`, `"s"."v"`, `"s"."q"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := New(pool, tt.out, "out-1")
			if !delivertest.CheckNew(t, err, tt.wantErr) {
				return
			}
			text, err := DDL(tt.out, "out-1")
			if err != nil {
				t.Fatalf("DDL: %v", err)
			}
			for _, name := range tt.wantDDL {
				if !strings.Contains(text, "CREATE TABLE IF NOT EXISTS "+name+" (") {
					t.Errorf("DDL does not create %s:\n%s", name, text)
				}
			}
		})
	}
}

// TestMappingSQLHasNoDocumentContent checks that the statements are fixed
// by the mapping: applying documents never changes their text.
func TestMappingSQLHasNoDocumentContent(t *testing.T) {
	t.Parallel()
	s, _, _ := newMappedSink(t, nil, itemsMapping())
	before := []string{s.lockSQL, s.mapping.writeSQL, s.mapping.writeQualitySQL}
	evil := delivertest.Live(`x'); DROP TABLE orders; --`, "1-x", v(1, 1))
	evil.Doc = json.RawMessage(`{"status":"'; DROP TABLE orders; --","items":[{"sku":"\"; DELETE FROM items; --","parts":["$1"]}]}`)
	for _, err := range s.Apply(t.Context(), []*change.Envelope{evil}) {
		if err != nil {
			t.Fatalf("apply: %v", err)
		}
	}
	after := []string{s.lockSQL, s.mapping.writeSQL, s.mapping.writeQualitySQL}
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("statements changed (-before +after):\n%s", diff)
	}
	for _, stmt := range after {
		if strings.Contains(stmt, "DROP") || strings.Contains(stmt, "$1\"") {
			t.Errorf("statement holds document content:\n%s", stmt)
		}
	}
}
