package pgsink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/delivertest"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

var (
	live    = delivertest.Live
	deleted = delivertest.Deleted
	v       = delivertest.V
)

// newSink returns a sink on fresh tables of the test database, dropped when
// the test ends.
func newSink(t *testing.T) (*Sink, *pgxpool.Pool) {
	t.Helper()
	pool := testenv.Postgres(t)
	table := strings.ReplaceAll(testenv.Name(t), "-", "_")
	s := mustNew(t, pool, config.PostgresOutput{Table: table}, "out-1")
	if err := s.CreateTables(t.Context()); err != nil {
		t.Fatalf("CreateTables: %v", err)
	}
	execOnCleanup(t, pool, `DROP TABLE IF EXISTS `+s.names.data+`, `+s.names.versions)
	return s, pool
}

// mustNew returns New(pool, out, outputID), failing the test on an error.
func mustNew(t *testing.T, pool *pgxpool.Pool, out config.PostgresOutput, outputID string) *Sink {
	t.Helper()
	s, err := New(pool, out, outputID)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// poolWith returns a pool on the test database with the settings set
// makes, closed when the test ends.
func poolWith(t *testing.T, set func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresDSN(t))
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	set(cfg)
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatalf("pgxpool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// execOnCleanup runs stmt on pool when the test ends, logging a failure.
func execOnCleanup(t *testing.T, pool *pgxpool.Pool, stmt string) {
	t.Cleanup(func() {
		// t.Context is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Logf("cleanup %s: %v", stmt, err)
		}
	})
}

func TestConformance(t *testing.T) {
	t.Parallel()
	delivertest.Run(t, delivertest.Harness{
		New: func(t *testing.T) (deliver.Sink, delivertest.StateFunc) {
			s, pool := newSink(t)
			return s, func(t *testing.T, docID string) (string, bool) {
				d, ok := readDoc(t, pool, s, docID)
				return d.Rev, ok
			}
		},
	})
}

type docRow struct {
	Rev, Seq string
	Body     map[string]any
}

type versionRow struct {
	Generation, Counter int64
	Rev, Seq            string
	Deleted             bool
}

func readDoc(t *testing.T, pool *pgxpool.Pool, s *Sink, id string) (docRow, bool) {
	t.Helper()
	var d docRow
	var body []byte
	err := pool.QueryRow(t.Context(), `SELECT rev, seq, body FROM `+s.names.data+` WHERE doc_id = $1`, id).Scan(&d.Rev, &d.Seq, &body)
	if errors.Is(err, pgx.ErrNoRows) {
		return docRow{}, false
	}
	if err != nil {
		t.Fatalf("read document %q: %v", id, err)
	}
	if err := json.Unmarshal(body, &d.Body); err != nil {
		t.Fatalf("decode body of %q: %v", id, err)
	}
	return d, true
}

func readVersion(t *testing.T, pool *pgxpool.Pool, s *Sink, id string) (versionRow, bool) {
	t.Helper()
	return readVersionIn(t, pool, s.names.versions, id)
}

// readVersionIn reads the row of document id in the versions table named by
// the quoted identifier table.
func readVersionIn(t *testing.T, pool *pgxpool.Pool, table, id string) (versionRow, bool) {
	t.Helper()
	var r versionRow
	err := pool.QueryRow(t.Context(), `SELECT generation, counter, rev, seq, deleted FROM `+table+` WHERE doc_id = $1`, id).
		Scan(&r.Generation, &r.Counter, &r.Rev, &r.Seq, &r.Deleted)
	if errors.Is(err, pgx.ErrNoRows) {
		return versionRow{}, false
	}
	if err != nil {
		t.Fatalf("read version of %q: %v", id, err)
	}
	return r, true
}

func body(id, rev string, ver change.Version) map[string]any {
	return map[string]any{"_id": id, "_rev": rev, "observed": ver.String()}
}

func TestApply(t *testing.T) {
	t.Parallel()
	type want struct {
		doc     *docRow // nil: no data row
		version versionRow
	}
	// liveRow is what a live change of "a" at rev and ver leaves; deletedRow
	// what a tombstone leaves.
	liveRow := func(rev string, ver change.Version) want {
		seq := fmt.Sprintf(`"%d:%d"`, ver.Generation, ver.Counter)
		return want{
			doc:     &docRow{Rev: rev, Seq: seq, Body: body("a", rev, ver)},
			version: versionRow{Generation: ver.Generation, Counter: ver.Counter, Rev: rev, Seq: seq},
		}
	}
	deletedRow := func(rev string, ver change.Version) want {
		seq := fmt.Sprintf(`"%d:%d"`, ver.Generation, ver.Counter)
		return want{version: versionRow{Generation: ver.Generation, Counter: ver.Counter, Rev: rev, Seq: seq, Deleted: true}}
	}
	tests := []struct {
		name    string
		batches [][]*change.Envelope
		want    want
	}{
		{
			name:    "apply",
			batches: [][]*change.Envelope{{live("a", "1-x", v(1, 1))}},
			want:    liveRow("1-x", v(1, 1)),
		},
		{
			name:    "duplicate",
			batches: [][]*change.Envelope{{live("a", "1-x", v(1, 1))}, {live("a", "1-x", v(1, 1))}},
			want:    liveRow("1-x", v(1, 1)),
		},
		{
			name:    "duplicate within one batch",
			batches: [][]*change.Envelope{{live("a", "1-x", v(1, 1)), live("a", "1-x", v(1, 1))}},
			want:    liveRow("1-x", v(1, 1)),
		},
		{
			name:    "older after newer is a no-op",
			batches: [][]*change.Envelope{{live("a", "2-x", v(1, 8))}, {live("a", "1-x", v(1, 3))}},
			want:    liveRow("2-x", v(1, 8)),
		},
		{
			name: "newer and older in one batch, in any order",
			batches: [][]*change.Envelope{
				{live("a", "2-x", v(1, 8)), live("a", "1-x", v(1, 3))},
				{live("a", "1-x", v(1, 3)), live("a", "3-x", v(1, 9))},
			},
			want: liveRow("3-x", v(1, 9)),
		},
		{
			name:    "live and newer tombstone in one batch",
			batches: [][]*change.Envelope{{deleted("a", "2-x", v(1, 2)), live("a", "1-x", v(1, 1))}},
			want:    deletedRow("2-x", v(1, 2)),
		},
		{
			name:    "tombstone and newer live change in one batch",
			batches: [][]*change.Envelope{{live("a", "3-x", v(1, 3)), deleted("a", "2-x", v(1, 2))}},
			want:    liveRow("3-x", v(1, 3)),
		},
		{
			name: "tombstone then stale update stays deleted",
			batches: [][]*change.Envelope{
				{live("a", "1-x", v(1, 1))},
				{deleted("a", "2-x", v(1, 2))},
				{live("a", "1-x", v(1, 1))},
			},
			want: deletedRow("2-x", v(1, 2)),
		},
		{
			name: "conflict: a lower revision observed later wins",
			batches: [][]*change.Envelope{
				{live("a", "3-b", v(5, 9))},
				{live("a", "2-a", v(5, 10))},
			},
			want: liveRow("2-a", v(5, 10)),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, pool := newSink(t)
			delivertest.ApplyAll(t, s, tt.batches...)
			doc, ok := readDoc(t, pool, s, "a")
			switch {
			case tt.want.doc == nil && ok:
				t.Errorf("data row present (rev %q), want none", doc.Rev)
			case tt.want.doc != nil && !ok:
				t.Errorf("data row missing, want rev %q", tt.want.doc.Rev)
			case ok:
				if diff := cmp.Diff(*tt.want.doc, doc); diff != "" {
					t.Errorf("data row (-want +got):\n%s", diff)
				}
			}
			ver, ok := readVersion(t, pool, s, "a")
			if !ok {
				t.Fatal("versions row missing")
			}
			if diff := cmp.Diff(tt.want.version, ver); diff != "" {
				t.Errorf("versions row (-want +got):\n%s", diff)
			}
		})
	}
}

