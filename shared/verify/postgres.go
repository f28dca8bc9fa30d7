package verify

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Querier is the part of a pgx pool the PostgreSQL reader calls.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Postgres reads a PostgreSQL output's state from the versions table the
// sink keeps per document (doc_id, rev, deleted, ...).
//
// In document mode it joins the data table, so that a row deleted or edited
// behind the sink's back is found although the versions table still records
// it. In mapping mode the versions table alone is read: a row marked
// filtered records a revision the mapping's filter rejected (in sync when it
// is the source's winner); the mapped tables themselves are not checked.
type Postgres struct {
	DB Querier
	// Versions is the versions table.
	Versions pgx.Identifier
	// Data is the data table (document mode); nil in mapping mode.
	Data pgx.Identifier
}

var _ Output = (*Postgres)(nil)

// Scan reads every document the output holds or records inconsistently.
func (p *Postgres) Scan(ctx context.Context, fn func(Doc) error) error {
	return p.query(ctx, nil, fn)
}

// Lookup reads the given documents.
func (p *Postgres) Lookup(ctx context.Context, ids []string) (map[string]Doc, error) {
	out := map[string]Doc{}
	err := p.query(ctx, ids, func(d Doc) error {
		out[d.ID] = d
		return nil
	})
	return out, err
}

// query runs the state query, for every document (ids nil) or the given ones.
func (p *Postgres) query(ctx context.Context, ids []string, fn func(Doc) error) error {
	v := p.Versions.Sanitize()
	var sql string
	var args []any
	if p.Data != nil {
		// Every document with a data row or a live versions row; versions
		// rows of deleted documents (tombstones) are consistent and skipped.
		sql = `SELECT coalesce(v.doc_id, d.doc_id), v.doc_id IS NOT NULL, coalesce(v.rev, ''), coalesce(v.deleted, true),
       d.doc_id IS NOT NULL, coalesce(d.rev, '')
FROM ` + v + ` v FULL JOIN ` + p.Data.Sanitize() + ` d ON d.doc_id = v.doc_id
WHERE (d.doc_id IS NOT NULL OR NOT v.deleted)`
		if ids != nil {
			sql += ` AND coalesce(v.doc_id, d.doc_id) = ANY($1::text[])`
		}
	} else {
		sql = `SELECT doc_id, rev, filtered FROM ` + v + ` WHERE NOT deleted`
		if ids != nil {
			sql += ` AND doc_id = ANY($1::text[])`
		}
	}
	if ids != nil {
		args = append(args, ids)
	}
	rows, err := p.DB.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("query %s: %w", v, err)
	}
	defer rows.Close()
	for rows.Next() {
		var d Doc
		if p.Data != nil {
			var r dataRow
			if err := rows.Scan(&r.id, &r.hasVersion, &r.vRev, &r.deleted, &r.hasData, &r.dRev); err != nil {
				return fmt.Errorf("read %s: %w", v, err)
			}
			d = r.doc()
		} else {
			var filtered bool
			if err := rows.Scan(&d.ID, &d.Rev, &filtered); err != nil {
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

// dataRow is a document-mode row of the state query: the versions row and
// the data row of one document, either possibly absent.
type dataRow struct {
	id               string
	hasVersion       bool
	vRev             string
	deleted, hasData bool
	dRev             string
}

// doc says what the output holds: the data row decides, and a versions row
// that disagrees with it is a problem.
func (r dataRow) doc() Doc {
	switch {
	case r.hasData && !r.hasVersion:
		return Doc{ID: r.id, Rev: r.dRev, Held: true, Problem: "data row without a versions row"}
	case r.hasData && r.deleted:
		return Doc{ID: r.id, Rev: r.dRev, Held: true, Problem: fmt.Sprintf("versions table records a deletion (rev %q)", r.vRev)}
	case r.hasData && r.vRev != r.dRev:
		return Doc{ID: r.id, Rev: r.dRev, Held: true, Problem: fmt.Sprintf("versions table records rev %q", r.vRev)}
	case r.hasData:
		return Doc{ID: r.id, Rev: r.dRev, Held: true}
	}
	return Doc{ID: r.id, Rev: r.vRev, Problem: fmt.Sprintf("versions table records rev %q but the data row is gone", r.vRev)}
}
