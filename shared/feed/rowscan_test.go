package feed

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// rowScanSeeds are rows that stress what encoding/json does with member
// names and values: letter case, escapes, Unicode letters that fold onto
// ASCII ones, repeated names, null, values of other types, nesting,
// whitespace and strings holding quotes and backslashes.
func rowScanSeeds() []string {
	seeds := []string{
		`{"seq":1,"id":"a","changes":[{"rev":"1-a"}],"doc":{"_id":"a","_rev":"1-a","v":1}}`,
		` {"seq" : 1 , "id" : "a" , "changes" : [ { "rev" : "1-a" } , {"rev":"2-b"} ] , "doc" : { "_id" : "a" , "_rev" : "1-a" } } `,
		`{"SEQ":1,"Id":"a","CHANGES":[{"REV":"1-a"}],"DOC":{"_ID":"a","_Rev":"1-a","_DELETED":true}}`,
		`{"seq":1,"id":"a","doc":{"_deleted":true,"_deleted":null}}`,
		`{"seq":1,"id":"a","doc":{"_deleted":true,"_deleted":false}}`,
		`{"seq":1,"id":"a","doc":{"_deleted":false,"_DELETED":true}}`,
		`{"seq":1,"id":"a","doc":{"_deleted":"true"}}`,
		`{"seq":1,"id":"a","doc":{"_deleted":1,"_deleted":true}}`,
		`{"seq":1,"id":"a","doc":{"_rev":"1-a","_rev":null}}`,
		`{"seq":1,"id":"a","doc":{"_rev":"1-a","_rev":7}}`,
		`{"seq":1,"id":"a","doc":{"_rev":["1-a"]}}`,
		`{"seq":1,"id":"a","doc":{"_id":5,"_rev":"1-a"}}`,
		`{"seq":1,"id":"a","doc":{"_id":{"x":1},"_rev":"1-a"}}`,
		`{"seq":1,"id":"a","doc":{"_removed":true}}`,
		`{"seq":1,"id":"a","doc":{"_removed":{}}}`,
		`{"seq":1,"id":"a","doc":{"\u005frev":"1-a"}}`,
		`{"seq":1,"id":"a","doc":{"_rev":"1-\u0061"}}`,
		`{"seq":1,"id":"a","doc":{"_rev":"1-a\"b\\"}}`,
		`{"seq":1,"id":"a","doc":{"_rev":"1-é"}}`,
		"{\"seq\":1,\"id\":\"a\",\"doc\":{\"_rev\":\"1-\xff\"}}",
		"{\"seq\":1,\"id\":\"a\xff\",\"doc\":{}}",
		`{"seq":1,"id":"a","doc":{"_dele\u212ated":true}}`,
		`{"seq":1,"id":"a","doc":{"_dele` + "\u212a" + `ted":true}}`,
		`{"seq":1,"id":"a","revo` + "\u212a" + `ed":true}`,
		`{"ſeq":1,"id":"a"}`,
		`{"seq":1,"\u0069d":"a"}`,
		`{"seq":1,"id":"a","id":"b"}`,
		`{"seq":1,"id":"a","id":null}`,
		`{"seq":1,"id":"a","id":5}`,
		`{"seq":1,"id":"\u0061"}`,
		`{"seq":1,"id":"a\"b"}`,
		`{"seq":1,"id":""}`,
		`{"seq":1}`,
		`{}`, `null`, `[]`, `[{"id":"a"}]`, `"a"`, `5`, `true`,
		`{"seq":1,"id":"a","doc":null}`,
		`{"seq":1,"id":"a","doc":{"_rev":"1-a"},"doc":5}`,
		`{"seq":1,"id":"a","doc":5,"doc":{"_rev":"1-a"}}`,
		`{"seq":1,"id":"a","doc":{"_rev":"1-a"},"doc":null}`,
		`{"seq":1,"id":"a","doc":[{"_rev":"1-a"}]}`,
		`{"seq":1,"id":"a","doc":"{\"_rev\":\"1-a\"}"}`,
		`{"seq":1,"id":"a","doc":{"n":{"_deleted":true,"s":"}]\"{["},"_rev":"2-b","l":[1,[2,{"_removed":true}]],"z":-1.5e3}}`,
		`{"seq":1,"id":"a","doc":{"_rev":"2-b","ü":{"_deleted":true}}}`,
		`{"seq":1,"id":"a","changes":[]}`,
		`{"seq":1,"id":"a","changes":[ ]}`,
		`{"seq":1,"id":"a","changes":null}`,
		`{"seq":1,"id":"a","changes":{"rev":"1-a"}}`,
		`{"seq":1,"id":"a","changes":[null]}`,
		`{"seq":1,"id":"a","changes":["1-a"]}`,
		`{"seq":1,"id":"a","changes":[{"rev":null}]}`,
		`{"seq":1,"id":"a","changes":[{"rev":5}]}`,
		`{"seq":1,"id":"a","changes":[{"rev":"1-a","rev":"2-b"}]}`,
		`{"seq":1,"id":"a","changes":[{"rev":"1-a","rev":null}]}`,
		`{"seq":1,"id":"a","changes":[{"Rev":"1-\u0061"}]}`,
		`{"seq":1,"id":"a","changes":[{"re\u0076":"1-a"}]}`,
		`{"seq":1,"id":"a","changes":[{"x":{"rev":"9-z"},"rev":"1-a"}]}`,
		`{"seq":1,"id":"a","changes":[{}]}`,
		`{"seq":1,"id":"a","removed":[]}`,
		`{"seq":1,"id":"a","removed":["x"]}`,
		`{"seq":1,"id":"a","removed":"x"}`,
		`{"seq":1,"id":"a","removed":null}`,
		`{"seq":1,"id":"a","removed":[ ]}`,
		`{"seq":1,"id":"a","removed":false}`,
		`{"seq":1,"id":"a","deleted":true,"deleted":null}`,
		`{"seq":1,"id":"a","deleted":"true","revoked":true}`,
		`{"seq":"","id":"a"}`,
		`{"seq":[1,"x"],"id":"a"}`,
		`{"seq":-0.5e-3,"id":"a"}`,
		`{"seq":"3::10","id":"_user/alice","changes":[]}`,
	}
	for i, id := range testenv.HostileIDs() {
		seeds = append(seeds, hostileRow(i+1, id))
	}
	return seeds
}