func TestApplyBadDocumentFailsAlone(t *testing.T) {
	t.Parallel()
	s, pool := newSink(t)

	nul := live("nul", "1-n", v(1, 2))
	nul.Doc = json.RawMessage(`{"_id":"nul","text":"a\u0000b"}`) // valid JSON that jsonb rejects
	array := live("array", "1-r", v(1, 4))
	array.Doc = json.RawMessage(`[1,2]`)
	broken := live("broken", "1-k", v(1, 5))
	broken.Doc = json.RawMessage(`{"_id":`)
	empty := live("empty", "1-e", v(1, 6))
	empty.Doc = nil
	noVersion := live("noversion", "1-v", v(0, 0))
	nulID := live("id\x00nul", "1-z", v(1, 7)) // PostgreSQL text cannot hold U+0000

	batch := []*change.Envelope{live("good-1", "1-g", v(1, 1)), nul, live("good-2", "1-h", v(1, 3)), array, broken, empty, noVersion, nulID}
	type want struct {
		class    deliver.Class // "" for success
		reason   string
		sqlState string
	}
	wants := []want{
		{},
		{class: deliver.Permanent, reason: "sql_error", sqlState: "22P05"},
		{},
		{class: deliver.Permanent, reason: "invalid_body"},
		{class: deliver.Permanent, reason: "invalid_body"},
		{class: deliver.Permanent, reason: "invalid_body"},
		{class: deliver.Permanent, reason: "invalid_change"},
		{class: deliver.Permanent, reason: "sql_error", sqlState: "22021"},
	}
	errs := s.Apply(t.Context(), batch)
	if len(errs) != len(batch) {
		t.Fatalf("got %d errors for %d changes", len(errs), len(batch))
	}
	for i, err := range errs {
		var got want
		if err != nil {
			e := deliver.Classify(err)
			got = want{class: e.Class, reason: e.Reason, sqlState: e.SQLState}
		}
		if diff := cmp.Diff(wants[i], got, cmp.AllowUnexported(want{})); diff != "" {
			t.Errorf("change %d (%s) error %v (-want +got):\n%s", i, batch[i].DocID, err, diff)
		}
	}
	for id, wantPresent := range map[string]bool{"good-1": true, "good-2": true, "nul": false, "array": false} {
		if _, ok := readDoc(t, pool, s, id); ok != wantPresent {
			t.Errorf("document %q present = %v, want %v", id, ok, wantPresent)
		}
		if _, ok := readVersion(t, pool, s, id); ok != wantPresent {
			t.Errorf("versions row of %q present = %v, want %v (a failed change leaves no placeholder)", id, ok, wantPresent)
		}
	}
	if err := errs[1]; strings.Contains(err.Error(), "a\\u0000b") {
		t.Errorf("error quotes the document: %v", err)
	}
}

