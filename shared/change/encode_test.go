package change

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// checkAppendJSON fails t unless e.AppendJSON writes what json.Marshal
// writes, or fails where it fails, leaving what it appends to as it was.
func checkAppendJSON(t *testing.T, e *Envelope) {
	t.Helper()
	want, wantErr := json.Marshal(e)
	prefix := []byte("prefix")
	got, err := e.AppendJSON(prefix)
	switch {
	case (err != nil) != (wantErr != nil):
		t.Fatalf("AppendJSON error = %v, json.Marshal error = %v\nenvelope %#v", err, wantErr, e)
	case err != nil:
		if string(got) != "prefix" {
			t.Fatalf("AppendJSON failed (%v) and left %q, want the prefix alone", err, got)
		}
	case !bytes.Equal(got, append(prefix, want...)):
		t.Fatalf("AppendJSON wrote\n%s\njson.Marshal writes\n%s", got[len(prefix):], want)
	}
}

func TestAppendJSONMatchesMarshal(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("", 3600))
	base := func() *Envelope {
		return &Envelope{V: EnvelopeVersion, Job: "j", Output: "o", DocID: "order-1", Rev: "1-a", Seq: json.RawMessage(`"7-g1"`),
			Version: Version{Generation: 2, Counter: 3}, EnqueuedAt: at, Doc: json.RawMessage(`{"_id":"order-1","n":1}`)}
	}
	deep := func(n int) json.RawMessage {
		return json.RawMessage(strings.Repeat("[", n) + strings.Repeat("]", n))
	}
	tests := []struct {
		name string
		edit func(e *Envelope)
	}{
		{"live", func(e *Envelope) {}},
		{"tombstone", func(e *Envelope) { e.Deleted, e.Doc = true, nil }},
		{"removed", func(e *Envelope) { e.Removed, e.Doc = true, nil }},
		{"claim check", func(e *Envelope) {
			e.Doc, e.DocRef = nil, &ObjectRef{Bucket: "b", Key: "claim-check/p/j/1/2.json", Size: 1 << 40}
		}},
		{"zero envelope", func(e *Envelope) { *e = Envelope{} }},
		{"nil seq", func(e *Envelope) { e.Seq = nil }},
		{"empty doc left out", func(e *Envelope) { e.Doc = json.RawMessage{} }},
		{"negative and extreme numbers", func(e *Envelope) { e.V, e.Generation, e.Counter = -1, 1<<63-1, -1<<63 }},
		{"spaces compacted", func(e *Envelope) {
			e.Seq = json.RawMessage(" [ 12 ,\n \"g1\" ]\t")
			e.Doc = json.RawMessage("\r\n{ \"a\" : [ 1 , 2.5e-3 , -0 , true , false , null ] ,\t\"b\" : { } , \"c\":[ ] , \"d\" : \" s p \" }\n")
		}},
		{"html and line separators escaped in raw values", func(e *Envelope) {
			e.Doc = json.RawMessage("{\"<a>\":\"x & y\",\"s\":\"\u2028\u2029\",\"e\":\"\\u003c\"}")
		}},
		{"strings escaped", func(e *Envelope) {
			e.Job, e.Output, e.DocID = "<job>&", "\"\\\b\f\n\r\t\x00\x1f\x7f", "a\u2028b\u2029c"
			e.Rev = "bad \xff utf-8 \xe2\x80 and é"
		}},
		{"invalid utf-8 kept in raw strings", func(e *Envelope) { e.Doc = json.RawMessage("{\"a\":\"\xff\xfe\"}") }},
		{"nested at the limit", func(e *Envelope) { e.Doc = deep(10000) }},
		{"nested too deeply", func(e *Envelope) { e.Doc = deep(10001) }},
		{"empty non-nil seq", func(e *Envelope) { e.Seq = json.RawMessage{} }},
		{"seq not JSON", func(e *Envelope) { e.Seq = json.RawMessage(`12:3`) }},
		{"doc not JSON", func(e *Envelope) { e.Doc = json.RawMessage(`{"a":}`) }},
		{"two values", func(e *Envelope) { e.Doc = json.RawMessage(`{} {}`) }},
		{"control character in raw string", func(e *Envelope) { e.Doc = json.RawMessage("{\"a\":\"\n\"}") }},
		{"bad escape", func(e *Envelope) { e.Doc = json.RawMessage(`{"a":"\x"}`) }},
		{"short unicode escape", func(e *Envelope) { e.Doc = json.RawMessage(`"\u12"`) }},
		{"bad numbers", func(e *Envelope) { e.Doc = json.RawMessage(`[01]`) }},
		{"year past 9999", func(e *Envelope) { e.EnqueuedAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }},
		{"zone offset of 24 hours", func(e *Envelope) { e.EnqueuedAt = time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("", 24*3600)) }},
	}
	for i, id := range testenv.HostileIDs() {
		tests = append(tests, struct {
			name string
			edit func(e *Envelope)
		}{"hostile id " + string(rune('a'+i%26)), func(e *Envelope) {
			e.DocID, e.Rev = id, "1-"+id
			e.Doc = json.RawMessage(`{"_id":` + quote(id) + `}`)
		}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := base()
			tt.edit(e)
			checkAppendJSON(t, e)
		})
	}
}

