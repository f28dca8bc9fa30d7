package change

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestVersionCompare(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		v, w Version
		want int
	}{
		{"equal", Version{2, 5}, Version{2, 5}, 0},
		{"older counter", Version{2, 4}, Version{2, 5}, -1},
		{"newer counter", Version{2, 6}, Version{2, 5}, 1},
		{"generation beats counter", Version{3, 1}, Version{2, 900}, 1},
		{"older generation", Version{1, 900}, Version{2, 1}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.v.Compare(tt.w); got != tt.want {
				t.Errorf("%s.Compare(%s) = %d, want %d", tt.v, tt.w, got, tt.want)
			}
		})
	}
}

func TestDecode(t *testing.T) {
	t.Parallel()
	good := Envelope{V: 1, Job: "j", Output: "o", DocID: "a/b", Rev: "1-x", Seq: json.RawMessage(`"7-g1"`),
		Version: Version{Generation: 2, Counter: 3}, Doc: json.RawMessage(`{"_id":"a/b"}`)}
	b, _ := json.Marshal(good)
	got, err := Decode(b)
	if err != nil {
		t.Fatalf("decode good envelope: %v", err)
	}
	if got.DocID != "a/b" || string(got.Seq) != `"7-g1"` || got.Version != good.Version {
		t.Errorf("round trip: %+v", got)
	}
	tests := []struct {
		name string
		body string
		want string
	}{
		{"not json", `{"v":1,`, "decode"},
		{"wrong version", `{"v":2,"job":"j","output":"o","doc_id":"d","seq":1,"generation":1,"counter":1,"doc":{}}`, "v is 2"},
		{"missing fields", `{"v":1,"seq":1,"generation":1,"counter":1,"doc":{}}`, "job is empty"},
		{"no body on live doc", `{"v":1,"job":"j","output":"o","doc_id":"d","seq":1,"generation":1,"counter":1}`, "doc and doc_ref are both empty"},
		{"zero version", `{"v":1,"job":"j","output":"o","doc_id":"d","seq":1,"deleted":true}`, "generation and counter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Decode([]byte(tt.body))
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Decode error = %v, want ErrInvalid mentioning %q", err, tt.want)
			}
		})
	}
}

func TestSeqText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		seq  string
		want string
	}{
		{name: "number", seq: `42`, want: `42`},
		{name: "string", seq: `"7-g1AAAA"`, want: `"7-g1AAAA"`},
		{name: "array compacted", seq: "[ 12,\n \"abc\" ]", want: `[12,"abc"]`},
		{name: "not JSON: as sent", seq: `12:3`, want: `12:3`},
		{name: "absent", seq: ``, want: ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := &Envelope{Seq: json.RawMessage(tt.seq)}
			if got := e.SeqText(); got != tt.want {
				t.Errorf("SeqText() of %q = %q, want %q", tt.seq, got, tt.want)
			}
		})
	}
}

// TestDecodeAcrossReleases pins the rules docs/versioning.md states for
// envelopes written by another release: a field this release does not know
// is ignored (a minor release may add one), while a v other than
// EnvelopeVersion, older, newer or absent, is refused as invalid, a
// permanent failure that waits in the DLQ for a writer that reads it.
func TestDecodeAcrossReleases(t *testing.T) {
	t.Parallel()
	const rest = `"job":"j","output":"o","doc_id":"d","seq":1,"generation":1,"counter":1,"doc":{}`
	if e, err := Decode([]byte(`{"v":1,` + rest + `,"added_later":{"x":[1,2]}}`)); err != nil || e.DocID != "d" {
		t.Errorf("an envelope with a field unknown to this release: %+v, %v; want it decoded", e, err)
	}
	for _, v := range []string{`"v":0,`, `"v":2,`, ``} {
		if _, err := Decode([]byte(`{` + v + rest + `}`)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "want 1") {
			t.Errorf("envelope with %q: %v, want ErrInvalid naming v", v, err)
		}
	}
}
