package pgsink

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// stdlibDecode is the reference decodeDoc must match: one valid JSON value,
// decoded with UseNumber.
func stdlibDecode(b []byte) (any, error) {
	if !json.Valid(b) {
		return nil, errJSON
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

var decodeSamples = []string{
	`{}`, `[]`, `null`, `true`, `false`, `0`, `-0`, `12.50`, `-1.5e-3`, `1E+9`, `""`,
	` { "a" : [ 1 , 2 , { "b" : null } ] , "c" : "d" } `,
	`{"a":1,"a":2}`,
	`"plain ascii"`, `"tab\tnew\nline \"quoted\" back\\slash \/ \b\f\r"`,
	`"\u00e9\u4e2d\uD83D\uDE00"`, `"ünïcødé ✓ 😀"`,
	`"\uD83D"`, `"\uD83Dx"`, `"\uDE00\uD83D"`, `"\uD83D\u0041"`, `"\uD83D\uD83D\uDE00"`,
	"\"bad \xff utf8 \xe2\x82 end\"", "\"\xed\xa0\x80\"",
	`"\u0000"`, `{"k\u0000":"v"}`,
	`[1,2,3,[4,[5,[6]]]]`, `{"items":[{"sku":"A","qty":"3","price":9.99}],"totals":{"total":1e2}}`,
	// Invalid.
	``, ` `, `{`, `}`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `{a:1}`, `01`, `1.`, `.5`, `-`, `1e`, `1e+`, `+1`,
	`tru`, `nul`, `"unterminated`, `"bad \x escape"`, `"\u12G4"`, "\"ctrl \x01\"", `[1 2]`, `{} {}`, `1 2`, `NaN`,
	`"\`, `{"a":`, `[`, `{"a":1`, `0}0`, `[1]]`,
}

func TestTapeMatchesStdlib(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth)
	tooDeep := strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1)
	for _, in := range append(decodeSamples, deep, tooDeep) {
		checkDecode(t, []byte(in))
	}
}

func checkDecode(t *testing.T, in []byte) {
	t.Helper()
	want, wantErr := stdlibDecode(in)
	got, gotErr := decodeDoc(in)
	name := string(in)
	if len(name) > 40 {
		name = name[:40] + "..."
	}
	switch {
	case (wantErr == nil) != (gotErr == nil):
		t.Errorf("decodeDoc(%q) error = %v, encoding/json error = %v", name, gotErr, wantErr)
	case wantErr == nil && !reflect.DeepEqual(want, got):
		// cmp explains the difference, but is too slow for deep nesting.
		t.Errorf("decodeDoc(%q) differs from encoding/json (-want +got):\n%s", name, cmp.Diff(want, got))
	}
}

// FuzzDecodeDoc: the tape decoder accepts exactly what encoding/json
// accepts and decodes it to the same value.
func FuzzDecodeDoc(f *testing.F) {
	for _, s := range decodeSamples {
		f.Add([]byte(s))
	}
	for _, id := range testenv.HostileIDs() {
		f.Add([]byte(`{"_id":` + jsonString(id) + `,` + jsonString(id) + `:[` + jsonString(id) + `]}`))
	}
	f.Fuzz(func(t *testing.T, in []byte) { checkDecode(t, in) })
}

func TestTapeLookup(t *testing.T) {
	t.Parallel()
	doc, err := parseTape([]byte(`{"a":{"b":"doc-b"},"items":[{"sku":"x"},"scalar",[1,2]],"n":null,"dup":1,"dup":2,
		"esc\u0061ped":true,"e":{"sku":"elem-sku","q":"say \"hi\"\n"}}`))
	if err != nil {
		t.Fatal(err)
	}
	elem, ok := doc.lookup(config.Path{Document: true, Steps: []config.PathStep{{Key: "e", Index: -1}}}, 0)
	if !ok {
		t.Fatal("no e")
	}
	tests := []struct {
		path   string
		want   any
		wantOK bool
	}{
		{"a.b", nil, false}, // relative to the element, which has no a
		{"$.a.b", "doc-b", true},
		{"sku", "elem-sku", true},
		{"q", "say \"hi\"\n", true},
		{"@", rawJSON(`{"sku":"elem-sku","q":"say \"hi\"\n"}`), true},
		{"$.items[0].sku", "x", true},
		{"$.items[1]", "scalar", true},
		{"$.items[2][1]", json.Number("2"), true},
		{"$.items[3]", nil, false},
		{"$.items.sku", nil, false},
		{"$.a[0]", nil, false},
		{"$.n", nil, true},
		{"$.dup", json.Number("2"), true}, // the last of repeated keys, as encoding/json
		{"$.escaped", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			t.Parallel()
			p, err := config.ParsePath(tt.path)
			if err != nil {
				t.Fatal(err)
			}
			n, ok := doc.lookup(p, elem)
			var got any
			if ok {
				got = doc.scalar(n)
			}
			if ok != tt.wantOK || !cmp.Equal(got, tt.want) {
				t.Errorf("lookup(%s) = %#v, %v; want %#v, %v", tt.path, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestTapeRaw(t *testing.T) {
	t.Parallel()
	doc, err := parseTape([]byte(` {"s" : "a\"b", "n": -1.5e3, "o": { "x" : [ 1, true ] }, ` +
		`"lone": "\ud800 \u00e9", "bad": "` + "\xff" + `", "pair": ["\ud83d\ude00"] } `))
	if err != nil {
		t.Fatal(err)
	}
	var got []rawJSON
	for _, k := range []string{"s", "n", "o", "lone", "bad", "pair"} {
		n, ok := doc.lookup(config.Path{Steps: []config.PathStep{{Key: k, Index: -1}}}, 0)
		if !ok {
			t.Fatalf("no %s", k)
		}
		got = append(got, doc.raw(n))
	}
	// As written, unless jsonb would refuse it: \u escapes (an unpaired
	// surrogate) and invalid UTF-8 are re-encoded.
	want := []rawJSON{`"a\"b"`, `-1.5e3`, `{ "x" : [ 1, true ] }`, "\"\uFFFD é\"", "\"\uFFFD\"", "[\"😀\"]"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("raw values (-want +got):\n%s", diff)
	}
}
