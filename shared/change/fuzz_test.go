package change

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// FuzzDecode: Decode never panics; what it accepts passes Check, encodes,
// and decodes again to the same envelope.
func FuzzDecode(f *testing.F) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("", 3600))
	for i, id := range testenv.HostileIDs() {
		e := Envelope{V: EnvelopeVersion, Job: "j", Output: "o", DocID: id, Rev: "1-" + id, Seq: json.RawMessage(`[1,"g1"]`),
			Version: Version{Generation: 1, Counter: int64(i + 1)}, EnqueuedAt: at, Doc: json.RawMessage(`{"_id":` + quote(id) + `}`)}
		b, err := json.Marshal(e)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		`{"v":1,"job":"j","output":"o","doc_id":"..","seq":"1-x","generation":1,"counter":1,"deleted":true}`,
		`{"v":1,"job":"j","output":"o","doc_id":"d","seq":1,"generation":1,"counter":1,"doc_ref":{"bucket":"b","key":"claim-check/../x","size":10}}`,
		`{"v":1,"job":"j","output":"o","doc_id":"d","seq":1e999,"generation":9223372036854775807,"counter":1,"doc":{"a":"<&>"}}`,
		`{"v":1,"job":"j","output":"o","doc_id":"d","seq":1,"generation":1,"counter":1,"doc":"\ud800","enqueued_at":"2026-01-02T03:04:05.123456789+14:00"}`,
		`{"v":1,"doc_id":"a","doc_id":"b"}`, `{"v":1,"generation":-1}`, `null`, `[]`, `{"v":"1"}`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		e, err := Decode(body)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Decode error %v is not ErrInvalid", err)
			}
			return
		}
		if err := e.Check(); err != nil {
			t.Fatalf("Decode accepted an envelope Check refuses: %v", err)
		}
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatalf("encode decoded envelope: %v", err)
		}
		again, err := Decode(b)
		if err != nil {
			t.Fatalf("decode re-encoded envelope: %v\n%s", err, b)
		}
		if !e.EnqueuedAt.Equal(again.EnqueuedAt) {
			t.Fatalf("enqueued_at %s became %s", e.EnqueuedAt, again.EnqueuedAt)
		}
		e.EnqueuedAt, again.EnqueuedAt = time.Time{}, time.Time{}
		for _, raw := range []*json.RawMessage{&e.Seq, &again.Seq, &e.Doc, &again.Doc} {
			*raw = canonical(t, *raw)
		}
		if diff := cmp.Diff(e, again); diff != "" {
			t.Fatalf("round trip (-decoded +re-decoded):\n%s", diff)
		}
	})
}

// canonical re-encodes raw JSON (nil stays nil), so that equal values
// written differently compare equal.
func canonical(t *testing.T, raw json.RawMessage) json.RawMessage {
	if raw == nil {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", raw, err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encode %q: %v", raw, err)
	}
	return b
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