// TestConcurrentWriters runs two writers applying the same changes in
// different orders, the way two writer Lambdas drain a standard queue.
func TestConcurrentWriters(t *testing.T) {
	t.Parallel()
	s, pool := newSink(t)

	const docs, versions = 5, 16
	var all []*change.Envelope
	wantDoc := map[string]*change.Envelope{}
	counter := int64(0)
	for gen := int64(1); gen <= 2; gen++ {
		for range versions / 2 {
			for d := range docs {
				counter++
				id := fmt.Sprintf("doc-%d", d)
				rev := fmt.Sprintf("%d-%d", rand.IntN(9)+1, counter)
				c := live(id, rev, v(gen, counter))
				if rand.IntN(3) == 0 {
					c = deleted(id, rev, v(gen, counter))
				}
				all = append(all, c)
				wantDoc[id] = c
			}
		}
	}

	delivertest.ApplyConcurrently(t, s, all, 2, 10)

	for id, c := range wantDoc {
		ver, ok := readVersion(t, pool, s, id)
		want := versionRow{Generation: c.Generation, Counter: c.Counter, Rev: c.Rev, Seq: string(c.Seq), Deleted: c.Tombstone()}
		if diff := cmp.Diff(want, ver); !ok || diff != "" {
			t.Errorf("versions row of %s (-want +got):\n%s", id, diff)
		}
		doc, ok := readDoc(t, pool, s, id)
		switch {
		case c.Tombstone() && ok:
			t.Errorf("%s: data row rev %q present, want deleted at %s", id, doc.Rev, c.Version)
		case !c.Tombstone() && (!ok || doc.Rev != c.Rev):
			t.Errorf("%s: data row rev %q (present %v), want %q", id, doc.Rev, ok, c.Rev)
		}
	}
}

