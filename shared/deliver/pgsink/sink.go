// Package pgsink writes documents to PostgreSQL, in one of two modes.
//
// Document mode (the default) keeps one row per live document in a data
// table, and one row per document ever seen in a versions table holding the
// observation version last applied. For an output with schema s and table t:
//
//	s.t           doc_id, rev, seq, body (jsonb), updated_at
//	s.t_versions  doc_id, generation, counter, rev, deleted, seq, applied_at
//
// Mapping mode (the output has a config.Mapping) maps each document onto the
// rows of several relational tables, coercing values to the column types and
// recording every coercion in a data-quality table, all of a document in one
// transaction; see mapping.go.
//
// In both modes the versions row of a deleted document stays, so a change
// observed before the deletion can never bring the document back.
package pgsink

import (
	"bytes"
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
)

var _ deliver.Sink = (*Sink)(nil)

// versionsSuffix names the versions table after the data table.
const versionsSuffix = "_versions"

// maxIdentifier is PostgreSQL's identifier length (NAMEDATALEN-1); longer
// names are silently truncated, so two outputs could share a table.
const maxIdentifier = 63

// batcher is the part of a pool or transaction Apply uses.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Sink applies changes to one PostgreSQL output, in document or mapping
// mode. It is safe for concurrent use, also by several processes writing the
// same tables: a change is applied only if its version is newer than the
// stored one, under a transaction-scoped advisory lock on the document.
//
// Its statements hold no session state (no temporary tables, SET or
// session-level locks), so they also run through RDS Proxy; there, put
// default_query_exec_mode=exec (or cache_describe) in the DSN so that pgx
// does not create named prepared statements, which pin a proxy connection.
type Sink struct {
	pool   *pgxpool.Pool
	output string
	names  tableNames
	ddl    []string

	lockSQL string // locks the documents of a batch
	// Document mode.
	lockSeed int64
	applySQL string
	// Mapping mode; nil in document mode.
	mapping *mapper
}

type tableNames struct {
	schema, table string
	data          string // quoted schema.table
	versions      string // quoted schema.table_versions
}

// New returns a sink writing to the tables of out through pool, which the
// caller owns and closes: in mapping mode when out.Mapping is set, in
// document mode otherwise. An empty out.Table defaults to outputID with '-'
// replaced by '_', an empty out.Schema to public. New does not touch the
// database; call CreateTables to create missing tables.
func New(pool *pgxpool.Pool, out config.PostgresOutput, outputID string) (*Sink, error) {
	if pool == nil {
		return nil, errors.New("new postgres sink: pool is nil")
	}
	s, err := configure(out, outputID)
	if err != nil {
		return nil, fmt.Errorf("new postgres sink %s: %w", outputID, err)
	}
	s.pool = pool
	return s, nil
}

// configure builds the statements of out, without a pool.
func configure(out config.PostgresOutput, outputID string) (*Sink, error) {
	names, err := resolveNames(out, outputID)
	if err != nil {
		return nil, err
	}
	s := &Sink{output: outputID}
	if out.Mapping != nil {
		if s.mapping, err = newMapper(out, &names); err != nil {
			return nil, err
		}
		s.names, s.ddl, s.lockSQL = names, s.mapping.ddl, mappingLockSQL
		return s, nil
	}
	s.names, s.ddl = names, ddl(names)
	s.lockSQL, s.lockSeed, s.applySQL = mappingLockSQL, lockSeed(names.versions), applySQL(names)
	return s, nil
}

func resolveNames(out config.PostgresOutput, outputID string) (tableNames, error) {
	n := tableNames{schema: out.Schema, table: out.Table}
	if n.schema == "" {
		n.schema = "public"
	}
	if n.table == "" {
		n.table = strings.ReplaceAll(outputID, "-", "_")
	}
	if n.table == "" {
		return tableNames{}, errors.New("table is empty and there is no output id to derive it from")
	}
	if len(n.table)+len(versionsSuffix) > maxIdentifier {
		return tableNames{}, fmt.Errorf("table %q is longer than %d bytes, so %q would be truncated", n.table, maxIdentifier-len(versionsSuffix), n.table+versionsSuffix)
	}
	if len(n.schema) > maxIdentifier {
		return tableNames{}, fmt.Errorf("schema %q is longer than %d bytes", n.schema, maxIdentifier)
	}
	n.data = pgx.Identifier{n.schema, n.table}.Sanitize()
	n.versions = pgx.Identifier{n.schema, n.table + versionsSuffix}.Sanitize()
	return n, nil
}

// DDL returns the statements creating the tables of out (resolved as New
// does; in mapping mode the mapped tables, the versions table and the
// data-quality table), for printing or for running by hand. It creates no
// schema: the schema must exist.
func DDL(out config.PostgresOutput, outputID string) (string, error) {
	s, err := configure(out, outputID)
	if err != nil {
		return "", fmt.Errorf("postgres ddl %s: %w", outputID, err)
	}
	return strings.Join(s.ddl, ";\n\n") + ";\n", nil
}

