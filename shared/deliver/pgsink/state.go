package pgsink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
)

// Querier is the part of a pgx pool the state reader calls.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// State reads what one PostgreSQL output holds, from the tables its Sink
// writes; it only reads, and is safe for concurrent use.
//
// In document mode it joins the versions table with the data table, so that
// a row deleted or edited behind the sink's back is found although the
// versions table still records it; Digest is the MD5 (hex) of the body's
// jsonb text, which PostgreSQL normalizes. In mapping mode it reads the
// versions table alone: a row marked filtered records a revision the
// mapping's filter rejected; the mapped rows are not checked (Rows reads
// them, CompareContent compares them with a source body) and Digest is
// empty.
type State struct {
	db      Querier
	output  string
	names   tableNames
	mapping *mapper // nil in document mode
	scanSQL string  // every document held or recorded inconsistently
	// contentSQL compares mapped rows (mapping mode; see CompareContent).
	contentSQL string
}

// NewState returns the state reader of out, whose tables are named as New
// names them. It does not touch the database.
func NewState(db Querier, out config.PostgresOutput, outputID string) (*State, error) {
	if db == nil {
		return nil, errors.New("new postgres state reader: db is nil")
	}
	s, err := configure(out, outputID)
	if err != nil {
		return nil, fmt.Errorf("new postgres state reader %s: %w", outputID, err)
	}
	st := &State{db: db, output: outputID, names: s.names, mapping: s.mapping}
	if st.mapping == nil {
		// Every document with a data row or a live versions row; versions
		// rows of deleted documents (tombstones) are consistent and skipped.
		st.scanSQL = `SELECT coalesce(v.doc_id, d.doc_id), v.doc_id IS NOT NULL, coalesce(v.generation, 0), coalesce(v.counter, 0),
       coalesce(v.rev, ''), coalesce(v.deleted, false), d.doc_id IS NOT NULL, coalesce(d.rev, ''), coalesce(md5(d.body::text), '')
FROM ` + s.names.versions + ` v FULL JOIN ` + s.names.data + ` d ON d.doc_id = v.doc_id
WHERE (d.doc_id IS NOT NULL OR NOT v.deleted)`
	} else {
		st.scanSQL = `SELECT doc_id, generation, counter, rev, filtered FROM ` + s.names.versions + ` WHERE NOT deleted`
		st.contentSQL = st.mapping.contentSQL()
	}
	return st, nil
}

// Scan calls fn for every document the output holds a copy of, records as
// filtered, or records inconsistently; a document whose last applied change
// is a deletion and that left nothing behind is not listed. fn's error
// stops the scan and is returned.
func (s *State) Scan(ctx context.Context, fn func(deliver.Stored) error) error {
	return s.query(ctx, nil, fn)
}

// Lookup reads the given documents as Scan would list them; a document Scan
// would not list is absent from the result.
func (s *State) Lookup(ctx context.Context, ids []string) (map[string]deliver.Stored, error) {
	out := map[string]deliver.Stored{}
	err := s.query(ctx, ids, func(d deliver.Stored) error {
		out[d.ID] = d
		return nil
	})
	return out, err
}

// query runs the state query, for every document (ids nil) or the given ones.
func (s *State) query(ctx context.Context, ids []string, fn func(deliver.Stored) error) error {
	sql, args := s.scanSQL, []any(nil)
	if ids != nil {
		if s.mapping == nil {
			sql += ` AND coalesce(v.doc_id, d.doc_id) = ANY($1::text[])`
		} else {
			sql += ` AND doc_id = ANY($1::text[])`
		}
		args = append(args, ids)
	}
	v := s.names.versions
	rows, err := s.db.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("query %s: %w", v, err)
	}
	defer rows.Close()
	for rows.Next() {
		var d deliver.Stored
		if s.mapping == nil {
			var r dataRow
			if err := rows.Scan(&r.id, &r.hasVersion, &r.version.Generation, &r.version.Counter, &r.vRev, &r.deleted, &r.hasData, &r.dRev, &r.digest); err != nil {
				return fmt.Errorf("read %s: %w", v, err)
			}
			d = r.stored()
		} else {
			var filtered bool
			if err := rows.Scan(&d.ID, &d.Version.Generation, &d.Version.Counter, &d.Rev, &filtered); err != nil {
				return fmt.Errorf("read %s: %w", v, err)
			}
			d.Held, d.Filtered = !filtered, filtered
		}
		if err := fn(d); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read %s: %w", v, err)
	}
	return nil
}

