package feed

import (
	"bytes"
	"errors"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"strings"
	"testing"

	"github.com/changes-worker/changes-worker/shared/config"
)

// nestedMultipart builds a multipart/mixed _bulk_get answer whose one part
// nests depth levels of multipart/related around a document, the way a
// hostile source can (1.2 MiB of it took the old reader 97 s).
func nestedMultipart(depth int) (body []byte, boundary string) {
	var b strings.Builder
	for i := 0; i < depth; i++ {
		fmt.Fprintf(&b, "--b%d\r\nContent-Type: multipart/related; boundary=b%d\r\n\r\n", i, i+1)
	}
	fmt.Fprintf(&b, "--b%d\r\nContent-Type: application/json\r\n\r\n{\"_id\":\"a\",\"_rev\":\"1-a\"}\r\n--b%d--\r\n", depth, depth)
	for i := depth - 1; i >= 0; i-- {
		fmt.Fprintf(&b, "\r\n--b%d--\r\n", i)
	}
	return []byte(b.String()), "b0"
}

// TestBulkGetNestedMultipartIsRefused: deep nesting is refused at the second
// level with a permanent error naming the bound, having read no further.
func TestBulkGetNestedMultipartIsRefused(t *testing.T) {
	t.Parallel()
	body, boundary := nestedMultipart(20000)
	t.Logf("answer of %d bytes", len(body))
	answers, err := parseBulkMultipart(body, boundary)
	var le *LimitError
	if !errors.As(err, &le) || le.Bound != BoundMultipartDepth {
		t.Fatalf("parse = %d answers, %v; want a *LimitError on %s", len(answers), err, BoundMultipartDepth)
	}
	if !strings.Contains(err.Error(), "multipart nested deeper than 1 level") || !strings.Contains(err.Error(), "part 0") {
		t.Errorf("error %q does not say what was refused where", err)
	}
	if Transient(err) {
		t.Errorf("Transient(%v) = true, want a permanent error", err)
	}

	// Through FetchDocs from a Sync Gateway: the same error, and no retry
	// would help.
	f := newFakeSource(t, replyType(http.StatusOK, "multipart/mixed; boundary="+boundary, string(body)))
	c := f.client(func(o *Options) { o.SourceType, o.Fetch = config.SourceSyncGateway, config.FetchBulkGet })
	err = c.FetchDocs(t.Context(), []Row{{Seq: raw(`"1"`), ID: "a", Rev: "1-a"}})
	if !errors.As(err, &le) || le.Bound != BoundMultipartDepth || Transient(err) {
		t.Errorf("FetchDocs = %v, want the permanent depth error", err)
	}
}

// TestBulkGetOneNestedLevel: what Sync Gateway and CouchDB send, a document
// with attachments as one multipart/related level, is read; the attachments
// are skipped, however large.
func TestBulkGetOneNestedLevel(t *testing.T) {
	t.Parallel()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	doc, _ := mw.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/json"}})
	doc.Write([]byte(`{"_id":"a","_rev":"1-a","v":1}`))
	var inner bytes.Buffer
	iw := multipart.NewWriter(&inner)
	p, _ := iw.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/json"}})
	p.Write([]byte(`{"_id":"b","_rev":"2-b","_attachments":{"big.bin":{"follows":true,"length":8388608}}}`))
	p, _ = iw.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/octet-stream"}, "Content-Disposition": {`attachment; filename="big.bin"`}})
	p.Write(bytes.Repeat([]byte{0xAB}, 8<<20))
	iw.Close()
	rel, _ := mw.CreatePart(textproto.MIMEHeader{"Content-Type": {"multipart/related; boundary=" + iw.Boundary()}})
	rel.Write(inner.Bytes())
	mw.Close()

	f := newFakeSource(t, replyType(http.StatusOK, "multipart/mixed; boundary="+mw.Boundary(), body.String()))
	c := f.client(func(o *Options) { o.SourceType, o.Fetch = config.SourceSyncGateway, config.FetchBulkGet })
	rows := []Row{{Seq: raw(`"1"`), ID: "a", Rev: "1-a"}, {Seq: raw(`"2"`), ID: "b", Rev: "2-b"}}
	if err := c.FetchDocs(t.Context(), rows); err != nil {
		t.Fatalf("FetchDocs: %v", err)
	}
	if string(rows[0].Doc) != `{"_id":"a","_rev":"1-a","v":1}` || !strings.HasPrefix(string(rows[1].Doc), `{"_id":"b","_rev":"2-b"`) {
		t.Errorf("docs %s and %.40s, want both documents", rows[0].Doc, rows[1].Doc)
	}
	if len(rows[1].Doc) > 1024 {
		t.Errorf("b's body is %d bytes: the attachment was kept", len(rows[1].Doc))
	}
}

// TestBulkGetPartOverAnswerLimit: a part larger than the answer limit is a
// permanent error naming the limit and the document.
func TestBulkGetPartOverAnswerLimit(t *testing.T) {
	t.Parallel()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	p, _ := mw.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/json"}})
	p.Write([]byte(`{"_id":"a","_rev":"1-a","pad":"` + strings.Repeat("x", 2<<20) + `"}`))
	mw.Close()
	f := newFakeSource(t, replyType(http.StatusOK, "multipart/mixed; boundary="+mw.Boundary(), body.String()))
	c := f.client(func(o *Options) {
		o.SourceType, o.Fetch, o.MaxAnswerBytes, o.PageBytes = config.SourceSyncGateway, config.FetchBulkGet, 1<<20, 1<<20
	})
	err := c.FetchDocs(t.Context(), []Row{{Seq: raw(`"1"`), ID: "a", Rev: "1-a"}})
	var le *LimitError
	if !errors.As(err, &le) || le.Bound != BoundAnswerBytes || Transient(err) {
		t.Fatalf("FetchDocs = %v, want a permanent *LimitError on %s", err, BoundAnswerBytes)
	}
	for _, want := range []string{"1048576 bytes", "max_answer_bytes", `document "a"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}