func ddl(n tableNames) []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + n.data + ` (
    doc_id     text PRIMARY KEY,
    rev        text NOT NULL,
    seq        text NOT NULL,
    body       jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)`,
		`CREATE TABLE IF NOT EXISTS ` + n.versions + ` (
    doc_id     text PRIMARY KEY,
    generation bigint NOT NULL,
    counter    bigint NOT NULL,
    rev        text NOT NULL,
    deleted    boolean NOT NULL,
    seq        text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`,
	}
}

// CreateTables creates the tables DDL lists if they do not exist. It is
// idempotent and safe to call from many writers starting at once: an
// advisory lock (held for the transaction only) serializes them, since
// concurrent CREATE TABLE IF NOT EXISTS of one table can fail in PostgreSQL.
func (s *Sink) CreateTables(ctx context.Context) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "changes-worker/pgsink/"+s.names.versions); err != nil {
			return fmt.Errorf("lock ddl: %w", err)
		}
		for _, stmt := range s.ddl {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("create tables %s: %w", s.names.versions, err)
	}
	return nil
}

// lockSeed makes the documents' advisory lock keys particular to the
// versions table (quoted schema.table), so outputs do not wait on each
// other. It is derived as mapping mode derives its own, so any two sinks
// sharing a versions table lock the same keys.
func lockSeed(versions string) int64 {
	h := fnv.New64a()
	h.Write([]byte(versions))
	return int64(h.Sum64())
}

// The statements of one batch, in one transaction, each batch holding at
// most one change per document:
//
//  1. mappingLockSQL (shared with mapping mode) takes a transaction-scoped
//     advisory lock per document, in key order, so two writers never wait
//     on each other in opposite orders. The locks write nothing: a new
//     document costs one insert in each table, no placeholder row.
//  2. applySQL applies the changes that are newer than the stored versions.
//
// The locks are taken in a statement of their own: under READ COMMITTED each
// statement reads from a snapshot taken when it starts. Were the lock taken
// inside the applying statement, a tombstone that waited for a concurrent
// first insert of the document would then run its DELETE on a snapshot
// without that new data row, and leave a deleted document in the data table.
// Once the lock statement returns, every earlier writer of these documents
// has committed, and applySQL, starting after it, sees their rows.

// applySQL records in the versions table the version of every change newer
// than the stored one (a row-value comparison of (generation, counter), so a
// change not newer changes nothing), then upserts the data rows of the
// applied live changes and deletes those of the applied tombstones, reaching
// the data table through its primary key (ON CONFLICT, doc_id = ANY(array)).
//
// The changes come as parallel arrays, every value a parameter, never SQL
// text: $1 doc ids, $2 generations, $3 counters, $4 revs, $5 deleted, $6
// seqs, $7 bodies (NULL for tombstones).
func applySQL(n tableNames) string {
	return `WITH applied AS (
    INSERT INTO ` + n.versions + ` AS cur (doc_id, generation, counter, rev, deleted, seq, applied_at)
    SELECT b.doc_id, b.generation, b.counter, b.rev, b.deleted, b.seq, now()
    FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::boolean[], $6::text[])
        AS b(doc_id, generation, counter, rev, deleted, seq)
    ON CONFLICT (doc_id) DO UPDATE
    SET generation = EXCLUDED.generation, counter = EXCLUDED.counter, rev = EXCLUDED.rev,
        deleted = EXCLUDED.deleted, seq = EXCLUDED.seq, applied_at = EXCLUDED.applied_at
    WHERE (cur.generation, cur.counter) < (EXCLUDED.generation, EXCLUDED.counter)
    RETURNING doc_id, deleted
), upserted AS (
    INSERT INTO ` + n.data + ` AS d (doc_id, rev, seq, body, updated_at)
    SELECT b.doc_id, b.rev, b.seq, b.body::jsonb, now()
    FROM unnest($1::text[], $4::text[], $6::text[], $7::text[]) AS b(doc_id, rev, seq, body)
    WHERE b.doc_id = ANY(ARRAY(SELECT doc_id FROM applied WHERE NOT deleted))
    ON CONFLICT (doc_id) DO UPDATE
    SET rev = EXCLUDED.rev, seq = EXCLUDED.seq, body = EXCLUDED.body, updated_at = EXCLUDED.updated_at
)
DELETE FROM ` + n.data + ` WHERE doc_id = ANY(ARRAY(SELECT doc_id FROM applied WHERE deleted))`
}