// readRowStdlib reads a row's fields the way encoding/json reads them.
func readRowStdlib(raw []byte) (rowFields, error) {
	var f rowFields
	err := json.Unmarshal(raw, &f)
	return f, err
}

// unmarshalMeta is docMeta through encoding/json alone.
func unmarshalMeta(body []byte) (docMeta, error) {
	var m docMeta
	err := json.Unmarshal(body, &m)
	return m, err
}

// presentStdlib is present through encoding/json.
func presentStdlib(v json.RawMessage) bool {
	if isNull(v) {
		return false
	}
	var list []json.RawMessage
	if err := json.Unmarshal(v, &list); err == nil {
		return len(list) > 0
	}
	return true
}

// checkRowScan fails when the one-pass reading of a valid row gives
// anything encoding/json would not: the row's members, its doc's docMeta
// (or meta's error), changes[0].rev and whether removed is set.
func checkRowScan(t *testing.T, raw []byte) {
	t.Helper()
	want, werr := readRowStdlib(raw)
	got, ok := scanRow(raw)
	if ok {
		if werr != nil {
			t.Fatalf("%q: the scan read a row encoding/json refuses (%v)", raw, werr)
		}
		if diff := cmp.Diff(want, got.rowFields); diff != "" {
			t.Fatalf("%q: members differ (-encoding/json +scan):\n%s", raw, diff)
		}
		if got.docRead {
			m, err := unmarshalMeta(got.Doc)
			if err != nil || m != got.doc.meta() {
				t.Fatalf("%q: doc meta %+v, encoding/json %+v, %v", raw, got.doc.meta(), m, err)
			}
		}
	}
	if werr != nil {
		return
	}
	for _, v := range []json.RawMessage{want.Doc, want.Changes, want.Removed, want.ID, want.Seq} {
		if isNull(v) {
			continue
		}
		gm, gerr := meta(v)
		wm, werr := unmarshalMeta(v)
		if fmt.Sprint(gerr) != fmt.Sprint(werr) || (werr == nil && gm != wm) {
			t.Fatalf("meta(%q) = %+v, %v; encoding/json %+v, %v", v, gm, gerr, wm, werr)
		}
	}
	if rev, std := firstRev(want.Changes), firstRevSlow(want.Changes); rev != std {
		t.Fatalf("firstRev(%q) = %q, encoding/json %q", want.Changes, rev, std)
	}
	if set, std := present(want.Removed), presentStdlib(want.Removed); set != std {
		t.Fatalf("present(%q) = %v, encoding/json %v", want.Removed, set, std)
	}
	if s, ok := plainString(want.ID); ok {
		var id string
		if err := json.Unmarshal(want.ID, &id); err != nil || id != s {
			t.Fatalf("id %q read as %q, encoding/json %q, %v", want.ID, s, id, err)
		}
	}
}