// TestTombstoneWaitsForConcurrentInsert pins the race that a single
// statement per batch gets wrong: a tombstone that has to wait for another
// transaction's first insert of the document must still delete that row.
func TestTombstoneWaitsForConcurrentInsert(t *testing.T) {
	t.Parallel()
	s, pool := newSink(t)
	ctx := t.Context()

	// Another writer inserts the document for the first time and has not
	// committed yet.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(context.Background())
	if err := s.apply(ctx, tx, []*change.Envelope{live("a", "1-a", v(1, 5))}); err != nil {
		t.Fatalf("apply in open transaction: %v", err)
	}

	applyTombstoneBehind(t, pool, s, tx, s.lockSeed)

	if doc, ok := readDoc(t, pool, s, "a"); ok {
		t.Errorf("data row rev %q survived a newer tombstone", doc.Rev)
	}
	if ver, _ := readVersion(t, pool, s, "a"); !ver.Deleted || ver.Counter != 7 {
		t.Errorf("versions row = %+v, want deleted at 1.7", ver)
	}
}

// TestApplyWritesEachRowOnce checks that a batch writes each row it changes
// once: a new document is one insert in each table (no placeholder versions
// row updated afterwards), a newer change one update, a stale one nothing.
func TestApplyWritesEachRowOnce(t *testing.T) {
	t.Parallel()
	s, pool := newSink(t)
	ctx := t.Context()
	for i, err := range s.Apply(ctx, []*change.Envelope{live("old", "1-o", v(1, 1)), live("gone", "1-g", v(1, 2))}) {
		if err != nil {
			t.Fatalf("seed change %d: %v", i, err)
		}
	}

	type counts struct{ Inserted, Updated, Deleted int64 }
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(context.Background())
	// pg_stat_xact_user_tables counts the writes of this backend not yet
	// flushed to the cumulative statistics, which no transaction end flushes
	// while this one is open: its difference is this transaction's writes.
	read := func() map[string]counts {
		got := map[string]counts{}
		for _, table := range []string{s.names.table, s.names.table + versionsSuffix} {
			var c counts
			if err := tx.QueryRow(ctx, `SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_xact_user_tables WHERE schemaname = 'public' AND relname = $1`,
				table).Scan(&c.Inserted, &c.Updated, &c.Deleted); err != nil {
				t.Fatalf("read statistics of %s: %v", table, err)
			}
			got[table] = c
		}
		return got
	}
	before := read()
	batch := []*change.Envelope{
		live("new-1", "1-a", v(1, 3)),
		live("new-2", "1-b", v(1, 4)),
		live("old", "2-o", v(1, 5)),
		deleted("gone", "2-g", v(1, 6)),
	}
	if err := s.apply(ctx, tx, batch); err != nil {
		t.Fatalf("apply: %v", err)
	}
	stale := []*change.Envelope{live("old", "1-o", v(1, 1)), deleted("new-1", "2-a", v(1, 2))}
	if err := s.apply(ctx, tx, stale); err != nil {
		t.Fatalf("apply stale changes: %v", err)
	}
	got := read()
	for table, c := range got {
		b := before[table]
		got[table] = counts{Inserted: c.Inserted - b.Inserted, Updated: c.Updated - b.Updated, Deleted: c.Deleted - b.Deleted}
	}
	want := map[string]counts{
		s.names.table:                  {Inserted: 2, Updated: 1, Deleted: 1},
		s.names.table + versionsSuffix: {Inserted: 2, Updated: 2},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows written (-want +got):\n%s", diff)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCreateTablesConcurrently(t *testing.T) {
	t.Parallel()
	s, pool := newSink(t)
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() { errs[i] = s.CreateTables(t.Context()) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("CreateTables %d: %v", i, err)
		}
	}
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename = ANY($1)`,
		[]string{s.names.table, s.names.table + versionsSuffix}).Scan(&n); err != nil {
		t.Fatalf("count tables: %v", err)
	}
	if n != 2 {
		t.Errorf("found %d tables, want 2", n)
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	tests := []struct {
		name         string
		out          config.PostgresOutput
		outputID     string
		wantData     string
		wantVersions string
		wantErr      string
	}{
		{name: "defaults from the output id", outputID: "my-docs", wantData: `"public"."my_docs"`, wantVersions: `"public"."my_docs_versions"`},
		{name: "explicit names", out: config.PostgresOutput{Schema: "app", Table: "docs"}, outputID: "x", wantData: `"app"."docs"`, wantVersions: `"app"."docs_versions"`},
		{name: "names are quoted, never spliced", out: config.PostgresOutput{Table: `d"; DROP TABLE x; --`}, outputID: "x",
			wantData: `"public"."d""; DROP TABLE x; --"`, wantVersions: `"public"."d""; DROP TABLE x; --_versions"`},
		{name: "table too long for the versions suffix", out: config.PostgresOutput{Table: strings.Repeat("t", 60)}, outputID: "x", wantErr: "truncated"},
		{name: "an empty mapping is refused", out: config.PostgresOutput{Table: "d", Mapping: &config.Mapping{}}, outputID: "x", wantErr: "at least one table"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := New(pool, tt.out, tt.outputID)
			if !delivertest.CheckNew(t, err, tt.wantErr) {
				return
			}
			if s.names.data != tt.wantData || s.names.versions != tt.wantVersions {
				t.Errorf("tables = %s, %s; want %s, %s", s.names.data, s.names.versions, tt.wantData, tt.wantVersions)
			}
			text, err := DDL(tt.out, tt.outputID)
			if err != nil {
				t.Fatalf("DDL: %v", err)
			}
			if !strings.Contains(text, "CREATE TABLE IF NOT EXISTS "+tt.wantData+" (") ||
				!strings.Contains(text, "CREATE TABLE IF NOT EXISTS "+tt.wantVersions+" (") {
				t.Errorf("DDL does not create both tables:\n%s", text)
			}
		})
	}
}

