package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParsePath(t *testing.T) {
	t.Parallel()
	key := func(k string) PathStep { return PathStep{Key: k, Index: -1} }
	idx := func(i int) PathStep { return PathStep{Index: i} }
	tests := []struct {
		in      string
		want    Path
		str     string // canonical form, when it differs from in
		wantErr string
	}{
		{in: "status", want: Path{Steps: []PathStep{key("status")}}},
		{in: "customer.name", want: Path{Steps: []PathStep{key("customer"), key("name")}}},
		{in: "items[0].sku", want: Path{Steps: []PathStep{key("items"), idx(0), key("sku")}}},
		{in: "$.total", want: Path{Document: true, Steps: []PathStep{key("total")}}},
		{in: "$", want: Path{Document: true}},
		{in: "@", want: Path{}},
		{in: "@.sku", want: Path{Steps: []PathStep{key("sku")}}, str: "sku"},
		{in: "_id", want: Path{Steps: []PathStep{key("_id")}}},
		{in: "größe.ünit-x", want: Path{Steps: []PathStep{key("größe"), key("ünit-x")}}},
		{in: `["a.b"]["$ref"][12]`, want: Path{Steps: []PathStep{key("a.b"), key("$ref"), idx(12)}}},
		{in: `$["with \"quote\""].x`, want: Path{Document: true, Steps: []PathStep{key(`with "quote"`), key("x")}}},
		{in: "[3]", want: Path{Steps: []PathStep{idx(3)}}},
		{in: "", wantErr: "is empty"},
		{in: "a..b", wantErr: "expected a name"},
		{in: "a.", wantErr: "expected a name"},
		{in: "a b", wantErr: "unexpected"},
		{in: "$x", wantErr: "must be alone"},
		{in: "a[-1]", wantErr: "not an array index"},
		{in: "a[01]", wantErr: "not an array index"},
		{in: "a[x]", wantErr: "not an array index"},
		{in: "a[1", wantErr: "unterminated"},
		{in: `a["x]`, wantErr: "unterminated"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParsePath(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParsePath(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePath(%q): %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParsePath(%q) (-want +got):\n%s", tt.in, diff)
			}
			wantStr := tt.str
			if wantStr == "" {
				wantStr = tt.in
			}
			if got.String() != wantStr {
				t.Errorf("String() = %q, want %q", got.String(), wantStr)
			}
			again, err := ParsePath(got.String())
			if err != nil || !cmp.Equal(again, got) {
				t.Errorf("String() %q does not parse back: %v", got.String(), err)
			}
		})
	}
}

