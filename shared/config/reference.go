package config

import (
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"time"
)

// keyDoc documents one key of the file in the reference.
type keyDoc struct {
	// allowed is what the checks accept: a range "min–max" (integers or
	// durations, both ends included), values, or a rule; "" for anything
	// of the key's type.
	allowed string
	// def is the default where SetDefaults does not show it: "required",
	// or a default made from other keys. "" takes it from SetDefaults.
	def string
	// meaning is one line saying what the key does.
	meaning string
}

// referenceTitles are the objects the reference gives a table of their own,
// by Go type, with that table's title when the object is found in several
// places; the table of any other object is titled by its key. An object
// not listed has its keys listed, dotted, among those of the object
// holding it.
func referenceTitles() map[reflect.Type]string {
	return map[reflect.Type]string{
		reflect.TypeFor[Stack]():          "",
		reflect.TypeFor[Job]():            "",
		reflect.TypeFor[Attachments]():    "",
		reflect.TypeFor[Output]():         "",
		reflect.TypeFor[PostgresOutput](): "",
		reflect.TypeFor[Mapping]():        "",
		reflect.TypeFor[MappedTable]():    "",
		reflect.TypeFor[MappedColumn]():   "",
		reflect.TypeFor[HTTPOutput]():     "",
		reflect.TypeFor[S3Output]():       "",
		reflect.TypeFor[Auth]():           "auth",
		reflect.TypeFor[SecretRef]():      "secret reference",
	}
}

// refSection is one table of the reference: the keys of one object.
type refSection struct {
	// path is where the object is ("jobs[].outputs[]"), or its title.
	path string
	typ  reflect.Type
	// places are the keys of an object found in several places; nil for
	// the others.
	places []string
	rows   []refRow
}

// refRow is one key of a section.
type refRow struct {
	key  string // below the section's path: "feed.limit"
	path string // the whole key, which indexes keyDocs: "jobs[].feed.limit"
	typ  string
}

// refBuilder collects the sections of the reference.
type refBuilder struct {
	titles   map[reflect.Type]string // referenceTitles
	sections []*refSection
	seen     map[reflect.Type]bool
	shared   []reflect.Type            // the objects found in several places, whose tables come last
	places   map[reflect.Type][]string // the keys each of those is found at
}

// reference returns the tables of the reference: the top level, then each
// object after the one holding it, in the order of its key; the objects
// found in several places last.
func reference() []*refSection {
	r := &refBuilder{titles: referenceTitles(), seen: map[reflect.Type]bool{}, places: map[reflect.Type][]string{}}
	r.section("", reflect.TypeFor[File]())
	for i := 0; i < len(r.shared); i++ {
		r.section(r.titles[r.shared[i]], r.shared[i])
	}
	for _, s := range r.sections {
		s.places = r.places[s.typ]
	}
	return r.sections
}

// section adds the table of the object of type t at path, then the tables
// of the objects it holds.
func (r *refBuilder) section(path string, t reflect.Type) {
	s := &refSection{path: path, typ: t}
	r.sections = append(r.sections, s)
	var nested []func()
	r.rows(s, "", t, &nested)
	for _, n := range nested {
		n()
	}
}

// rows adds the keys of the object of type t, below prefix, to s; nested
// gets the tables of the objects that have their own.
func (r *refBuilder) rows(s *refSection, prefix string, t reflect.Type, nested *[]func()) {
	for _, f := range fields(t) {
		key := prefix + f.name
		path := joinKey(s.path, key)
		elem, list := refElem(f.typ)
		title, own := r.titles[elem]
		switch {
		case own:
			where := path + listMark(list)
			if title != "" {
				where = title
			}
			s.rows = append(s.rows, refRow{key: key, path: path, typ: refObjectType(list, title, where)})
			if title != "" {
				r.places[elem] = append(r.places[elem], path)
			}
			if r.seen[elem] {
				continue
			}
			r.seen[elem] = true
			if title != "" {
				r.shared = append(r.shared, elem)
				continue
			}
			*nested = append(*nested, func() { r.section(where, elem) })
		case elem.Kind() == reflect.Struct && !refLeaf(elem):
			r.rows(s, key+listMark(list)+".", elem, nested)
		default:
			s.rows = append(s.rows, refRow{key: key, path: path, typ: refType(f.typ)})
		}
	}
}

// refLeaf reports whether values of t are shown whole: they decode
// themselves.
func refLeaf(t reflect.Type) bool {
	return t == durationType || t == headerValueType || t == rawMessageType
}

