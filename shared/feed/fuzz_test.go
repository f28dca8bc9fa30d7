package feed

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"testing"
	"unicode/utf8"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// hostileRow is a _changes row for id with its document included.
func hostileRow(seq int, id string) string {
	q, _ := json.Marshal(id)
	return fmt.Sprintf(`{"seq":%d,"id":%s,"changes":[{"rev":"1-a"}],"doc":{"_id":%s,"_rev":"1-a","v":%d}}`, seq, q, q, seq)
}

// bytesStream is a stream over an answer already in memory, bounded by limit.
func bytesStream(body []byte, limit int64) *stream {
	return &stream{op: "changes", status: 200, body: &boundedReader{r: bytes.NewReader(body), limit: limit},
		own: func() bool { return false }, close: func() {}}
}

// FuzzChanges feeds arbitrary answers to the _changes reader. Whatever the
// answer, the reader ends with a batch or an error it classifies, and a
// batch keeps its promises: every row names a document, a position to
// resume from is there and is not empty, last_seq is not before the last
// row, a kept body is JSON, malformed rows point inside the batch and keep
// at most MalformedRawMax bytes.
func FuzzChanges(f *testing.F) {
	for _, id := range testenv.HostileIDs() {
		f.Add([]byte(`{"results":[` + hostileRow(1, id) + `],"last_seq":1}`))
	}
	for _, a := range answersToCompare() {
		f.Add([]byte(a))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, limit := range []int64{1 << 20, 256} {
			p := &pageReader{limit: 10, budget: 128}
			b, err := p.read(bytesStream(body, limit))
			if err != nil {
				var le *LimitError
				if !errors.Is(err, ErrMalformed) && !errors.As(err, &le) {
					t.Fatalf("error %v (%T) is neither ErrMalformed nor a *LimitError", err, err)
				}
				if b != nil {
					t.Fatalf("a batch and an error")
				}
				continue
			}
			if isNull(b.LastSeq) || emptySeq(b.LastSeq) {
				t.Fatalf("batch without a position to resume from: %q", b.LastSeq)
			}
			if b.Cut != "" && !b.Full {
				t.Fatalf("a cut batch that is not full")
			}
			var last json.RawMessage
			for _, r := range b.Rows {
				if r.ID == "" {
					t.Fatalf("row without id: %+v", r)
				}
				if r.Doc != nil && !json.Valid(r.Doc) {
					t.Fatalf("row %q keeps a body that is not JSON", r.ID)
				}
				if r.Doc != nil && (r.Deleted || r.Removed) {
					t.Fatalf("row %q is deleted or removed and has a body", r.ID)
				}
				if r.Seq != nil {
					last = r.Seq
				}
			}
			if before, ok := SeqBefore(b.LastSeq, last); last != nil && ok && before {
				t.Fatalf("last_seq %s before the last row's seq %s", b.LastSeq, last)
			}
			for _, m := range b.Malformed {
				if m.Before < 0 || m.Before > len(b.Rows) || len(m.Raw) > MalformedRawMax || m.Reason == "" {
					t.Fatalf("malformed row %+v out of bounds (%d rows)", m, len(b.Rows))
				}
			}
		}
	})
}