// Apply applies changes in one round trip: a batch, run by PostgreSQL as one
// implicit transaction, that locks the documents and then applies, with one
// statement, the newest change of each document where it is newer than the
// stored version; the older changes of a document in the call are not newer
// than what the output holds once the batch is committed. If the batch fails
// on a statement error, every change is applied again on its own (its own
// transaction), in version order, so one bad document fails alone. Changes
// not newer than the stored version change nothing and return nil. Errors
// are *deliver.Error: invalid bodies and data, integrity and syntax errors
// (SQLSTATE classes 22, 23, 42, 54) are permanent; connection errors,
// timeouts, deadlocks, serialization failures and everything unknown are
// transient.
//
// In mapping mode, see applyMapped; errors are classified the same way, and
// a document that cannot be mapped fails permanently with reason coercion,
// required, not_an_array, duplicate_key or invalid_body.
//
// Apply is idempotent and safe for concurrent use.
func (s *Sink) Apply(ctx context.Context, changes []*change.Envelope) []error {
	if s.mapping != nil {
		return s.applyMapped(ctx, changes)
	}
	errs := make([]error, len(changes))
	var todo []pending[*change.Envelope]
	for i, c := range changes {
		if err := check(c); err != nil {
			errs[i] = err
			continue
		}
		todo = append(todo, pending[*change.Envelope]{i: i, c: c, item: c})
	}
	return applyNewest(ctx, s, errs, todo, s.apply)
}

// pending is a checked change awaiting the database: its index in the Apply
// call, its envelope and what the batch writer takes for it.
type pending[T any] struct {
	i    int
	c    *change.Envelope
	item T
}

// applyNewest writes todo with write and records the failures in errs, at
// each change's index. Changes are ordered by document, then oldest first
// (one order for every writer), and only the newest change of each document
// goes in the batch. If the batch fails on a statement error, each change is
// written again on its own, in that order, so one bad document fails alone.
func applyNewest[T any](ctx context.Context, s *Sink, errs []error, todo []pending[T], write func(context.Context, batcher, []T) error) []error {
	if len(todo) == 0 {
		return errs
	}
	slices.SortStableFunc(todo, func(a, b pending[T]) int {
		if c := strings.Compare(a.c.DocID, b.c.DocID); c != 0 {
			return c
		}
		return a.c.Version.Compare(b.c.Version)
	})
	newest := make([]T, 0, len(todo))
	for k, p := range todo {
		if k+1 == len(todo) || todo[k+1].c.DocID != p.c.DocID {
			newest = append(newest, p.item)
		}
	}

	start := time.Now()
	err := write(ctx, s.pool, newest)
	deliver.Observe(ctx, time.Since(start), s.exhausted(classify(ctx, err)))
	if err == nil {
		return errs
	}
	var pgErr *pgconn.PgError
	if ctx.Err() != nil || !errors.As(err, &pgErr) {
		// Nothing was committed; retrying each change alone cannot do better.
		cerr := s.exhausted(classify(ctx, err))
		for _, p := range todo {
			errs[p.i] = cerr
		}
		return errs
	}
	slog.WarnContext(ctx, "postgres batch failed, applying changes one by one",
		"output", s.output, "changes", len(todo), "sqlstate", pgErr.Code)
	for _, p := range todo {
		if err := write(ctx, s.pool, []T{p.item}); err != nil {
			errs[p.i] = classify(ctx, err)
		}
	}
	return errs
}

// apply applies changes, at most one per document, as one batch: a single
// transaction.
func (s *Sink) apply(ctx context.Context, db batcher, changes []*change.Envelope) error {
	vc := newVersionColumns(len(changes))
	bodies := make([]*string, len(changes))
	for i, c := range changes {
		vc.set(i, c)
		if !c.Tombstone() {
			body := string(c.Doc)
			bodies[i] = &body
		}
	}
	b := &pgx.Batch{}
	b.Queue(s.lockSQL, vc.ids, s.lockSeed)
	b.Queue(s.applySQL, vc.ids, vc.gens, vc.counters, vc.revs, vc.deleted, vc.seqs, bodies)
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("apply changes to %s: %w", s.names.data, err)
	}
	return nil
}

// versionColumns holds the versions of a batch of changes as the
// statements take them: one array per column of the versions table.
type versionColumns struct {
	ids      textArray
	gens     []int64
	counters []int64
	revs     textArray
	deleted  []bool
	seqs     textArray
}

func newVersionColumns(n int) versionColumns {
	return versionColumns{
		ids:      make(textArray, n),
		gens:     make([]int64, n),
		counters: make([]int64, n),
		revs:     make(textArray, n),
		deleted:  make([]bool, n),
		seqs:     make(textArray, n),
	}
}

// set stores the version of c at index i.
func (v versionColumns) set(i int, c *change.Envelope) {
	v.ids[i], v.gens[i], v.counters[i], v.revs[i] = text(c.DocID), c.Generation, c.Counter, text(c.Rev)
	v.deleted[i], v.seqs[i] = c.Tombstone(), text(string(c.Seq))
}