// refElem is the object type t holds: itself, or its element for a list
// (list set); pointers removed.
func refElem(t reflect.Type) (elem reflect.Type, list bool) {
	t = deref(t)
	if t.Kind() == reflect.Slice && !refLeaf(t) {
		return deref(t.Elem()), true
	}
	return t, false
}

func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// listMark is "[]" for a list's key.
func listMark(list bool) string {
	if list {
		return "[]"
	}
	return ""
}

// refObjectType is the type column of a key whose object has its own table.
func refObjectType(list bool, title, where string) string {
	switch {
	case title != "":
		return title
	case list:
		return "list of objects: `" + where + "`"
	}
	return "object: `" + where + "`"
}

// refType is the type column of a key shown whole.
func refType(t reflect.Type) string {
	t = deref(t)
	switch {
	case t == durationType:
		return "duration"
	case t == rawMessageType:
		return "JSON value"
	case t.Kind() == reflect.Map && t.Elem() == headerValueType:
		return "object: name → string or secret reference"
	case t.Kind() == reflect.Slice:
		return "list of " + refType(t.Elem()) + "s"
	case t.Kind() == reflect.Bool:
		return "boolean"
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		return "integer"
	case t.Kind() == reflect.Float64:
		return "number"
	}
	return t.Kind().String()
}

