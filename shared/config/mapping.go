package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Mapping maps each document of a postgres output onto relational tables
// (mapping mode) instead of one jsonb row per document (document mode).
//
// Every mapped table gets a doc_id column holding the document id, so a
// deleted document's rows can be found in every table. A root table (no
// parent) gets one row per document; a child table gets one row per element
// of the array its From path names in each row of its parent, and carries the
// parent's primary key columns (with their types) and an element index
// column. Example:
//
//	"mapping": {
//	  "filter": {"path": "type", "equals": "order"},
//	  "tables": [
//	    {"name": "orders", "columns": [
//	      {"name": "status", "path": "status", "type": "text", "required": true},
//	      {"name": "placed_at", "path": "placed_at", "type": "timestamptz", "epoch": "ms"}]},
//	    {"name": "order_items", "parent": "orders", "from": "items", "columns": [
//	      {"name": "sku", "path": "sku", "type": "text"},
//	      {"name": "qty", "path": "qty", "type": "integer", "on_error": "reject"}]}]
//	}
type Mapping struct {
	// Tables in dependency order: a parent before its children.
	Tables []*MappedTable `json:"tables"`
	// Filter, when set, selects the documents to map. A live document that
	// does not match is treated like a deleted one: its rows are removed from
	// every mapped table (it may have matched before) and its version is
	// recorded.
	Filter *MappingFilter `json:"filter,omitempty"`
	// VersionsTable holds the version applied per document.
	// Default: "<table>_versions", <table> being the output's table setting.
	VersionsTable string `json:"versions_table,omitempty"`
	// QualityTable records every coerced or nulled value.
	// Default: "<table>_data_quality".
	QualityTable string `json:"quality_table,omitempty"`
}

// MappedTable is one table of a mapping.
type MappedTable struct {
	Name string `json:"name"`
	// Parent names an earlier table; this table then gets one row per element
	// of the array From names, relative to each parent row's context.
	Parent string `json:"parent,omitempty"`
	From   string `json:"from,omitempty"`
	// IndexColumn holds the element's position in the array (from 0); child
	// tables only. Default "idx".
	IndexColumn string          `json:"index_column,omitempty"`
	Columns     []*MappedColumn `json:"columns"`
	// PrimaryKey lists the key columns, which may include doc_id, the carried
	// parent key columns and the index column. Default: doc_id for a root
	// table; the parent's key and the index column for a child table.
	PrimaryKey []string `json:"primary_key,omitempty"`
}

// MappedColumn is one column filled from the document. A missing path or a
// JSON null stores NULL (and records nothing) unless the column is required.
type MappedColumn struct {
	Name string `json:"name"`
	// Path locates the value; see Path for the syntax.
	Path string `json:"path"`
	// Type is one of the Column* types.
	Type string `json:"type"`
	// Required columns are NOT NULL: a missing, null or uncoercible value is a
	// permanent error. Primary key columns are always required.
	Required bool `json:"required,omitempty"`
	// OnError says what happens to a value that cannot be coerced to Type:
	// "null" (default) stores NULL and records it in the data-quality table;
	// "reject" fails the document permanently (it goes to the DLQ).
	OnError string `json:"on_error,omitempty"`
	// Epoch is the unit of numbers in a timestamptz column, "s" or "ms".
	// Unset, the unit is guessed from the magnitude (below 1e11: seconds,
	// else milliseconds) and each guess is recorded as a coercion.
	Epoch string `json:"epoch,omitempty"`
}

// MappingFilter matches documents whose value at Path equals Equals (JSON
// equality: numbers by value, objects regardless of key order). A document
// without the path does not match.
type MappingFilter struct {
	Path   string          `json:"path"`
	Equals json.RawMessage `json:"equals"`
}

// Column types.
const (
	ColumnText        = "text"
	ColumnInteger     = "integer"
	ColumnBigint      = "bigint"
	ColumnNumeric     = "numeric"
	ColumnBoolean     = "boolean"
	ColumnTimestamptz = "timestamptz"
	ColumnJSONB       = "jsonb"
	ColumnUUID        = "uuid"
)

var columnTypes = []string{ColumnText, ColumnInteger, ColumnBigint, ColumnNumeric, ColumnBoolean, ColumnTimestamptz, ColumnJSONB, ColumnUUID}

// On-error actions and epoch units.
const (
	OnErrorNull   = "null"
	OnErrorReject = "reject"
	EpochSeconds  = "s"
	EpochMillis   = "ms"
)

