package pgsink

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/changes-worker/changes-worker/shared/change"
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

// mappedRow is one row's stored values (nil: NULL) in the table's cols
// order, with the JSON value it was mapped from and that value's path, for
// its child tables.
type mappedRow struct {
	vals    []*string
	context any
	at      string
}

// qualityRecord is one coerced or nulled value.
type qualityRecord struct {
	column   string // table.column
	path     string // where the value was, e.g. items[2].qty
	original string // JSON
	stored   *string
	reason   string
}

// decodeDoc decodes a JSON value, keeping numbers as json.Number so that no
// digit is lost on the way to a numeric or bigint column.
func decodeDoc(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("decode json: %w", err)
	}
	if dec.More() {
		return nil, errors.New("decode json: more than one value")
	}
	return v, nil
}

// mapDoc maps a checked change. Its errors are permanent *deliver.Error:
// they name the table, column and path, never the value.
func (m *mapper) mapDoc(c *change.Envelope) (*mappedDoc, error) {
	if c.Tombstone() {
		return &mappedDoc{}, nil
	}
	doc, err := decodeDoc(c.Doc)
	if err != nil {
		return nil, deliver.PermanentError("invalid_body", fmt.Errorf("map document %s: %w", c.DocID, err))
	}
	if !m.filter.match(doc) {
		return &mappedDoc{filtered: true}, nil
	}
	md := &mappedDoc{rows: make([][]mappedRow, len(m.tables))}
	for ti, t := range m.tables {
		if t.Parent < 0 {
			r, err := t.mapRow(md, doc, doc, "", nil, 0)
			if err != nil {
				return nil, inDoc(c.DocID, err)
			}
			md.rows[ti] = []mappedRow{r}
			continue
		}
		for pi := range md.rows[t.Parent] {
			parent := &md.rows[t.Parent][pi]
			v, ok := t.From.Lookup(doc, parent.context)
			if !ok || v == nil {
				continue // no array, no rows
			}
			at := t.From.AppendTo(parent.at)
			elems, ok := v.([]any)
			if !ok {
				return nil, inDoc(c.DocID, deliver.PermanentError(errReasonNotArray,
					fmt.Errorf("table %s: %s holds %s, not an array", t.Name, at, kind(v))))
			}
			for i, e := range elems {
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

// mapRow maps one row of t from context (found at path at), a child of
// parent at index i, appending data-quality records to md.
func (t *mappedTable) mapRow(md *mappedDoc, doc, context any, at string, parent *mappedRow, i int) (mappedRow, error) {
	r := mappedRow{vals: make([]*string, len(t.cols)), context: context, at: at}
	for k, pos := range t.carriedFrom {
		r.vals[k] = parent.vals[pos]
	}
	if t.IndexColumn != "" {
		idx := strconv.Itoa(i)
		r.vals[len(t.carriedFrom)] = &idx
	}
	for j := range t.Columns {
		col := &t.Columns[j]
		v, ok := col.Path.Lookup(doc, context)
		if !ok || v == nil {
			if col.Required {
				return r, deliver.PermanentError(errReasonRequired,
					fmt.Errorf("%s.%s: no value at %s", t.Name, col.Name, col.Path.AppendTo(at)))
			}
			continue
		}
		co := coerce(v, col.Type, col.Epoch)
		if co.fail != "" {
			if col.Reject {
				return r, deliver.PermanentError(errReasonCoercion,
					fmt.Errorf("%s.%s: %s at %s cannot be stored as %s: %s", t.Name, col.Name, kind(v), col.Path.AppendTo(at), col.Type, co.fail))
			}
			md.records = append(md.records, qualityRecord{
				column: t.Name + "." + col.Name, path: col.Path.AppendTo(at),
				original: recordedJSON(v), reason: co.fail,
			})
			continue
		}
		text := co.text
		r.vals[t.mappedAt+j] = &text
		if co.reason != "" {
			md.records = append(md.records, qualityRecord{
				column: t.Name + "." + col.Name, path: col.Path.AppendTo(at),
				original: recordedJSON(v), stored: &text, reason: co.reason,
			})
		}
	}
	return r, nil
}

// checkKeys rejects rows of one document sharing a primary key, which the
// insert would refuse anyway, with a reason naming the table.
func (t *mappedTable) checkKeys(rows []mappedRow) error {
	if len(rows) < 2 {
		return nil
	}
	seen := make(map[string]int, len(rows))
	var b strings.Builder
	for i, r := range rows {
		b.Reset()
		for _, pos := range t.keyPos {
			if pos >= 0 && r.vals[pos] != nil {
				b.WriteString(strconv.Quote(*r.vals[pos]))
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
	switch v.(type) {
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
	}
	return "a value"
}