// TestRowScanAsEncodingJSON: on rows that stress member names and values,
// the one-pass reading gives what encoding/json gives.
func TestRowScanAsEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, s := range rowScanSeeds() {
		if !json.Valid([]byte(s)) {
			t.Fatalf("seed %q is not JSON", s)
		}
		checkRowScan(t, []byte(s))
	}
}

// FuzzRowScan: on any valid JSON value, the one-pass reading of a row gives
// what encoding/json gives, and meta gives json.Unmarshal's result and
// error on any input.
func FuzzRowScan(f *testing.F) {
	for _, s := range rowScanSeeds() {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"seq":1,"id":"a","doc":{"_rev":"1-a"`))
	f.Add([]byte(`{"_rev":"1-a"} x`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		gm, gerr := meta(raw)
		wm, werr := unmarshalMeta(raw)
		if fmt.Sprint(gerr) != fmt.Sprint(werr) || (werr == nil && gm != wm) {
			t.Fatalf("meta(%q) = %+v, %v; encoding/json %+v, %v", raw, gm, gerr, wm, werr)
		}
		if json.Valid(raw) {
			checkRowScan(t, raw)
			return
		}
		// Invalid input never reaches the quick reading; on it, it still
		// ends without a panic.
		scanRow(raw)
		firstRev(raw)
		present(raw)
		quickMeta(raw)
	})
}

// TestRowsNamesAsEncodingJSON: rows whose names differ in letter case,
// repeat, or use letters Unicode folds onto ASCII ones give the Row
// encoding/json's matching gives.
func TestRowsNamesAsEncodingJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		row  string
		want []Row
	}{
		{name: "names in any letter case", row: `{"SEQ":5,"Id":"b","Changes":[{"REV":"2-b"}],"DOC":{"_ID":"b","_REV":"2-b"}}`,
			want: []Row{{Seq: raw(`5`), ID: "b", Rev: "2-b", Doc: raw(`{"_ID":"b","_REV":"2-b"}`)}}},
		{name: "repeated _deleted: a later null keeps true", row: `{"seq":5,"id":"b","changes":[{"rev":"2-b"}],"doc":{"_deleted":true,"_deleted":null}}`,
			want: []Row{{Seq: raw(`5`), ID: "b", Rev: "2-b", Deleted: true}}},
		{name: "repeated _deleted: the last one wins", row: `{"seq":5,"id":"b","changes":[{"rev":"2-b"}],"doc":{"_deleted":true,"_deleted":false}}`,
			want: []Row{{Seq: raw(`5`), ID: "b", Rev: "2-b", Doc: raw(`{"_deleted":true,"_deleted":false}`)}}},
		{name: "Kelvin sign in revoked", row: `{"seq":5,"id":"b","changes":[{"rev":"2-b"}],"revo\u212aed":true}`,
			want: []Row{{Seq: raw(`5`), ID: "b", Rev: "2-b", Removed: true, Revoked: true}}},
		{name: "escaped name and value", row: `{"seq":5,"\u0069d":"\u0062","changes":[{"re\u0076":"2-\u0062"}]}`,
			want: []Row{{Seq: raw(`5`), ID: "b", Rev: "2-b"}}},
		{name: "a doc _rev of another type leaves the doc out", row: `{"seq":5,"id":"b","changes":[{"rev":"2-b"}],"doc":{"_rev":2}}`,
			want: []Row{{Seq: raw(`5`), ID: "b", Rev: "2-b"}}},
		{name: "the last doc counts", row: `{"seq":5,"id":"b","doc":{"_rev":"1-a"},"doc":{"_rev":"2-b","v":2}}`,
			want: []Row{{Seq: raw(`5`), ID: "b", Rev: "2-b", Doc: raw(`{"_rev":"2-b","v":2}`)}}},
		{name: "nested flags are not the document's", row: `{"seq":5,"id":"b","doc":{"x":{"_deleted":true,"s":"}\"{"},"_rev":"2-b"}}`,
			want: []Row{{Seq: raw(`5`), ID: "b", Rev: "2-b", Doc: raw(`{"x":{"_deleted":true,"s":"}\"{"},"_rev":"2-b"}`)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := &pageReader{limit: 10}
			b, err := p.read(bytesStream([]byte(`{"results":[`+tt.row+`],"last_seq":5}`), 1<<20))
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if diff := cmp.Diff(tt.want, b.Rows); diff != "" {
				t.Errorf("rows (-want +got):\n%s", diff)
			}
		})
	}
}