// Names every mapping uses.
const (
	// DocIDColumn is the column holding the document id in every mapped table.
	DocIDColumn = "doc_id"
	// DefaultIndexColumn holds a child row's array position.
	DefaultIndexColumn = "idx"
	// maxMappedTable keeps "<table>_doc_id_idx", the name of the doc_id index
	// a table whose key does not start with doc_id gets, within PostgreSQL's
	// 63-byte identifiers.
	maxMappedTable = 63 - len("_doc_id_idx")
)

// ResolvedTable is a mapped table with its defaults applied and its paths
// parsed, as Resolve returns it.
type ResolvedTable struct {
	*MappedTable
	// Parent is the index of the parent in the resolved tables, -1 for a root table.
	Parent int
	// From is the parsed From path (child tables).
	From Path
	// Carried are the parent's key columns copied into each row, doc_id
	// excepted (every table has it).
	Carried []KeyColumn
	// IndexColumn is the element index column, "" for a root table.
	IndexColumn string
	// Key is the effective primary key.
	Key     []string
	Columns []ResolvedColumn
}

// KeyColumn is a column carried from a parent table.
type KeyColumn struct {
	Name, Type string
}

// ResolvedColumn is a mapped column with its defaults applied.
type ResolvedColumn struct {
	*MappedColumn
	Path Path
	// Required is set for required and primary key columns.
	Required bool
	// Reject is set when an uncoercible value fails the document.
	Reject bool
}

// Type returns the type of the column name in t: doc_id, a carried key, the
// index column or a mapped column.
func (t *ResolvedTable) Type(name string) (string, bool) {
	switch {
	case name == DocIDColumn:
		return ColumnText, true
	case name == t.IndexColumn && name != "":
		return ColumnInteger, true
	}
	for _, c := range t.Carried {
		if c.Name == name {
			return c.Type, true
		}
	}
	for _, c := range t.Columns {
		if c.Name == name {
			return c.Type, true
		}
	}
	return "", false
}

// Validate reports every problem of a mapping at once, each naming its field
// below "mapping".
func (m *Mapping) Validate() error {
	return errors.Join(m.validate("mapping")...)
}

// Resolve returns the tables with defaults applied, in order, or the
// mapping's problems.
func (m *Mapping) Resolve() ([]*ResolvedTable, error) {
	tables, errs := m.resolve("mapping")
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return tables, nil
}

func (m *Mapping) validate(p string) []error {
	_, errs := m.resolve(p)
	return errs
}

func (m *Mapping) resolve(p string) ([]*ResolvedTable, []error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", p, field, fmt.Sprintf(format, args...)))
	}
	if len(m.Tables) == 0 {
		bad("tables", "at least one table is required")
	}
	for _, f := range []struct{ field, name string }{{"versions_table", m.VersionsTable}, {"quality_table", m.QualityTable}} {
		if f.name != "" && !identPattern.MatchString(f.name) {
			bad(f.field, "%q must be a lowercase SQL identifier", f.name)
		}
	}
	if m.VersionsTable != "" && m.VersionsTable == m.QualityTable {
		bad("quality_table", "%q is also the versions table", m.QualityTable)
	}
	if f := m.Filter; f != nil {
		if _, err := ParsePath(f.Path); err != nil {
			bad("filter.path", "%v", err)
		}
		if len(bytes.TrimSpace(f.Equals)) == 0 {
			bad("filter.equals", "is required (the JSON value to match)")
		} else if _, err := decodeJSON(f.Equals); err != nil {
			bad("filter.equals", "%v", err)
		}
	}

	var tables []*ResolvedTable
	index := map[string]int{} // usable tables by name
	named := map[string]bool{}
	for i, t := range m.Tables {
		tp := fmt.Sprintf("tables[%d]", i)
		if t == nil {
			bad(tp, "must be an object")
			continue
		}
		rt, terrs := m.resolveTable(p+"."+tp, t, tables, index)
		errs = append(errs, terrs...)
		if named[t.Name] {
			bad(tp+".name", "%q is used by another table", t.Name)
			rt = nil
		}
		named[t.Name] = true
		if rt != nil {
			index[t.Name] = len(tables)
		}
		if t.Name != "" && (t.Name == m.VersionsTable || t.Name == m.QualityTable) {
			bad(tp+".name", "%q is also the versions or quality table", t.Name)
		}
		if rt != nil {
			tables = append(tables, rt)
		}
	}
	return tables, errs
}