func TestSQLStateClass(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code string
		want deliver.Class
	}{
		{"40001", deliver.Transient}, // serialization_failure
		{"40P01", deliver.Transient}, // deadlock_detected
		{"08006", deliver.Transient}, // connection_failure
		{"53300", deliver.Transient}, // too_many_connections
		{"57P01", deliver.Transient}, // admin_shutdown
		{"57014", deliver.Transient}, // query_canceled
		{"55P03", deliver.Transient}, // lock_not_available
		{"22P02", deliver.Permanent}, // invalid_text_representation (bad JSON)
		{"22P05", deliver.Permanent}, // untranslatable_character (\u0000)
		{"23505", deliver.Permanent}, // unique_violation
		{"42P01", deliver.Permanent}, // undefined_table
		{"42601", deliver.Permanent}, // syntax_error
		{"54000", deliver.Permanent}, // program_limit_exceeded
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			t.Parallel()
			if got := sqlStateClass(tt.code); got != tt.want {
				t.Errorf("sqlStateClass(%s) = %q, want %q", tt.code, got, tt.want)
			}
		})
	}
}

func TestClassifyConnectionAndTimeout(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		ctx        func() context.Context
		err        error
		wantReason string
	}{
		{name: "deadline", ctx: context.Background, err: fmt.Errorf("apply: %w", context.DeadlineExceeded), wantReason: "timeout"},
		{name: "cancelled context", ctx: func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}, err: errors.New("conn closed"), wantReason: "timeout"},
		{name: "connection", ctx: context.Background, err: errors.New("dial tcp: connection refused"), wantReason: "connection"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := deliver.Classify(classify(tt.ctx(), tt.err))
			if got.Class != deliver.Transient || got.Reason != tt.wantReason {
				t.Errorf("classify = %s/%s, want transient/%s", got.Class, got.Reason, tt.wantReason)
			}
		})
	}
}

// TestUnreachableDatabase checks that a connection failure is transient for
// every change, with nothing attempted one by one.
func TestUnreachableDatabase(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://nobody:x@127.0.0.1:1/none?connect_timeout=2")
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	t.Cleanup(pool.Close)
	s := mustNew(t, pool, config.PostgresOutput{Table: "unused"}, "out-1")
	batch := []*change.Envelope{live("a", "1-a", v(1, 1)), deleted("b", "1-b", v(1, 2))}
	for i, err := range s.Apply(t.Context(), batch) {
		if e := deliver.Classify(err); err == nil || e.Class != deliver.Transient || e.Reason != "connection" {
			t.Errorf("change %d: got %v, want a transient connection error", i, err)
		}
	}
}

