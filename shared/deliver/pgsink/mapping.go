package pgsink

import (
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/changes-worker/changes-worker/shared/config"
)

// Mapping mode writes each document as rows of the tables of a
// config.Mapping, plus, for an output with schema s and table t (the output's
// table setting, which names no data table in this mode):
//
//	s.t_versions      doc_id, generation, counter, rev, deleted, filtered, seq, applied_at
//	s.t_data_quality  output, doc_id, rev, generation, counter, column_name, path,
//	                  original (jsonb), stored (text, NULL when nulled), reason, recorded_at
//
// (or the mapping's versions_table and quality_table). Every mapped table has
// a doc_id column; a document's rows in every table are replaced as a whole
// when a newer version of it arrives, and removed when it is deleted or stops
// matching the filter. The versions row, the rows and the data-quality
// records of a document change in one transaction.

// Default suffixes of the mapping mode's own tables.
const (
	qualitySuffix = "_data_quality"
)

// mapper maps documents onto the rows of a mapping's tables and holds the
// statements that write them. It is immutable and safe for concurrent use.
type mapper struct {
	tables []*mappedTable
	// roots counts the root tables, rootCols the columns they store.
	roots, rootCols int
	// filter is nil when every document is mapped.
	filter *docFilter

	versions string // quoted schema.table
	quality  string
	// lockSeed makes the documents' lock keys particular to the versions
	// table, so outputs do not wait on each other.
	lockSeed int64

	writeSQL        string // without data-quality records
	writeQualitySQL string // with them
	ddl             []string
}

// mappedTable is a table with its storage layout: doc_id, then cols.
type mappedTable struct {
	*config.ResolvedTable
	ident string // quoted schema.name
	// cols are the stored columns after doc_id: the carried parent key
	// columns, the index column (child tables), then the mapped columns.
	cols []storedColumn
	// carriedFrom holds, for each carried column, its position in the
	// parent's cols.
	carriedFrom []int
	// keyPos holds the position in cols of each key column; -1 for doc_id.
	keyPos []int
	// mappedAt is the position in cols of the first mapped column.
	mappedAt int
	// uniqueKey is set when the key holds the index column and every carried
	// column, so no two rows of one document can share it.
	uniqueKey bool
}

type storedColumn struct {
	name, typ string
	notNull   bool
}

// docFilter selects the documents to map.
type docFilter struct {
	path   config.Path
	equals any
}

func (f *docFilter) match(doc *jsonTape) bool {
	if f == nil {
		return true
	}
	n, ok := doc.lookup(f.path, 0)
	return ok && jsonEqual(doc.value(n), f.equals)
}

// newMapper resolves the mapping of out; names are the output's resolved
// names, whose versions table it replaces with the mapping's own.
func newMapper(out config.PostgresOutput, names *tableNames) (*mapper, error) {
	m := out.Mapping
	tables, err := m.Resolve()
	if err != nil {
		return nil, fmt.Errorf("mapping: %w", err)
	}
	versions, quality := m.VersionsTable, m.QualityTable
	if versions == "" {
		versions = names.table + versionsSuffix
	}
	if quality == "" {
		quality = names.table + qualitySuffix
	}
	for _, n := range []string{versions, quality} {
		if len(n) > maxIdentifier {
			return nil, fmt.Errorf("mapping: table name %q is longer than %d bytes and would be truncated", n, maxIdentifier)
		}
	}
	if versions == quality {
		return nil, fmt.Errorf("mapping: versions and quality tables are both %q", versions)
	}
	mp := &mapper{
		versions: pgx.Identifier{names.schema, versions}.Sanitize(),
		quality:  pgx.Identifier{names.schema, quality}.Sanitize(),
	}
	names.versions = mp.versions
	h := fnv.New64a()
	h.Write([]byte(mp.versions))
	mp.lockSeed = int64(h.Sum64())
	if f := m.Filter; f != nil {
		path, err := config.ParsePath(f.Path)
		if err != nil {
			return nil, fmt.Errorf("mapping filter: %w", err)
		}
		equals, err := decodeDoc(f.Equals)
		if err != nil {
			return nil, fmt.Errorf("mapping filter equals: %w", err)
		}
		mp.filter = &docFilter{path: path, equals: equals}
	}
	for _, rt := range tables {
		if rt.Name == versions || rt.Name == quality {
			return nil, fmt.Errorf("mapping: table %q is also the versions or quality table", rt.Name)
		}
		t := layout(rt, names.schema, mp.tables)
		mp.tables = append(mp.tables, t)
		if t.Parent < 0 {
			mp.roots++
			mp.rootCols += len(t.cols)
		}
	}
	mp.writeSQL = mp.buildWriteSQL(false)
	mp.writeQualitySQL = mp.buildWriteSQL(true)
	mp.ddl = mp.buildDDL()
	return mp, nil
}