// textArray is a text[] parameter. pgx hands each element of an array to
// its encoder as an interface value; Index gives a pointer to the element,
// which an interface holds as it is, where FlatArray and []string copy
// every element into an allocation of its own.
type textArray []pgtype.Text

var _ pgtype.ArrayGetter = textArray(nil)

// Dimensions returns one dimension of len(a) elements, none (NULL) for a
// nil array.
func (a textArray) Dimensions() []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

// Index returns element i, which pgx reads through its TextValue method.
func (a textArray) Index(i int) any { return &a[i] }

// IndexType returns what Index returns.
func (a textArray) IndexType() any { return new(pgtype.Text) }

// Value returns the array in PostgreSQL's text form, {"a","b",NULL}, for
// the query modes where pgx does not learn the parameter's type from the
// server (exec, simple protocol) and so cannot tell textArray's.
func (a textArray) Value() (driver.Value, error) {
	if a == nil {
		return nil, nil
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, e := range a {
		if i > 0 {
			b.WriteByte(',')
		}
		if !e.Valid {
			b.WriteString("NULL")
			continue
		}
		b.WriteByte('"')
		for j := 0; j < len(e.String); j++ {
			if c := e.String[j]; c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(e.String[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String(), nil
}

// text is s as a text element that is not NULL.
func text(s string) pgtype.Text { return pgtype.Text{String: s, Valid: true} }

// check rejects a change no retry can apply.
func check(c *change.Envelope) error {
	if err := deliver.CheckChange(c); err != nil || c.Tombstone() {
		return err
	}
	switch {
	case !json.Valid(c.Doc):
		return deliver.PermanentError("invalid_body", fmt.Errorf("check change %s: body is not valid JSON", c.DocID))
	case !bytes.HasPrefix(bytes.TrimLeft(c.Doc, " \t\r\n"), []byte("{")):
		return deliver.PermanentError("invalid_body", fmt.Errorf("check change %s: body is not a JSON object", c.DocID))
	}
	return nil
}

// classify turns a database error into a *deliver.Error. A PostgreSQL error
// keeps only its message and SQLSTATE: its detail can quote the document.
func classify(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return &deliver.Error{
			Class:    sqlStateClass(pgErr.Code),
			Reason:   "sql_error",
			SQLState: pgErr.Code,
			// too_many_connections: the server is full, not the change
			// wrong; the writer pauses the output instead of counting it.
			Backpressure: pgErr.Code == sqlStateTooManyConnections,
			Err:          fmt.Errorf("apply change: %s", pgErr.Message),
		}
	}
	if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return deliver.TransientError("timeout", err)
	}
	return deliver.TransientError("connection", err)
}

const sqlStateTooManyConnections = "53300"

// exhausted marks a timeout as backpressure when every connection of the
// pool is taken: the wait was for a connection, not for the change.
func (s *Sink) exhausted(err error) error {
	var e *deliver.Error
	if !errors.As(err, &e) || e.Reason != "timeout" || s.pool == nil {
		return err
	}
	if st := s.pool.Stat(); st.AcquiredConns() >= st.MaxConns() {
		e.Backpressure = true
		e.Reason = "pool_exhausted"
	}
	return e
}

// sqlStateClass classifies a SQLSTATE. Data exceptions (22: invalid JSON,
// \u0000 in jsonb, out of range), integrity violations (23), syntax errors
// and undefined objects (42) and program limits (54: a document too large)
// are permanent: the same change fails the same way again. Everything else
// is transient, in particular serialization failures (40001), deadlocks
// (40P01), connection exceptions (08), insufficient resources (53), operator
// intervention (57P: shutdown, cancel) and lock_not_available (55P03).
func sqlStateClass(code string) deliver.Class {
	switch {
	case strings.HasPrefix(code, "22"), strings.HasPrefix(code, "23"),
		strings.HasPrefix(code, "42"), strings.HasPrefix(code, "54"):
		return deliver.Permanent
	default:
		return deliver.Transient
	}
}

// Tables returns the tables of out that hold what an output has applied: the
// data table (nil in mapping mode, whose documents span several tables) and
// the versions table, for code that must name them (tests that drop or
// tamper with them). What an output holds is read through State.
func Tables(out config.PostgresOutput, outputID string) (data, versions pgx.Identifier, err error) {
	n, err := resolveNames(out, outputID)
	if err != nil {
		return nil, nil, err
	}
	versions = pgx.Identifier{n.schema, n.table + versionsSuffix}
	if out.Mapping != nil {
		if out.Mapping.VersionsTable != "" {
			versions = pgx.Identifier{n.schema, out.Mapping.VersionsTable}
		}
		return nil, versions, nil
	}
	return pgx.Identifier{n.schema, n.table}, versions, nil
}