// Applied calls fn with the last change the output applied to each
// document it recorded one for, deletions included, as its versions table
// holds it: ID, Version, Rev and Deleted (a deletion or a removal). Held,
// Filtered, Problem and Digest are not read: Scan says what the output
// holds. fn's error stops the scan and is returned.
func (s *State) Applied(ctx context.Context, fn func(deliver.Stored) error) error {
	v := s.names.versions
	rows, err := s.db.Query(ctx, `SELECT doc_id, generation, counter, rev, deleted FROM `+v)
	if err != nil {
		return fmt.Errorf("query %s: %w", v, err)
	}
	defer rows.Close()
	for rows.Next() {
		var d deliver.Stored
		if err := rows.Scan(&d.ID, &d.Version.Generation, &d.Version.Counter, &d.Rev, &d.Deleted); err != nil {
			return fmt.Errorf("read %s: %w", v, err)
		}
		if err := fn(d); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read %s: %w", v, err)
	}
	return nil
}

// dataRow is a document-mode row of the state query: the versions row and
// the data row of one document, either possibly absent.
type dataRow struct {
	id               string
	hasVersion       bool
	version          change.Version
	vRev             string
	deleted, hasData bool
	dRev, digest     string
}

// stored says what the output holds: the data row decides, and a versions
// row that disagrees with it is a problem.
func (r dataRow) stored() deliver.Stored {
	d := deliver.Stored{ID: r.id, Version: r.version, Rev: r.dRev, Held: r.hasData, Deleted: r.deleted, Digest: r.digest}
	switch {
	case r.hasData && !r.hasVersion:
		d.Problem = "data row without a versions row"
	case r.hasData && r.deleted:
		d.Problem = fmt.Sprintf("versions table records a deletion (rev %q)", r.vRev)
	case r.hasData && r.vRev != r.dRev:
		d.Problem = fmt.Sprintf("versions table records rev %q", r.vRev)
	case !r.hasData:
		d.Rev, d.Problem = r.vRev, fmt.Sprintf("versions table records rev %q but the data row is gone", r.vRev)
	}
	return d
}

// errMode is returned by Body in mapping mode and by Rows in document mode.
var errMode = errors.New("not stored that way in this mode")

// Body returns the body the output stores for the document (document mode)
// and true, or false when it stores none.
func (s *State) Body(ctx context.Context, docID string) (json.RawMessage, bool, error) {
	if s.mapping != nil {
		return nil, false, fmt.Errorf("read body of %s: output %s is in mapping mode (read its rows): %w", docID, s.output, errMode)
	}
	rows, err := s.db.Query(ctx, `SELECT body::text FROM `+s.names.data+` WHERE doc_id = $1`, docID)
	if err != nil {
		return nil, false, fmt.Errorf("read body of %s: %w", docID, err)
	}
	body, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, false, fmt.Errorf("read body of %s: %w", docID, err)
	}
	if len(body) == 0 {
		return nil, false, nil
	}
	return json.RawMessage(body[0]), true, nil
}

// TableRows are the rows one mapped table holds for a document.
type TableRows struct {
	Table string
	// Columns are the table's stored columns after doc_id, in table order.
	Columns []string
	// Values holds each row's values as PostgreSQL's text form (nil for
	// NULL), in Columns order; rows come in primary key order.
	Values [][]*string
}

// Rows returns, for every table of the mapping in mapping order, the rows
// the output stores for the document (mapping mode); a document with no row
// (deleted, filtered, never written) has tables with no Values.
func (s *State) Rows(ctx context.Context, docID string) ([]TableRows, error) {
	if s.mapping == nil {
		return nil, fmt.Errorf("read rows of %s: output %s is in document mode (read its body): %w", docID, s.output, errMode)
	}
	out := make([]TableRows, 0, len(s.mapping.tables))
	for _, t := range s.mapping.tables {
		tr := TableRows{Table: t.Name}
		cols := make([]string, len(t.cols))
		for i, c := range t.cols {
			tr.Columns = append(tr.Columns, c.name)
			cols[i] = quote(c.name) + "::text"
		}
		key := make([]string, len(t.Key))
		for i, k := range t.Key {
			key[i] = quote(k)
		}
		rows, err := s.db.Query(ctx, `SELECT `+strings.Join(cols, ", ")+` FROM `+t.ident+
			` WHERE `+quote(config.DocIDColumn)+` = $1 ORDER BY `+strings.Join(key, ", "), docID)
		if err != nil {
			return nil, fmt.Errorf("read rows of %s in %s: %w", docID, t.ident, err)
		}
		tr.Values, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) ([]*string, error) {
			vals := make([]*string, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			return vals, row.Scan(ptrs...)
		})
		if err != nil {
			return nil, fmt.Errorf("read rows of %s in %s: %w", docID, t.ident, err)
		}
		out = append(out, tr)
	}
	return out, nil
}