// layout places the columns of rt; earlier are the tables before it.
func layout(rt *config.ResolvedTable, schema string, earlier []*mappedTable) *mappedTable {
	t := &mappedTable{ResolvedTable: rt, ident: pgx.Identifier{schema, rt.Name}.Sanitize()}
	inKey := map[string]bool{}
	for _, k := range rt.Key {
		inKey[k] = true
	}
	for _, c := range rt.Carried {
		t.cols = append(t.cols, storedColumn{name: c.Name, typ: c.Type, notNull: true})
		t.carriedFrom = append(t.carriedFrom, earlier[rt.Parent].position(c.Name))
	}
	if rt.IndexColumn != "" {
		t.cols = append(t.cols, storedColumn{name: rt.IndexColumn, typ: config.ColumnInteger, notNull: true})
	}
	t.mappedAt = len(t.cols)
	for _, c := range rt.Columns {
		t.cols = append(t.cols, storedColumn{name: c.Name, typ: c.Type, notNull: c.Required || inKey[c.Name]})
	}
	for _, k := range rt.Key {
		t.keyPos = append(t.keyPos, t.position(k))
	}
	t.uniqueKey = rt.IndexColumn != "" && inKey[rt.IndexColumn]
	for _, c := range rt.Carried {
		t.uniqueKey = t.uniqueKey && inKey[c.Name]
	}
	return t
}

// position returns the position of the column name in t.cols, -1 for doc_id.
func (t *mappedTable) position(name string) int {
	for i, c := range t.cols {
		if c.name == name {
			return i
		}
	}
	return -1
}

// The statements of one batch, in one transaction: mappingLockSQL locks the
// batch's documents; writeSQL records the versions of the changes newer than
// the stored ones, deletes those documents' rows and inserts their new rows
// and data-quality records. Each batch holds at most one change per
// document.
//
// "Newer" is decided once, by the upsert of the versions rows (the
// condition of its ON CONFLICT), which only a holder of the document's lock
// changes; the documents it returns are the ones whose rows are replaced.
// Documents are passed as parallel arrays; every value as text, cast to its
// column type by the statement: nothing from a document ever becomes SQL
// text.
//
// Parameters of writeSQL: $1 doc ids, $2 generations, $3 counters, $4 revs,
// $5 deleted, $6 filtered, $7 seqs, then per table its doc ids and one array
// per stored column. writeQualitySQL has the output id in $8 and the
// data-quality records (doc id, rev, generation, counter, column, path,
// original, stored, reason) in $9-$17, before the tables.

// mappingLockSQL locks the documents $1 for the rest of the transaction: an
// advisory lock per document on the key hashtextextended(doc_id, $2), $2
// the output's lock seed, taken in key order, so two writers never wait on
// each other in opposite orders. (The subquery's ORDER BY keeps it from
// being merged into the outer query, which calls the function row by row
// in that order.)
//
// As in document mode, the locks are taken in a statement of their own:
// under READ COMMITTED each statement reads from a snapshot taken when it
// starts, so once this one returns every earlier writer of these documents
// has committed and the statement that follows sees its rows: a tombstone
// that waited for a document's first insert deletes the inserted rows.
// Document mode takes the same locks. Advisory locks
// write nothing (no placeholder row for a new document, no WAL), and being
// transaction-scoped they leave no session state behind.
const mappingLockSQL = `SELECT pg_advisory_xact_lock(k) FROM (
    SELECT DISTINCT hashtextextended(id, $2::bigint) AS k FROM unnest($1::text[]) AS id ORDER BY k
) AS keys`

// isNewer is the condition a statement puts on a doc_id column.
const isNewer = "= ANY((SELECT ids FROM newer)::text[])"