// TestTooManyConnectionsIsBackpressure connects as a role whose connection
// limit is reached: PostgreSQL answers SQLSTATE 53300, which the writer must
// treat as the server asking to slow down.
func TestTooManyConnectionsIsBackpressure(t *testing.T) {
	t.Parallel()
	admin := testenv.Postgres(t)
	role := "bp_" + strings.ReplaceAll(strings.ToLower(testenv.Name(t)), "-", "_")
	if len(role) > 60 {
		role = role[:60]
	}
	ctx := t.Context()
	if _, err := admin.Exec(ctx, `DROP ROLE IF EXISTS `+role); err != nil {
		t.Fatalf("drop role: %v", err)
	}
	if _, err := admin.Exec(ctx, `CREATE ROLE `+role+` LOGIN PASSWORD 'full-house' CONNECTION LIMIT 0`); err != nil {
		t.Fatalf("create role: %v", err)
	}
	execOnCleanup(t, admin, `DROP ROLE IF EXISTS `+role)
	pool := poolWith(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.User, cfg.ConnConfig.Password = role, "full-house"
	})
	s := mustNew(t, pool, config.PostgresOutput{Table: "unused"}, "out-1")
	err := s.Apply(ctx, []*change.Envelope{live("a", "1-a", v(1, 1))})[0]
	var e *deliver.Error
	if !errors.As(err, &e) || e.SQLState != "53300" || !e.Backpressure || e.Class != deliver.Transient {
		t.Fatalf("got %v, want a transient backpressure error with SQLSTATE 53300", err)
	}
}

// TestPoolExhaustedIsBackpressure waits for a connection of a pool whose
// only one is taken: the timeout is the pool being full, not the change.
func TestPoolExhaustedIsBackpressure(t *testing.T) {
	t.Parallel()
	tables, _ := newSink(t) // creates the tables
	pool := poolWith(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	s := mustNew(t, pool, config.PostgresOutput{Table: tables.names.table}, "out-1")
	held, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err = s.Apply(ctx, []*change.Envelope{live("a", "1-a", v(1, 1))})[0]
	held.Release()
	var e *deliver.Error
	if !errors.As(err, &e) || !e.Backpressure || e.Reason != "pool_exhausted" {
		t.Fatalf("got %v, want a pool_exhausted backpressure error", err)
	}
	// With the connection back, the same change applies.
	if err := s.Apply(t.Context(), []*change.Envelope{live("a", "1-a", v(1, 1))})[0]; err != nil {
		t.Fatalf("apply after release: %v", err)
	}
}

// TestWrongPasswordIsAuthFailure connects with a wrong password: SQLSTATE
// 28P01, which the writer counts as the output refusing our credentials.
func TestWrongPasswordIsAuthFailure(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresDSN(t))
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	cfg.ConnConfig.Password = "not-the-password"
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatalf("pgxpool: %v", err)
	}
	t.Cleanup(pool.Close)
	s := mustNew(t, pool, config.PostgresOutput{Table: "unused"}, "out-1")
	err = s.Apply(t.Context(), []*change.Envelope{live("a", "1-a", v(1, 1))})[0]
	if !deliver.AuthFailure(err) || deliver.Classify(err).SQLState != "28P01" {
		t.Fatalf("got %v, want SQLSTATE 28P01 counted as an auth failure", err)
	}
	if strings.Contains(err.Error(), "not-the-password") {
		t.Fatalf("error shows the password: %v", err)
	}
}

// applyTombstoneBehind applies a tombstone of document "a" at version 1.7
// while tx, not yet committed, holds the document's advisory lock (seed is
// the sink's lock seed): it waits until the tombstone waits for that lock,
// commits tx, and fails the test unless the tombstone then succeeds.
func applyTombstoneBehind(t *testing.T, pool *pgxpool.Pool, s *Sink, tx pgx.Tx, seed int64) {
	t.Helper()
	ctx := t.Context()
	done := make(chan error, 1)
	go func() { done <- s.Apply(ctx, []*change.Envelope{deleted("a", "2-a", v(1, 7))})[0] }()
	// Wait until the tombstone waits for the document's lock.
	waitFor(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid::bigint = (hashtextextended($1, $2) >> 32) & 4294967295
			AND objid::bigint = hashtextextended($1, $2) & 4294967295`, "a", seed).Scan(&n)
		if err != nil {
			t.Fatalf("query pg_locks: %v", err)
		}
		return n > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("apply tombstone: %v", err)
	}
}