func TestPathAppendTo(t *testing.T) {
	t.Parallel()
	tests := []struct{ prefix, path, want string }{
		{"", "customer.name", "customer.name"},
		{"items[2]", "sku", "items[2].sku"},
		{"items[2]", "@", "items[2]"},
		{"items[2]", "$.currency", "$.currency"},
		{"items[2]", `["a b"]`, `items[2]["a b"]`},
		{"items[2].parts[0]", "[1]", "items[2].parts[0][1]"},
	}
	for _, tt := range tests {
		p, err := ParsePath(tt.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.AppendTo(tt.prefix); got != tt.want {
			t.Errorf("%q.AppendTo(%q) = %q, want %q", tt.path, tt.prefix, got, tt.want)
		}
	}
}

// mappingFile wraps a mapping in a whole configuration file.
func mappingFile(mapping string) string {
	return `{"jobs":[{"id":"orders","source":{"type":"couchdb","url":"http://h/db"},"outputs":[
		{"id":"pg","type":"postgres","postgres":{"dsn":{"env":"D"},"mapping":` + mapping + `}}]}]}`
}

func TestMappingValid(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte(mappingFile(`{
		"filter": {"path": "type", "equals": "order"},
		"tables": [
			{"name": "orders", "primary_key": ["order_no"], "columns": [
				{"name": "order_no", "path": "order_no", "type": "bigint"},
				{"name": "placed_at", "path": "placed_at", "type": "timestamptz", "epoch": "ms", "on_error": "reject"}]},
			{"name": "order_items", "parent": "orders", "from": "items", "columns": [
				{"name": "sku", "path": "sku", "type": "text", "required": true},
				{"name": "qty", "path": "qty", "type": "integer", "on_error": "null"}]},
			{"name": "item_parts", "parent": "order_items", "from": "parts", "index_column": "part", "columns": [
				{"name": "part_no", "path": "@", "type": "text"}]}
		]}`)))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	tables, err := f.Jobs[0].Outputs[0].Postgres.Mapping.Resolve()
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	type summary struct {
		Name     string
		Parent   int
		Carried  []KeyColumn
		Index    string
		Key      []string
		Required []bool
		Reject   []bool
	}
	var got []summary
	for _, rt := range tables {
		s := summary{Name: rt.Name, Parent: rt.Parent, Carried: rt.Carried, Index: rt.IndexColumn, Key: rt.Key}
		for _, c := range rt.Columns {
			s.Required = append(s.Required, c.Required)
			s.Reject = append(s.Reject, c.Reject)
		}
		got = append(got, s)
	}
	want := []summary{
		{Name: "orders", Parent: -1, Key: []string{"order_no"}, Required: []bool{true, false}, Reject: []bool{true, true}},
		{Name: "order_items", Parent: 0, Carried: []KeyColumn{{"order_no", "bigint"}}, Index: "idx",
			Key: []string{"order_no", "idx"}, Required: []bool{true, false}, Reject: []bool{true, false}},
		{Name: "item_parts", Parent: 1, Carried: []KeyColumn{{"order_no", "bigint"}, {"idx", "integer"}}, Index: "part",
			Key: []string{"order_no", "idx", "part"}, Required: []bool{false}, Reject: []bool{false}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("resolved tables (-want +got):\n%s", diff)
	}
}

func TestMappingReportsEveryProblem(t *testing.T) {
	t.Parallel()
	const p = "jobs[orders].outputs[pg].postgres.mapping."
	tests := []struct {
		name    string
		mapping string
		want    []string // substrings, each must appear
	}{
		{
			name:    "no tables",
			mapping: `{"tables": []}`,
			want:    []string{p + "tables: at least one table is required"},
		},
		{
			name: "many problems at once",
			mapping: `{"versions_table": "Bad", "filter": {"path": "a..b"},
				"tables": [
				{"name": "Orders", "from": "x", "index_column": "i", "columns": [
					{"name": "doc_id", "path": "a", "type": "text"},
					{"name": "total", "path": "", "type": "int"},
					{"name": "total", "path": "t", "type": "numeric", "epoch": "s", "on_error": "skip"},
					{"name": "at", "path": "at", "type": "timestamptz", "epoch": "us"}]},
				{"name": "items", "parent": "nope", "columns": []},
				{"name": "items", "primary_key": ["sku", "sku", "missing"], "columns": [
					{"name": "sku", "path": "sku", "type": "text", "on_error": "null"}]}
			]}`,
			want: []string{
				p + `versions_table: "Bad" must be a lowercase SQL identifier`,
				p + `filter.path: "a..b": expected a name`,
				p + `filter.equals: is required`,
				p + `tables[0].name: "Orders" must be a lowercase SQL identifier`,
				p + `tables[0].from: is only for child tables`,
				p + `tables[0].index_column: is only for child tables`,
				p + `tables[0].columns[0].name: "doc_id" is the document id column`,
				p + `tables[0].columns[1].path: is empty`,
				p + `tables[0].columns[1].type: "int" is not one of text, integer, bigint, numeric, boolean, timestamptz, jsonb, uuid`,
				p + `tables[0].columns[2].name: "total" is another column`,
				p + `tables[0].columns[2].epoch: only applies to timestamptz columns`,
				p + `tables[0].columns[2].on_error: "skip" is not null or reject`,
				p + `tables[0].columns[3].epoch: "us" is not s or ms`,
				p + `tables[1].parent: "nope" is not a table defined before this one`,
				p + `tables[1].from: is required for a child table`,
				p + `tables[1].columns: at least one column is required`,
				p + `tables[2].name: "items" is used by another table`,
				p + `tables[2].primary_key[1]: "sku" is listed twice`,
				p + `tables[2].primary_key[2]: "missing" is not a column of this table`,
				p + `tables[2].columns[0].on_error: null cannot apply to a required or primary key column`,
			},
		},
		{
			name: "child table names",
			mapping: `{"quality_table": "orders", "tables": [
				{"name": "orders", "primary_key": ["no"], "columns": [{"name": "no", "path": "no", "type": "bigint"}]},
				{"name": "items", "parent": "orders", "from": "items[", "index_column": "no", "columns": [
					{"name": "idx", "path": "x", "type": "text"}]},
				{"name": "` + strings.Repeat("t", 53) + `", "columns": [{"name": "a", "path": "a", "type": "text"}]}
			]}`,
			want: []string{
				p + `tables[0].name: "orders" is also the versions or quality table`,
				p + `tables[1].from: "items[": unterminated [`,
				p + `tables[1].index_column: "no" is a key column carried from orders`,
				p + `tables[2].name: "ttttt`, "is longer than 52 bytes",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(mappingFile(tt.mapping)))
			wantErrorWith(t, err, "Parse accepted an invalid mapping", tt.want...)
		})
	}
}

func TestMappingValidate(t *testing.T) {
	t.Parallel()
	m := &Mapping{Tables: []*MappedTable{{Name: "t", Columns: []*MappedColumn{{Name: "a", Path: "a", Type: "text"}}}}}
	if err := m.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	m.Tables[0].Columns[0].Type = "varchar"
	if err := m.Validate(); err == nil || !strings.Contains(err.Error(), `mapping.tables[0].columns[0].type: "varchar"`) {
		t.Errorf("Validate = %v, want the type named", err)
	}
}