// FuzzBulkGetJSON feeds arbitrary answers to the JSON _bulk_get reader:
// it ends, and every body it passes on is a JSON document with an id and a
// revision.
func FuzzBulkGetJSON(f *testing.F) {
	for _, id := range testenv.HostileIDs() {
		q, _ := json.Marshal(id)
		f.Add([]byte(fmt.Sprintf(`{"results":[{"id":%s,"docs":[{"ok":{"_id":%s,"_rev":"1-a"}}]},{"id":%s,"docs":[{"missing":"2-b"}]}]}`, q, q, q)))
	}
	for _, s := range []string{
		`{"results":[{"id":"a","docs":[{"error":{"id":"a","rev":"1-a","error":"not_found","reason":"missing"}},{}]}]}`,
		`{"results":[{"id":5,"docs":[]}]}`, `{"results":null}`, `{"results":[{"id":"a","docs":[{"ok":{"_id":"a"}}]}]}`,
		`{"results":[{"id":"a","docs":[{"ok":`, ``, `[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		answers, err := parseBulkJSON(body)
		checkAnswers(t, answers, err)
	})
}

// FuzzBulkGetMultipart feeds arbitrary multipart answers to the Sync Gateway
// _bulk_get reader: it ends, nesting deeper than one level is refused, and
// every body it passes on is a JSON document with an id and a revision.
func FuzzBulkGetMultipart(f *testing.F) {
	for _, id := range testenv.HostileIDs() {
		q, _ := json.Marshal(id)
		f.Add(multipartAnswer("b", `{"_id":`+string(q)+`,"_rev":"1-a"}`, `{"error":"not_found","id":`+string(q)+`,"rev":"2-a","status":404}`), "b")
	}
	var nested bytes.Buffer
	mw := multipart.NewWriter(&nested)
	mw.SetBoundary("outer")
	inner := multipartAnswer("inner", `{"_id":"a","_rev":"1-a","_attachments":{"x":{"follows":true}}}`, "attachment bytes")
	p, _ := mw.CreatePart(textproto.MIMEHeader{"Content-Type": {"multipart/related; boundary=inner"}})
	p.Write(inner)
	mw.Close()
	f.Add(nested.Bytes(), "outer")
	deep, boundary := nestedMultipart(50)
	f.Add(deep, boundary)
	f.Add([]byte("--b\r\nContent-Type: application/json\r\n\r\n{\"_id\":\"a\"\r\n--b--\r\n"), "b")
	f.Add([]byte("no parts at all"), "b")
	f.Fuzz(func(t *testing.T, body []byte, boundary string) {
		answers, err := parseBulkMultipart(body, boundary)
		var le *LimitError
		if errors.As(err, &le) && le.Bound != BoundMultipartDepth {
			t.Fatalf("limit %v on an answer in memory", err)
		}
		checkAnswers(t, answers, err)
	})
}

// multipartAnswer is a multipart/mixed answer with one JSON part per body.
func multipartAnswer(boundary string, bodies ...string) []byte {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	mw.SetBoundary(boundary)
	for _, body := range bodies {
		p, _ := mw.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/json"}})
		p.Write([]byte(body))
	}
	mw.Close()
	return b.Bytes()
}

// checkAnswers holds what any _bulk_get answer read must give.
func checkAnswers(t *testing.T, answers []bulkAnswer, err error) {
	t.Helper()
	for _, a := range answers {
		switch {
		case a.body != nil:
			m, merr := meta(a.body)
			if !json.Valid(a.body) || merr != nil || m.ID == "" || m.Rev == "" || m.ID != a.id || m.Rev != a.rev {
				t.Fatalf("answer %q %q with body %q", a.id, a.rev, a.body)
			}
		case a.gone, a.err != nil:
		default:
			t.Fatalf("answer %+v says nothing", a)
		}
	}
	_ = err // any error is an answer; the properties are about what was passed on
}

// TestHostileIDsThroughTheFeed reads every hostile id through _changes and
// both _bulk_get forms: each comes back exactly as the source wrote it (no
// normalisation, no unescaping), with its own body.
func TestHostileIDsThroughTheFeed(t *testing.T) {
	t.Parallel()
	for _, id := range testenv.HostileIDs() {
		if !utf8.ValidString(id) {
			continue // JSON cannot carry it; the source cannot send it
		}
		q, _ := json.Marshal(id)
		doc := `{"_id":` + string(q) + `,"_rev":"1-a","v":1}`
		f := newFakeSource(t, route(map[string]http.HandlerFunc{
			"/db/_changes":  reply(200, `{"results":[{"seq":1,"id":`+string(q)+`,"changes":[{"rev":"1-a"}]}],"last_seq":1}`),
			"/db/_bulk_get": reply(200, `{"results":[{"id":`+string(q)+`,"docs":[{"ok":`+doc+`}]}]}`),
		}))
		c := f.client(nil)
		b, err := c.Changes(t.Context(), nil, 0)
		if err != nil || len(b.Rows) != 1 || b.Rows[0].ID != id {
			t.Errorf("Changes for %q: %+v, %v", id, b, err)
			continue
		}
		if err := c.FetchDocs(t.Context(), b.Rows); err != nil || string(b.Rows[0].Doc) != doc {
			t.Errorf("FetchDocs for %q: %s, %v", id, b.Rows[0].Doc, err)
		}
		answers, err := parseBulkMultipart(multipartAnswer("b", doc), "b")
		if err != nil || len(answers) != 1 || answers[0].id != id || string(answers[0].body) != doc {
			t.Errorf("multipart for %q: %+v, %v", id, answers, err)
		}
	}
}