// buildWriteSQL returns writeSQL, with the data-quality records or without
// (the common case, spared their nine empty arrays). Its first clause
// records the versions of the changes newer than the stored ones and
// returns their documents, whose rows the next clauses delete and the last
// insert. The deletes run before the inserts, which wait on their count:
// the clauses of one statement otherwise run in no set order, and a new row
// with the key of an old one would meet it in the key's index. (Every
// clause reads the snapshot the statement started with, so a delete never
// sees the rows the statement inserts.) Every table is reached by doc_id =
// ANY(array), which PostgreSQL answers from the doc_id indexes whatever its
// row estimates.
func (m *mapper) buildWriteSQL(quality bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, `WITH applied AS (
    INSERT INTO %s AS cur (doc_id, generation, counter, rev, deleted, filtered, seq, applied_at)
    SELECT b.doc_id, b.generation, b.counter, b.rev, b.deleted, b.filtered, b.seq, now()
    FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::boolean[], $6::boolean[], $7::text[])
        AS b(doc_id, generation, counter, rev, deleted, filtered, seq)
    ON CONFLICT (doc_id) DO UPDATE
    SET generation = EXCLUDED.generation, counter = EXCLUDED.counter, rev = EXCLUDED.rev, deleted = EXCLUDED.deleted,
        filtered = EXCLUDED.filtered, seq = EXCLUDED.seq, applied_at = EXCLUDED.applied_at
    WHERE (cur.generation, cur.counter) < (EXCLUDED.generation, EXCLUDED.counter)
    RETURNING doc_id
), newer AS MATERIALIZED (
    SELECT coalesce(array_agg(doc_id), '{}') AS ids FROM applied
)`, m.versions)
	counts := make([]string, len(m.tables))
	for i, t := range m.tables {
		fmt.Fprintf(&b, ",\nd%d AS (DELETE FROM %s WHERE %s %s RETURNING 1)", i, t.ident, quote(config.DocIDColumn), isNewer)
		counts[i] = fmt.Sprintf("(SELECT count(*) FROM d%d)", i)
	}
	fmt.Fprintf(&b, ",\ncleared AS MATERIALIZED (\n    SELECT %s AS n\n)", strings.Join(counts, " + "))
	if quality {
		fmt.Fprintf(&b, `,
quality AS (
    INSERT INTO %s (output, doc_id, rev, generation, counter, column_name, path, original, stored, reason)
    SELECT $8::text, q.d, q.rev, q.generation, q.counter, q.col, q.path, q.original::jsonb, q.stored, q.reason
    FROM unnest($9::text[], $10::text[], $11::bigint[], $12::bigint[], $13::text[], $14::text[], $15::text[], $16::text[], $17::text[])
        AS q(d, rev, generation, counter, col, path, original, stored, reason)
    WHERE q.d %s
)`, m.quality, isNewer)
	}
	param := 8
	if quality {
		param = 18
	}
	last := len(m.tables) - 1
	for i, t := range m.tables {
		u := t.unnestAt(param)
		param += len(u.arrays)
		insert := fmt.Sprintf(`INSERT INTO %s (%s)
SELECT %s
FROM unnest(%s) AS r(%s)
WHERE r.d %s AND (SELECT n FROM cleared) >= 0`, t.ident, strings.Join(u.names, ", "), strings.Join(u.values, ", "), strings.Join(u.arrays, ", "), strings.Join(u.aliases, ", "), isNewer)
		if i == last {
			b.WriteString("\n" + insert)
			break
		}
		fmt.Fprintf(&b, ",\nt%d AS (\n    %s\n)", i, strings.ReplaceAll(insert, "\n", "\n    "))
	}
	return b.String()
}

func (m *mapper) buildDDL() []string {
	var stmts []string
	for _, t := range m.tables {
		cols := append([]storedColumn{{name: config.DocIDColumn, typ: config.ColumnText, notNull: true}}, t.cols...)
		width := 0
		for _, c := range cols {
			width = max(width, len(quote(c.name)))
		}
		var b strings.Builder
		fmt.Fprintf(&b, "CREATE TABLE IF NOT EXISTS %s (\n", t.ident)
		for _, c := range cols {
			fmt.Fprintf(&b, "    %-*s %s", width, quote(c.name), c.typ)
			if c.notNull {
				b.WriteString(" NOT NULL")
			}
			b.WriteString(",\n")
		}
		key := make([]string, len(t.Key))
		for i, k := range t.Key {
			key[i] = quote(k)
		}
		fmt.Fprintf(&b, "    PRIMARY KEY (%s)\n)", strings.Join(key, ", "))
		stmts = append(stmts, b.String())
		if t.Key[0] != config.DocIDColumn {
			// Deletes find a document's rows by doc_id.
			stmts = append(stmts, fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (%s)",
				quote(t.Name+"_doc_id_idx"), t.ident, quote(config.DocIDColumn)))
		}
	}
	stmts = append(stmts, `CREATE TABLE IF NOT EXISTS `+m.versions+` (
    doc_id     text PRIMARY KEY,
    generation bigint NOT NULL,
    counter    bigint NOT NULL,
    rev        text NOT NULL,
    deleted    boolean NOT NULL,
    filtered   boolean NOT NULL DEFAULT false,
    seq        text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`, `CREATE TABLE IF NOT EXISTS `+m.quality+` (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    output      text NOT NULL,
    doc_id      text NOT NULL,
    rev         text NOT NULL,
    generation  bigint NOT NULL,
    counter     bigint NOT NULL,
    column_name text NOT NULL,
    path        text NOT NULL,
    original    jsonb NOT NULL,
    stored      text,
    reason      text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
)`)
	return stmts
}

// unnested is how a statement reads a table's rows from text arrays, one
// array per column: the column names, the array parameters, the aliases of
// unnest's columns and the values cast to the column types.
type unnested struct {
	names, arrays, aliases, values []string
}

// unnestAt returns how a statement reads t's rows from text array
// parameters numbered from param: the doc ids', then one per column.
func (t *mappedTable) unnestAt(param int) unnested {
	u := unnested{
		names:   []string{quote(config.DocIDColumn)},
		arrays:  []string{fmt.Sprintf("$%d::text[]", param)},
		aliases: []string{"d"},
		values:  []string{"r.d"},
	}
	for j, c := range t.cols {
		u.names = append(u.names, quote(c.name))
		u.arrays = append(u.arrays, fmt.Sprintf("$%d::text[]", param+1+j))
		u.aliases = append(u.aliases, fmt.Sprintf("c%d", j))
		v := fmt.Sprintf("r.c%d", j)
		if c.typ != config.ColumnText {
			v += "::" + c.typ
		}
		u.values = append(u.values, v)
	}
	return u
}

func quote(name string) string { return pgx.Identifier{name}.Sanitize() }
