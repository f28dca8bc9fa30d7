package pgsink

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
)

// CompareContent compares what the output stores for each document with
// what the sink stores for the document's source body, and returns, for
// each document that differs, what differs (never the values). It reads one
// statement per call, so a caller passes documents in pages.
//
// Document mode compares the data row's body with the source body as jsonb,
// the way the sink stores it (the body as the change carries it, _id and
// _rev included): key order, white space and the spelling of equal numbers
// do not count. A source body PostgreSQL refuses as jsonb (a \u0000 in a
// string) is reported as differing, since the sink cannot have stored it.
//
// Mapping mode maps the source body as the sink does and compares, table by
// table, the rows it produces with the rows stored, as a multiset of rows.
// The mapped values are cast to the column types as the sink casts them
// when it writes, so they compare as the stored values do: numeric 1.50
// equals 1.5, timestamptz values are equal instants, jsonb values are equal
// as jsonb. A document the filter rejects must have no rows; one the mapping
// refuses (a value a reject column cannot take, ...) is reported with the
// mapping's reason. The data-quality table is not compared: it is a
// history, not the document's content.
//
// CompareContent only reads, and is safe for concurrent use.
func (s *State) CompareContent(ctx context.Context, docs []deliver.SourceDoc) (map[string]string, error) {
	if len(docs) == 0 {
		return map[string]string{}, nil
	}
	if s.mapping != nil {
		return s.compareRows(ctx, docs)
	}
	differs, err := s.compareBodies(ctx, docs)
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) || !strings.HasPrefix(pgErr.Code, "22") || len(docs) == 1 {
		return differs, err
	}
	// A body PostgreSQL refuses spoils the page: compare one by one.
	differs = map[string]string{}
	for _, d := range docs {
		one, err := s.compareBodies(ctx, []deliver.SourceDoc{d})
		switch {
		case errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22"):
			differs[d.ID] = fmt.Sprintf("the source body cannot be stored as jsonb (sqlstate %s)", pgErr.Code)
		case err != nil:
			return nil, err
		}
		for id, why := range one {
			differs[id] = why
		}
	}
	return differs, nil
}

// compareBodies is CompareContent in document mode.
func (s *State) compareBodies(ctx context.Context, docs []deliver.SourceDoc) (map[string]string, error) {
	ids, bodies := make([]string, len(docs)), make([]string, len(docs))
	for i, d := range docs {
		ids[i], bodies[i] = d.ID, string(d.Body)
	}
	rows, err := s.db.Query(ctx, `SELECT s.id, d.doc_id IS NOT NULL
FROM unnest($1::text[], $2::text[]) AS s(id, body) LEFT JOIN `+s.names.data+` d ON d.doc_id = s.id
WHERE d.body IS DISTINCT FROM s.body::jsonb`, ids, bodies)
	if err != nil {
		return nil, fmt.Errorf("compare bodies in %s: %w", s.names.data, err)
	}
	defer rows.Close()
	differs := map[string]string{}
	for rows.Next() {
		var id string
		var hasRow bool
		if err := rows.Scan(&id, &hasRow); err != nil {
			return nil, fmt.Errorf("compare bodies in %s: %w", s.names.data, err)
		}
		differs[id] = "the stored body differs from the source's"
		if !hasRow {
			differs[id] = "no data row"
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("compare bodies in %s: %w", s.names.data, err)
	}
	return differs, nil
}

// compareRows is CompareContent in mapping mode.
func (s *State) compareRows(ctx context.Context, docs []deliver.SourceDoc) (map[string]string, error) {
	differs := map[string]string{}
	var mapped []*mappedChange
	var ids []string
	for _, d := range docs {
		doc, err := s.mapping.mapDoc(&change.Envelope{DocID: d.ID, Rev: d.Rev, Doc: d.Body})
		if err != nil {
			differs[d.ID] = "the mapping refuses the source body: " + deliver.Classify(err).Err.Error()
			continue
		}
		mapped = append(mapped, &mappedChange{c: &change.Envelope{DocID: d.ID}, doc: doc})
		ids = append(ids, d.ID)
	}
	if len(mapped) == 0 {
		return differs, nil
	}
	args := []any{ids}
	for ti, t := range s.mapping.tables {
		args = append(args, tableArgs(mapped, ti, len(t.cols))...)
	}
	rows, err := s.db.Query(ctx, s.contentSQL, args...)
	if err != nil {
		return nil, fmt.Errorf("compare rows of %s: %w", s.names.versions, err)
	}
	defer rows.Close()
	found := map[string][]string{}
	for rows.Next() {
		var (
			ti               int
			id               string
			stored, expected int64
		)
		if err := rows.Scan(&ti, &id, &stored, &expected); err != nil {
			return nil, fmt.Errorf("compare rows of %s: %w", s.names.versions, err)
		}
		if ti < 0 || ti >= len(s.mapping.tables) {
			return nil, fmt.Errorf("compare rows of %s: table %d of %d", s.names.versions, ti, len(s.mapping.tables))
		}
		found[id] = append(found[id], fmt.Sprintf("table %s: %d stored rows the mapping does not produce, %d mapped rows not stored",
			s.mapping.tables[ti].Name, stored, expected))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("compare rows of %s: %w", s.names.versions, err)
	}
	for id, why := range found {
		differs[id] = strings.Join(why, "; ")
	}
	return differs, nil
}

// contentSQL returns the statement of compareRows. It takes the documents
// to compare in $1, then, table by table, the rows the mapping produces as
// writeSQL takes them (the rows' doc ids, then one text array per stored
// column), and answers (table index, doc id, stored rows not produced,
// produced rows not stored) for every table and document whose rows
// differ. The produced values are cast to the column types as writeSQL
// casts them; EXCEPT ALL then compares rows with the types' equality, NULL
// matching NULL, and keeps duplicates apart.
func (m *mapper) contentSQL() string {
	var ctes, diffs []string
	param := 2
	for i, t := range m.tables {
		u := t.unnestAt(param)
		param += len(u.arrays)
		ctes = append(ctes, fmt.Sprintf(`w%d AS (
    SELECT %s FROM unnest(%s) AS r(%s)
), h%d AS (
    SELECT %s FROM %s WHERE %s = ANY($1::text[])
)`, i, strings.Join(u.values, ", "), strings.Join(u.arrays, ", "), strings.Join(u.aliases, ", "),
			i, strings.Join(u.names, ", "), t.ident, quote(config.DocIDColumn)))
		diffs = append(diffs, fmt.Sprintf(`SELECT %d AS t, true AS stored, x.d FROM (SELECT * FROM h%d EXCEPT ALL SELECT * FROM w%d) AS x(d)
    UNION ALL
    SELECT %d, false, y.d FROM (SELECT * FROM w%d EXCEPT ALL SELECT * FROM h%d) AS y(d)`, i, i, i, i, i, i))
	}
	return "WITH " + strings.Join(ctes, ",\n") + `
SELECT t, d, count(*) FILTER (WHERE stored), count(*) FILTER (WHERE NOT stored) FROM (
    ` + strings.Join(diffs, "\n    UNION ALL\n    ") + `
) AS diff GROUP BY t, d`
}
