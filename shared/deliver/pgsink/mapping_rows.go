package pgsink

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
)

// Reasons of the permanent errors mapping a document can return.
const (
	errReasonCoercion  = "coercion"      // a value of a reject column cannot be coerced
	errReasonRequired  = "required"      // a required or key column has no value
	errReasonNotArray  = "not_an_array"  // a child table's from path holds something else
	errReasonDuplicate = "duplicate_key" // two rows of one document share a key
)

// mappedDoc is what a change writes: the rows of each table (none for a
// tombstone or a filtered document) and the data-quality records.
type mappedDoc struct {
	filtered bool
	rows     [][]mappedRow // by table
	records  []qualityRecord
}

// mappedRow is one row's stored values (not Valid: NULL) in the table's
// cols order, with the node it was mapped from, for its child tables, and
// what names that node's path: the parent row, the array path from it
// (nil for a root table's row) and the element's index.
type mappedRow struct {
	vals    []pgtype.Text
	context int
	parent  *mappedRow
	from    *config.Path
	index   int
}

// at returns the path of the node r was mapped from, such as items[2], or
// "" for the document. It is built when an error or a record needs it.
func (r *mappedRow) at() string {
	if r == nil || r.from == nil {
		return ""
	}
	return r.from.AppendTo(r.parent.at()) + "[" + strconv.Itoa(r.index) + "]"
}

// qualityRecord is one coerced or nulled value.
type qualityRecord struct {
	column   string // table.column
	path     string // where the value was, e.g. items[2].qty
	original string // JSON
	stored   pgtype.Text
	reason   string
}

// mapDoc maps a change checked by deliver.CheckChange. Its errors are permanent
// *deliver.Error: they name the table, column and path, never the value.
func (m *mapper) mapDoc(c *change.Envelope) (*mappedDoc, error) {
	if c.Tombstone() {
		return &mappedDoc{}, nil
	}
	doc, err := parseTape(c.Doc)
	if err != nil {
		return nil, deliver.PermanentError("invalid_body", fmt.Errorf("map document %s: %w", c.DocID, err))
	}
	defer doc.release()
	if doc.nodes[0].kind != '{' {
		return nil, deliver.PermanentError("invalid_body", fmt.Errorf("map document %s: body is %s, not a JSON object", c.DocID, kind(doc.scalar(0))))
	}
	if !m.filter.match(doc) {
		return &mappedDoc{filtered: true}, nil
	}
	md := &mappedDoc{rows: make([][]mappedRow, len(m.tables))}
	// The rows of the root tables and their values, allocated together.
	roots := make([]mappedRow, m.roots)
	rootVals := make([]pgtype.Text, m.rootCols)
	for ti, t := range m.tables {
		if t.Parent < 0 {
			md.rows[ti], roots = roots[:1:1], roots[1:]
			r := &md.rows[ti][0]
			r.vals, rootVals = rootVals[:len(t.cols):len(t.cols)], rootVals[len(t.cols):]
			if err := t.mapRow(md, doc, r); err != nil {
				return nil, inDoc(c.DocID, err)
			}
			continue
		}
		for pi := range md.rows[t.Parent] {
			parent := &md.rows[t.Parent][pi]
			n, ok := doc.lookup(t.From, parent.context)
			if !ok || doc.nodes[n].kind == 'n' {
				continue // no array, no rows
			}
			if doc.nodes[n].kind != '[' {
				return nil, inDoc(c.DocID, deliver.PermanentError(errReasonNotArray,
					fmt.Errorf("table %s: %s holds %s, not an array", t.Name, t.From.AppendTo(parent.at()), kind(doc.scalar(n)))))
			}
			count := doc.count(n)
			if count == 0 {
				continue
			}
			vals := make([]pgtype.Text, count*len(t.cols))
			rows := slices.Grow(md.rows[ti], count)
			for i, e := 0, n+1; i < count; i, e = i+1, int(doc.nodes[e].next) {
				rows = append(rows, mappedRow{vals: vals[:len(t.cols):len(t.cols)], context: e, parent: parent, from: &t.From, index: i})
				vals = vals[len(t.cols):]
				if err := t.mapRow(md, doc, &rows[len(rows)-1]); err != nil {
					return nil, inDoc(c.DocID, err)
				}
			}
			md.rows[ti] = rows
		}
		if err := t.checkKeys(md.rows[ti]); err != nil {
			return nil, inDoc(c.DocID, err)
		}
	}
	return md, nil
}