// FuzzAppendJSON: whatever the envelope, AppendJSON writes what json.Marshal
// writes, or fails where it fails.
func FuzzAppendJSON(f *testing.F) {
	for _, id := range testenv.HostileIDs() {
		f.Add(id, "1-"+id, []byte(`[1, "g1"]`), []byte(`{"_id":`+quote(id)+`}`), int64(1767322800123456789), 3600, false, false)
	}
	for _, raw := range []string{"", " ", "null", "1e999", `"\ud800"`, "{\"a\":\"<\u2028>\"}", `{"a":[1,{"b":null}],}`, "[1,]", `-`, `0.`, `1e+`, "\"\xe2\x80\xa8\"", "tru"} {
		f.Add("d", "1-a", []byte(raw), []byte(raw), int64(0), 0, true, false)
	}
	f.Fuzz(func(t *testing.T, docID, rev string, seq, doc []byte, nanos int64, offset int, deleted, ref bool) {
		e := &Envelope{V: EnvelopeVersion, Job: rev, Output: docID, DocID: docID, Rev: rev, Seq: seq, Deleted: deleted,
			Version: Version{Generation: nanos, Counter: int64(offset)}, EnqueuedAt: time.Unix(0, nanos).In(time.FixedZone("", offset%(30*3600))), Doc: doc}
		if ref {
			e.DocRef = &ObjectRef{Bucket: rev, Key: docID, Size: nanos}
		}
		checkAppendJSON(t, e)
	})
}

func BenchmarkAppendJSON(b *testing.B) {
	e := &Envelope{V: EnvelopeVersion, Job: "orders", Output: "pg", DocID: "order-000123", Rev: "1-126bb1ea5557246190dda254f698e658",
		Seq: json.RawMessage(`"123-g1AAAAFTeJzLYWBgYMpgTmHgzcvPy09JdcjLz8gvLskBCScyJCn8"`), Version: Version{Generation: 3, Counter: 123456},
		EnqueuedAt: time.Date(2026, 11, 28, 3, 4, 5, 123456789, time.UTC),
		Doc:        json.RawMessage(`{"customer":"customer-527","items":[{"qty":1,"sku":"sku-34"},{"qty":1,"sku":"sku-45"}],"number":0,"total":30.74,"type":"order","version":1,"_id":"order-000000","_rev":"1-126bb1ea5557246190dda254f698e658"}`)}
	b.Run("AppendJSON", func(b *testing.B) {
		var buf []byte
		for b.Loop() {
			var err error
			if buf, err = e.AppendJSON(buf[:0]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(e); err != nil {
				b.Fatal(err)
			}
		}
	})
}
