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
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
// stored one, under a lock on the document (a row lock on its versions row
// in document mode, a transaction-scoped advisory lock in mapping mode).
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
	upsertSQL string
	deleteSQL string
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
	s.lockSQL, s.upsertSQL, s.deleteSQL = lockSQL(names), upsertSQL(names), deleteSQL(names)
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

// lockSQL locks the versions rows of the documents in $1 (sorted, so two
// writers never wait on each other in opposite orders), inserting a
// placeholder row at version (0, 0) for a document never seen; the statement
// applying the change replaces it in the same transaction. ON CONFLICT DO
// UPDATE locks the conflicting row even when its WHERE is false, so existing
// rows are locked without being rewritten.
//
// Taking the locks in a statement of its own matters: under READ COMMITTED
// each statement reads from a snapshot taken when it starts. Were the lock
// taken inside the applying statement, a tombstone that waited for a
// concurrent first insert of the document would then run its DELETE on a
// snapshot without that new data row, and leave a deleted document in the
// data table. After this statement, the applying statement starts once every
// earlier writer of these documents has committed, and sees their rows.
func lockSQL(n tableNames) string {
	return `INSERT INTO ` + n.versions + ` AS cur (doc_id, generation, counter, rev, deleted, seq)
SELECT id, 0, 0, '', true, '' FROM unnest($1::text[]) AS id ORDER BY id
ON CONFLICT (doc_id) DO UPDATE SET generation = cur.generation WHERE false`
}

// guardSQL is the common head of the applying statements: it records the
// change's version only where it is newer than the stored one (a row-value
// comparison of (generation, counter)) and returns the document id only then.
// $1 doc_id, $2 generation, $3 counter, $4 rev, $5 seq.
func guardSQL(n tableNames, deleted bool) string {
	return `WITH applied AS (
    INSERT INTO ` + n.versions + ` AS cur (doc_id, generation, counter, rev, deleted, seq, applied_at)
    VALUES ($1::text, $2::bigint, $3::bigint, $4::text, ` + fmt.Sprint(deleted) + `, $5::text, now())
    ON CONFLICT (doc_id) DO UPDATE
    SET generation = EXCLUDED.generation, counter = EXCLUDED.counter, rev = EXCLUDED.rev,
        deleted = EXCLUDED.deleted, seq = EXCLUDED.seq, applied_at = EXCLUDED.applied_at
    WHERE (cur.generation, cur.counter) < (EXCLUDED.generation, EXCLUDED.counter)
    RETURNING doc_id
)
`
}

// upsertSQL applies a live change; $6 is the body.
func upsertSQL(n tableNames) string {
	return guardSQL(n, false) + `INSERT INTO ` + n.data + ` AS d (doc_id, rev, seq, body, updated_at)
SELECT doc_id, $4::text, $5::text, $6::jsonb, now() FROM applied
ON CONFLICT (doc_id) DO UPDATE
SET rev = EXCLUDED.rev, seq = EXCLUDED.seq, body = EXCLUDED.body, updated_at = EXCLUDED.updated_at`
}

// deleteSQL applies a tombstone.
func deleteSQL(n tableNames) string {
	return guardSQL(n, true) + `DELETE FROM ` + n.data + ` AS d USING applied WHERE d.doc_id = applied.doc_id`
}

// Apply applies changes in one round trip: a batch, run by PostgreSQL as one
// implicit transaction, that locks the documents' versions rows and then runs
// one guarded statement per change. If the batch fails on a statement error,
// every change is applied again on its own (its own transaction), so one bad
// document fails alone. Changes not newer than the stored version change
// nothing and return nil. Errors are *deliver.Error: invalid bodies and data,
// integrity and syntax errors (SQLSTATE classes 22, 23, 42, 54) are
// permanent; connection errors, timeouts, deadlocks, serialization failures
// and everything unknown are transient.
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
	var todo []int
	for i, c := range changes {
		if err := check(c); err != nil {
			errs[i] = err
			continue
		}
		todo = append(todo, i)
	}
	if len(todo) == 0 {
		return errs
	}
	// One order for every writer: by document, then oldest first.
	slices.SortStableFunc(todo, func(a, b int) int {
		if c := strings.Compare(changes[a].DocID, changes[b].DocID); c != 0 {
			return c
		}
		return changes[a].Version.Compare(changes[b].Version)
	})

	err := s.apply(ctx, s.pool, changes, todo)
	if err == nil {
		return errs
	}
	var pgErr *pgconn.PgError
	if ctx.Err() != nil || !errors.As(err, &pgErr) {
		// Nothing was committed; retrying each change alone cannot do better.
		for _, i := range todo {
			errs[i] = classify(ctx, err)
		}
		return errs
	}
	slog.WarnContext(ctx, "postgres batch failed, applying changes one by one",
		"output", s.output, "changes", len(todo), "sqlstate", pgErr.Code)
	for _, i := range todo {
		if err := s.apply(ctx, s.pool, changes, []int{i}); err != nil {
			errs[i] = classify(ctx, err)
		}
	}
	return errs
}

// apply runs the changes at idx (sorted) as one batch.
func (s *Sink) apply(ctx context.Context, db batcher, changes []*change.Envelope, idx []int) error {
	ids := make([]string, 0, len(idx))
	for _, i := range idx {
		ids = append(ids, changes[i].DocID)
	}
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))

	b := &pgx.Batch{}
	b.Queue(s.lockSQL, ids)
	for _, i := range idx {
		c := changes[i]
		if c.Tombstone() {
			b.Queue(s.deleteSQL, c.DocID, c.Generation, c.Counter, c.Rev, string(c.Seq))
		} else {
			b.Queue(s.upsertSQL, c.DocID, c.Generation, c.Counter, c.Rev, string(c.Seq), []byte(c.Doc))
		}
	}
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("apply changes to %s: %w", s.names.data, err)
	}
	return nil
}

// check rejects a change no retry can apply.
func check(c *change.Envelope) error {
	if err := checkChange(c); err != nil || c.Tombstone() {
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

// checkChange is check without the body's JSON, which mapping mode checks
// as it decodes it.
func checkChange(c *change.Envelope) error {
	switch {
	case c == nil:
		return deliver.PermanentError("invalid_change", errors.New("check change: change is nil"))
	case c.DocID == "":
		return deliver.PermanentError("invalid_change", errors.New("check change: doc_id is empty"))
	case c.Generation < 1 || c.Counter < 1:
		return deliver.PermanentError("invalid_change", fmt.Errorf("check change %s: version %s must have generation and counter >= 1", c.DocID, c.Version))
	case !c.Tombstone() && len(c.Doc) == 0:
		return deliver.PermanentError("invalid_body", fmt.Errorf("check change %s: live change has no body", c.DocID))
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
			Err:      fmt.Errorf("apply change: %s", pgErr.Message),
		}
	}
	if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return deliver.TransientError("timeout", err)
	}
	return deliver.TransientError("connection", err)
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
