package pgsink

import (
	"encoding/json"
	"fmt"
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
// cols order, with the node it was mapped from and that node's path, for
// its child tables.
type mappedRow struct {
	vals    []pgtype.Text
	context int
	at      string
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
	if doc.nodes[0].kind != '{' {
		return nil, deliver.PermanentError("invalid_body", fmt.Errorf("map document %s: body is %s, not a JSON object", c.DocID, kind(doc.scalar(0))))
	}
	if !m.filter.match(doc) {
		return &mappedDoc{filtered: true}, nil
	}
	md := &mappedDoc{rows: make([][]mappedRow, len(m.tables))}
	for ti, t := range m.tables {
		if t.Parent < 0 {
			r, err := t.mapRow(md, doc, 0, "", nil, 0)
			if err != nil {
				return nil, inDoc(c.DocID, err)
			}
			md.rows[ti] = []mappedRow{r}
			continue
		}
		for pi := range md.rows[t.Parent] {
			parent := &md.rows[t.Parent][pi]
			n, ok := doc.lookup(t.From, parent.context)
			if !ok || doc.nodes[n].kind == 'n' {
				continue // no array, no rows
			}
			at := t.From.AppendTo(parent.at)
			if doc.nodes[n].kind != '[' {
				return nil, inDoc(c.DocID, deliver.PermanentError(errReasonNotArray,
					fmt.Errorf("table %s: %s holds %s, not an array", t.Name, at, kind(doc.scalar(n)))))
			}
			for i, e := range doc.elements(n) {
				r, err := t.mapRow(md, doc, e, at+"["+strconv.Itoa(i)+"]", parent, i)
				if err != nil {
					return nil, inDoc(c.DocID, err)
				}
				md.rows[ti] = append(md.rows[ti], r)
			}
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

// mapRow maps one row of t from the node context of doc (found at path at),
// a child of parent at index i, appending data-quality records to md.
func (t *mappedTable) mapRow(md *mappedDoc, doc *jsonTape, context int, at string, parent *mappedRow, i int) (mappedRow, error) {
	r := mappedRow{vals: make([]pgtype.Text, len(t.cols)), context: context, at: at}
	for k, pos := range t.carriedFrom {
		r.vals[k] = parent.vals[pos]
	}
	if t.IndexColumn != "" {
		r.vals[len(t.carriedFrom)] = pgtype.Text{String: strconv.Itoa(i), Valid: true}
	}
	for j := range t.Columns {
		col := &t.Columns[j]
		n, ok := doc.lookup(col.Path, context)
		if !ok || doc.nodes[n].kind == 'n' {
			if col.Required {
				return r, deliver.PermanentError(errReasonRequired,
					fmt.Errorf("%s.%s: no value at %s", t.Name, col.Name, col.Path.AppendTo(at)))
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
				return r, deliver.PermanentError(errReasonCoercion,
					fmt.Errorf("%s.%s: %s at %s cannot be stored as %s: %s", t.Name, col.Name, kind(doc.scalar(n)), col.Path.AppendTo(at), col.Type, co.fail))
			}
			md.records = append(md.records, qualityRecord{
				column: t.Name + "." + col.Name, path: col.Path.AppendTo(at),
				original: recordedJSON(doc.raw(n)), reason: co.fail,
			})
			continue
		}
		text := pgtype.Text{String: co.text, Valid: true}
		r.vals[t.mappedAt+j] = text
		if co.reason != "" {
			md.records = append(md.records, qualityRecord{
				column: t.Name + "." + col.Name, path: col.Path.AppendTo(at),
				original: recordedJSON(doc.raw(n)), stored: text, reason: co.reason,
			})
		}
	}
	return r, nil
}

// checkKeys rejects rows of one document sharing a primary key, which the
// insert would refuse anyway, with a reason naming the table.
func (t *mappedTable) checkKeys(rows []mappedRow) error {
	if len(rows) < 2 || t.uniqueKey {
		return nil
	}
	seen := make(map[string]int, len(rows))
	var b strings.Builder
	for i, r := range rows {
		b.Reset()
		for _, pos := range t.keyPos {
			if pos >= 0 && r.vals[pos].Valid {
				b.WriteString(strconv.Quote(r.vals[pos].String))
			}
			b.WriteByte(0)
		}
		if j, dup := seen[b.String()]; dup {
			return deliver.PermanentError(errReasonDuplicate,
				fmt.Errorf("table %s: rows from %s and %s have the same primary key", t.Name, rows[j].at, r.at))
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