// inDoc names the document in a permanent mapping error.
func inDoc(docID string, err error) error {
	e := deliver.Classify(err)
	return deliver.PermanentError(e.Reason, fmt.Errorf("map document %s: %w", docID, e.Err))
}

// mapRow fills the values of r, a row of t mapped from the node r.context
// of doc, appending data-quality records to md.
func (t *mappedTable) mapRow(md *mappedDoc, doc *jsonTape, r *mappedRow) error {
	for k, pos := range t.carriedFrom {
		r.vals[k] = r.parent.vals[pos]
	}
	if t.IndexColumn != "" {
		r.vals[len(t.carriedFrom)] = pgtype.Text{String: strconv.Itoa(r.index), Valid: true}
	}
	for j := range t.Columns {
		col := &t.Columns[j]
		n, ok := doc.lookup(col.Path, r.context)
		if !ok || doc.nodes[n].kind == 'n' {
			if col.Required {
				return deliver.PermanentError(errReasonRequired,
					fmt.Errorf("%s.%s: no value at %s", t.Name, col.Name, col.Path.AppendTo(r.at())))
			}
			continue
		}
		var v any
		if col.Type == config.ColumnJSONB {
			v = doc.raw(n) // any JSON value, as written
		} else {
			v = doc.scalar(n)
		}
		co := coerce(v, col.Type, col.Epoch)
		if co.fail != "" {
			if col.Reject {
				return deliver.PermanentError(errReasonCoercion,
					fmt.Errorf("%s.%s: %s at %s cannot be stored as %s: %s", t.Name, col.Name, kind(doc.scalar(n)), col.Path.AppendTo(r.at()), col.Type, co.fail))
			}
			md.records = append(md.records, qualityRecord{
				column: t.Name + "." + col.Name, path: col.Path.AppendTo(r.at()),
				original: recordedJSON(doc.raw(n)), reason: co.fail,
			})
			continue
		}
		text := pgtype.Text{String: co.text, Valid: true}
		r.vals[t.mappedAt+j] = text
		if co.reason != "" {
			md.records = append(md.records, qualityRecord{
				column: t.Name + "." + col.Name, path: col.Path.AppendTo(r.at()),
				original: recordedJSON(doc.raw(n)), stored: text, reason: co.reason,
			})
		}
	}
	return nil
}

// checkKeys rejects rows of one document sharing a primary key, which the
// insert would refuse anyway, with a reason naming the table.
func (t *mappedTable) checkKeys(rows []mappedRow) error {
	if len(rows) < 2 || t.uniqueKey {
		return nil
	}
	seen := make(map[string]int, len(rows))
	var b strings.Builder
	for i := range rows {
		r := &rows[i]
		b.Reset()
		for _, pos := range t.keyPos {
			if pos >= 0 && r.vals[pos].Valid {
				b.WriteString(strconv.Quote(r.vals[pos].String))
			}
			b.WriteByte(0)
		}
		if j, dup := seen[b.String()]; dup {
			return deliver.PermanentError(errReasonDuplicate,
				fmt.Errorf("table %s: rows from %s and %s have the same primary key", t.Name, rows[j].at(), r.at()))
		}
		seen[b.String()] = i
	}
	return nil
}

// kind names the JSON type of a decoded value.
func kind(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	case rawJSON:
		if strings.HasPrefix(string(v), "[") {
			return "an array"
		}
		return "an object"
	}
	return "a value"
}