// resolveTable checks t and applies its defaults; earlier are the tables
// resolved so far, by name in index. It returns nil when t cannot serve as a
// parent (its name or key is unusable).
func (m *Mapping) resolveTable(p string, t *MappedTable, earlier []*ResolvedTable, index map[string]int) (*ResolvedTable, []error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", p, field, fmt.Sprintf(format, args...)))
	}
	usable := true
	rt := &ResolvedTable{MappedTable: t, Parent: -1}
	switch {
	case !identPattern.MatchString(t.Name):
		bad("name", "%q must be a lowercase SQL identifier", t.Name)
		usable = false
	case len(t.Name) > maxMappedTable:
		bad("name", "%q is longer than %d bytes", t.Name, maxMappedTable)
		usable = false
	}

	// Columns every row has besides the mapped ones.
	names := map[string]string{DocIDColumn: "the document id column"}
	if t.Parent == "" {
		if t.From != "" {
			bad("from", "is only for child tables (set parent)")
		}
		if t.IndexColumn != "" {
			bad("index_column", "is only for child tables (set parent)")
		}
	} else {
		pi, ok := index[t.Parent]
		if !ok {
			bad("parent", "%q is not a table defined before this one", t.Parent)
			usable = false
		} else {
			rt.Parent = pi
			parent := earlier[pi]
			for _, k := range parent.Key {
				if k == DocIDColumn {
					continue
				}
				typ, _ := parent.Type(k)
				rt.Carried = append(rt.Carried, KeyColumn{Name: k, Type: typ})
				names[k] = "a key column carried from " + parent.Name
			}
		}
		if t.From == "" {
			bad("from", "is required for a child table (the path of the array to map)")
		} else if path, err := ParsePath(t.From); err != nil {
			bad("from", "%v", err)
		} else {
			rt.From = path
		}
		rt.IndexColumn = t.IndexColumn
		if rt.IndexColumn == "" {
			rt.IndexColumn = DefaultIndexColumn
		}
		if !identPattern.MatchString(rt.IndexColumn) {
			bad("index_column", "%q must be a lowercase SQL identifier", rt.IndexColumn)
		} else if what, taken := names[rt.IndexColumn]; taken {
			bad("index_column", "%q is %s", rt.IndexColumn, what)
		}
		names[rt.IndexColumn] = "the index column"
	}

	if len(t.Columns) == 0 {
		bad("columns", "at least one column is required")
	}
	for i, c := range t.Columns {
		cp := fmt.Sprintf("columns[%d]", i)
		if c == nil {
			bad(cp, "must be an object")
			continue
		}
		// Only an explicit key holds mapped columns.
		rc := ResolvedColumn{MappedColumn: c, Required: c.Required || slices.Contains(t.PrimaryKey, c.Name)}
		if !identPattern.MatchString(c.Name) {
			bad(cp+".name", "%q must be a lowercase SQL identifier", c.Name)
		} else if what, taken := names[c.Name]; taken {
			bad(cp+".name", "%q is %s", c.Name, what)
		}
		names[c.Name] = "another column"
		if path, err := ParsePath(c.Path); err != nil {
			bad(cp+".path", "%v", err)
		} else {
			rc.Path = path
		}
		if !slices.Contains(columnTypes, c.Type) {
			if c.Type == "" {
				bad(cp+".type", "is required (one of %s)", strings.Join(columnTypes, ", "))
			} else {
				bad(cp+".type", "%q is not one of %s", c.Type, strings.Join(columnTypes, ", "))
			}
		}
		switch c.Epoch {
		case "":
		case EpochSeconds, EpochMillis:
			if c.Type != ColumnTimestamptz {
				bad(cp+".epoch", "only applies to timestamptz columns")
			}
		default:
			bad(cp+".epoch", "%q is not s or ms", c.Epoch)
		}
		switch c.OnError {
		case "":
			rc.Reject = rc.Required
		case OnErrorReject:
			rc.Reject = true
		case OnErrorNull:
			if rc.Required {
				bad(cp+".on_error", "null cannot apply to a required or primary key column")
			}
		default:
			bad(cp+".on_error", "%q is not null or reject", c.OnError)
		}
		rt.Columns = append(rt.Columns, rc)
	}

	// The key: explicit, or the default.
	rt.Key = t.PrimaryKey
	if len(rt.Key) == 0 {
		if rt.Parent >= 0 {
			rt.Key = append(slices.Clone(earlier[rt.Parent].Key), rt.IndexColumn)
		} else {
			rt.Key = []string{DocIDColumn}
		}
	}
	seen := map[string]bool{}
	for i, k := range rt.Key {
		if _, ok := rt.Type(k); !ok {
			bad(fmt.Sprintf("primary_key[%d]", i), "%q is not a column of this table", k)
			usable = false
		}
		if seen[k] {
			bad(fmt.Sprintf("primary_key[%d]", i), "%q is listed twice", k)
		}
		seen[k] = true
	}
	if !usable {
		return nil, errs
	}
	return rt, errs
}

// decodeJSON decodes one JSON value, keeping numbers as json.Number.
func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("not valid JSON: more than one value")
	}
	return v, nil
}