// writeReference writes the configuration reference, docs/configuration.md:
// a table of every object's keys with their type, default, the values the
// checks accept and their meaning.
func writeReference(w io.Writer) error {
	sample, err := newRefSample("", "job", "", false)
	if err != nil {
		return fmt.Errorf("write reference: %w", err)
	}
	var b strings.Builder
	b.WriteString("# Configuration reference\n\n")
	b.WriteString("For whoever writes or reviews a job configuration file: every key, its type, default, accepted values and meaning.\n\n")
	b.WriteString("<!-- Generated from shared/config (reference.go, keydocs.go): go test ./shared/config -run TestReferenceDoc -update -->\n\n")
	b.WriteString("## The file and its values\n\n| what | how it is written |\n| --- | --- |\n")
	for _, v := range referenceValues {
		fmt.Fprintf(&b, "| %s | %s |\n", v[0], v[1])
	}
	docs := keyDocs()
	for _, s := range reference() {
		title := "`" + s.path + "`"
		if s.path == "" {
			title = "Top level"
		}
		if s.places != nil {
			title = s.path + ": the value of `" + strings.Join(s.places, "`, `") + "`"
		}
		fmt.Fprintf(&b, "\n## %s\n\n| key | type | default | allowed | meaning |\n| --- | --- | --- | --- | --- |\n", title)
		for _, r := range s.rows {
			d := docs[r.path]
			def := d.def
			if def == "" && s.places == nil {
				def = sample.defaultAt(r.path)
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", r.key, r.typ, orNone(def), orNone(d.allowed), d.meaning)
		}
	}
	_, err = io.WriteString(w, b.String())
	return err
}

// referenceValues explains the file and the types of its values.
var referenceValues = [][2]string{
	{"the file", "JSON with snake_case keys, each given once and written in lowercase as below; `//` and `/* */` comments are allowed; an unknown key is an error"},
	{"duration", "a string such as `\"10s\"`, `\"1m\"` or `\"500ms\"`, or a number of seconds; 0 is refused: leave the key out for its default"},
	{"integer, number", "0 is refused where the key has a default other than 0: leave the key out for it"},
	{"secret reference", "`{\"env\": \"NAME\"}` or `{\"secret\": \"name or ARN\", \"json_key\": \"key\"}`; the value itself never goes in the file"},
	{"path", "`a.b`, `items[0].sku`, `[\"odd.key\"]`; `$` starts at the document root, `@` (or nothing) at the current element"},
	{"key in an error", "`jobs[<id>].outputs[<id>].<key>`, by id, or by index for an element without one"},
}

// orNone is s, or a dash for nothing.
func orNone(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// refSample is a file that sets one of each object, as written and with
// its defaults: where the reference reads the defaults.
type refSample struct {
	written, defaulted *File
}

// newRefSample makes the sample of a job with these ids (and a default
// prefix for ""): a postgres output with a mapping, an http output and an
// s3 one, each id starting with outputPrefix, in the reverse order if
// reversed.
func newRefSample(prefix, job, outputPrefix string, reversed bool) (refSample, error) {
	outputs := []string{
		fmt.Sprintf(`{"id": %q, "type": "postgres", "postgres": {"dsn": {"env": "D"}, "mapping": {"filter": {"path": "t", "equals": 1},
			"tables": [{"name": "t", "columns": [{"name": "c", "path": "c", "type": "text"}]},
				{"name": "u", "parent": "t", "from": "xs", "columns": [{"name": "c", "path": "c", "type": "text"}]}]}}}`, outputPrefix+"pg"),
		fmt.Sprintf(`{"id": %q, "type": "http", "http": {"url": "https://h/{doc_id}", "auth": {"type": "basic", "username": "u", "password": {"env": "P"}}}}`, outputPrefix+"hook"),
		fmt.Sprintf(`{"id": %q, "type": "s3", "s3": {}}`, outputPrefix+"files"),
	}
	if reversed {
		slices.Reverse(outputs)
	}
	stack := `"vpc": {"id": "v", "subnet_ids": ["s"], "security_group_ids": ["g"]}`
	if prefix != "" {
		stack = fmt.Sprintf(`"prefix": %q, %s`, prefix, stack)
	}
	doc := fmt.Appendf(nil, `{"stack": {%s},
		"jobs": [{"id": %q, "source": {"type": "sync_gateway", "url": "https://h/db", "tls": {"ca_file": "/ca.pem"},
			"auth": {"type": "basic", "username": "u", "password": {"env": "P"}}},
			"attachments": {"enabled": true}, "outputs": [%s]}]}`, stack, job, strings.Join(outputs, ", "))
	var s refSample
	if err := json.Unmarshal(doc, &s.written); err != nil {
		return s, fmt.Errorf("decode reference sample: %w", err)
	}
	var err error
	s.defaulted, err = Parse(doc)
	return s, err
}

// defaultAt is the default of the key path as the reference shows it: what
// SetDefaults puts there, false for a boolean it leaves, "" for none.
func (s refSample) defaultAt(path string) string {
	d, _, ok := valueAt(reflect.ValueOf(s.defaulted), refKeys(path), "")
	if !ok {
		return ""
	}
	if w, _, ok := valueAt(reflect.ValueOf(s.written), refKeys(path), ""); ok && reflect.DeepEqual(w.Interface(), d.Interface()) {
		if d.Kind() == reflect.Bool {
			return "false"
		}
		return ""
	}
	return formatDefault(d)
}

// refKeys splits a key of the reference into the keys that lead to it.
func refKeys(path string) []string {
	return strings.Split(strings.ReplaceAll(path, "[]", ""), ".")
}

// valueAt follows keys from v, a value of the file at key p, to the value
// they lead to and its key as an error names it. A list's elements are
// tried in turn, the first that has the keys giving the value.
func valueAt(v reflect.Value, keys []string, p string) (reflect.Value, string, bool) {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return v, "", false
		}
		v = v.Elem()
	}
	if len(keys) == 0 {
		return v, p, true
	}
	switch v.Kind() {
	case reflect.Slice:
		for i := range v.Len() {
			id, _, _ := valueAt(v.Index(i), []string{"id"}, "")
			if got, key, ok := valueAt(v.Index(i), keys, item(p, i, id.String())); ok {
				return got, key, true
			}
		}
	case reflect.Struct:
		for _, f := range fields(v.Type()) {
			if f.name == keys[0] {
				return valueAt(v.Field(f.index), keys[1:], joinKey(p, f.name))
			}
		}
	}
	return v, "", false
}

// formatDefault shows v, a default, in the reference.
func formatDefault(v reflect.Value) string {
	switch {
	case v.Type() == durationType:
		return "`" + formatDuration(v.Interface().(Duration).D()) + "`"
	case v.Kind() == reflect.String:
		return "`" + v.String() + "`"
	case v.Kind() == reflect.Bool:
		return fmt.Sprint(v.Bool())
	case v.Kind() == reflect.Int || v.Kind() == reflect.Int64:
		return formatCount(v.Int())
	case v.Kind() == reflect.Float64:
		return fmt.Sprint(v.Float())
	}
	return ""
}

// formatDuration writes d without zero units: "1m", "90s", "10ms".
func formatDuration(d time.Duration) string {
	if d%time.Minute == 0 {
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	if d%time.Second == 0 {
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}

// formatCount writes n, with its size in KiB or MiB where it is a whole
// number of them.
func formatCount(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d (%d MiB)", n, n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d (%d KiB)", n, n>>10)
	}
	return fmt.Sprint(n)
}
