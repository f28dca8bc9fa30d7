package attach_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/changes-worker/changes-worker/shared/attach"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/statetable/quarantine"
	"github.com/changes-worker/changes-worker/shared/testenv/testbucket"
)

// md5Digest is content's digest as CouchDB writes it.
func md5Digest(content []byte) string {
	sum := md5.Sum(content)
	return "md5-" + base64.StdEncoding.EncodeToString(sum[:])
}

// stub is a row whose document has one attachment stub.
func stub(seq int, id, name, digest string, length int) feed.Row {
	doc := fmt.Sprintf(`{"_id":%q,"_rev":"1-a","_attachments":{%q:{"content_type":"application/octet-stream","digest":%q,"length":%d,"stub":true}}}`, id, name, digest, length)
	return feed.Row{Seq: json.RawMessage(strconv.Itoa(seq)), ID: id, Rev: "1-a", Doc: json.RawMessage(doc)}
}

// sourceClient is a feed client of the source at url.
func sourceClient(t *testing.T, url string) *feed.Client {
	t.Helper()
	c, err := feed.New(feed.Options{SourceType: config.SourceCouchDB, URL: url + "/db", Slack: time.Second, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// countingS3 counts the parts uploaded through it, and the empty ones.
type countingS3 struct {
	attach.S3
	parts, empty atomic.Int64
}

func (c *countingS3) UploadPart(ctx context.Context, in *s3.UploadPartInput, opts ...func(*s3.Options)) (*s3.UploadPartOutput, error) {
	c.parts.Add(1)
	if in.ContentLength == nil || *in.ContentLength == 0 {
		c.empty.Add(1)
	}
	return c.S3.UploadPart(ctx, in, opts...)
}

// leftovers reports the objects and open multipart uploads of bucket.
func leftovers(t *testing.T, c *s3.Client, bucket string) (objects, uploads int) {
	t.Helper()
	out, err := c.ListObjectsV2(t.Context(), &s3.ListObjectsV2Input{Bucket: &bucket})
	if err != nil {
		t.Fatal(err)
	}
	mu, err := c.ListMultipartUploads(t.Context(), &s3.ListMultipartUploadsInput{Bucket: &bucket})
	if err != nil {
		t.Fatal(err)
	}
	return len(out.Contents), len(mu.Uploads)
}

// TestCutTransfer: a source whose answer ends before its Content-Length (a
// connection cut mid-transfer) fails the call transiently: nothing is
// marked, quarantined or left in S3, no empty part is sent; once the
// transfer completes the copy is made. For a single put and a multipart
// upload.
func TestCutTransfer(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		size, cut  int
		multipart  bool
		wantParts1 int64 // parts sent by the cut attempt, at most
	}{
		{name: "single put", size: 400, cut: 200},
		{name: "multipart", size: 11 << 20, cut: 7 << 20, multipart: true, wantParts1: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s3c, bkt := testbucket.New(t)
			content := random(t, tt.size)
			var cuts atomic.Int32
			cuts.Store(1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", strconv.Itoa(len(content)))
				if cuts.Add(-1) < 0 {
					_, _ = w.Write(content)
					return
				}
				_, _ = w.Write(content[:tt.cut])
				w.(http.Flusher).Flush()
				conn, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					conn.Close()
				}
			}))
			t.Cleanup(srv.Close)
			q := &recorder{}
			cs3 := &countingS3{S3: s3c}
			st := &attach.Stage{
				Config: &config.Attachments{Enabled: true, Bucket: bkt, Prefix: "cut/", KeyTemplate: "{digest}", MaxBytes: 64 << 20, OnMissing: config.OnMissingFail},
				Source: sourceClient(t, srv.URL), S3: cs3, Job: "orders", Quarantine: q, PartSize: 5 << 20,
			}
			row := stub(7, "x", "f.bin", md5Digest(content), len(content))
			doc := row.Doc
			rows := []feed.Row{row}
			_, err := st.Process(t.Context(), rows)
			if err == nil || !feed.Transient(err) || errors.Is(err, attach.ErrContent) {
				t.Errorf("Process with the transfer cut = %v, want a transient error that is not a content mismatch", err)
			}
			if !bytes.Equal(rows[0].Doc, doc) {
				t.Errorf("the cut transfer changed the row: %s", rows[0].Doc)
			}
			if len(q.entries) != 0 {
				t.Errorf("the cut transfer was quarantined: %+v", q.entries)
			}
			if n, e := cs3.parts.Load(), cs3.empty.Load(); n > tt.wantParts1 || e != 0 {
				t.Errorf("the cut transfer sent %d parts, %d of them empty; want at most %d, none empty", n, e, tt.wantParts1)
			}
			if objects, uploads := leftovers(t, s3c, bkt); objects != 0 || uploads != 0 {
				t.Errorf("the cut transfer left %d objects and %d open multipart uploads", objects, uploads)
			}

			rows = []feed.Row{{Seq: row.Seq, ID: row.ID, Rev: row.Rev, Doc: doc}}
			if _, err := st.Process(t.Context(), rows); err != nil {
				t.Fatalf("Process once the transfer completes: %v", err)
			}
			e := entries(t, rows, "x")["f.bin"]
			if e.Key == "" || e.Skipped != "" {
				t.Fatalf("entry after the complete transfer = %+v, want a key", e)
			}
			if got := object(t, s3c, bkt, e.Key); !bytes.Equal(got, content) {
				t.Errorf("object holds %d bytes, not the attachment's %d", len(got), len(content))
			}
			if cs3.empty.Load() != 0 {
				t.Errorf("%d empty parts sent", cs3.empty.Load())
			}
		})
	}
}

// refusing is an S3 that answers PutObject of keys holding refuse with a
// 400 InvalidArgument.
type refusing struct {
	attach.S3
	refuse string
}

func (r refusing) PutObject(ctx context.Context, in *s3.PutObjectInput, opts ...func(*s3.Options)) (*s3.PutObjectOutput, error) {
	if strings.Contains(*in.Key, r.refuse) {
		return nil, &smithy.GenericAPIError{Code: "InvalidArgument", Message: "refused for the test"}
	}
	return r.S3.PutObject(ctx, in, opts...)
}

// TestHostileEntries: what is wrong with one attachment (a content_type that
// is not a media type, a malformed entry, a digest that is not md5 or sha1
// of the right length, a key S3 refuses) is that document's: the call
// succeeds, the entry is delivered marked, the attachment is recorded in
// the quarantine, and the other documents of the call are copied. Nothing
// is written outside the prefix.
func TestHostileEntries(t *testing.T) {
	t.Parallel()
	s3c, bkt := testbucket.New(t)
	data := []byte("hello")
	b64 := base64.StdEncoding.EncodeToString(data)
	good := md5Digest(data)
	sha := sha256.Sum256(data)
	row := func(seq int, id, atts string) feed.Row {
		return feed.Row{Seq: json.RawMessage(strconv.Itoa(seq)), ID: id, Rev: "1-a", Doc: json.RawMessage(`{"_id":"` + id + `","_rev":"1-a","_attachments":` + atts + `}`)}
	}
	rows := []feed.Row{
		row(1, "crlf", `{"a.txt":{"content_type":"text/plain\r\nX-Injected: 1","digest":"`+good+`","data":"`+b64+`"}}`),
		row(2, "number", `{"a.txt":5}`),
		row(3, "length", `{"a.txt":{"content_type":"text/plain","digest":"`+good+`","length":"five","data":"`+b64+`"}}`),
		row(4, "data", `{"a.txt":{"content_type":"text/plain","digest":"`+good+`","data":"not base64!"}}`),
		row(5, "traversal", `{"a.txt":{"content_type":"text/plain","digest":"../../outside-`+strings.TrimPrefix(good, "md5-")+`","data":"`+b64+`"}}`),
		row(6, "sha256", `{"a.txt":{"content_type":"text/plain","digest":"sha256-`+base64.StdEncoding.EncodeToString(sha[:])+`","data":"`+b64+`"}}`),
		row(7, "short", `{"a.txt":{"content_type":"text/plain","digest":"md5-`+base64.StdEncoding.EncodeToString(sha[:8])+`","data":"`+b64+`"}}`),
		row(8, "nodigest", `{"a.txt":{"content_type":"text/plain","data":"`+b64+`"}}`),
		row(9, "notobject", `"attachments"`),
		row(10, "negative", `{"a.txt":{"content_type":"text/plain","digest":"`+good+`","length":-5,"stub":true}}`),
		row(11, "fine", `{"b.txt":{"content_type":"text/plain; charset=utf-8","digest":"`+md5Digest([]byte("fine"))+`","data":"`+base64.StdEncoding.EncodeToString([]byte("fine"))+`"}}`),
	}
	q := &recorder{}
	st := &attach.Stage{
		Config: &config.Attachments{Enabled: true, Bucket: bkt, Prefix: "h/", KeyTemplate: "{digest}", MaxBytes: 1 << 20, OnMissing: config.OnMissingFail},
		S3:     s3c, Job: "orders", Quarantine: q,
	}
	if _, err := st.Process(t.Context(), rows); err != nil {
		t.Fatalf("Process: %v", err)
	}
	crlf := entries(t, rows, "crlf")["a.txt"]
	if crlf.Key == "" {
		t.Errorf("entry with a CR/LF content_type = %+v, want it copied", crlf)
	} else {
		head, err := s3c.HeadObject(t.Context(), &s3.HeadObjectInput{Bucket: &bkt, Key: &crlf.Key})
		if err != nil {
			t.Fatal(err)
		}
		if ct := *head.ContentType; strings.ContainsAny(ct, "\r\n") || strings.Contains(ct, "Injected") {
			t.Errorf("object's Content-Type = %q", ct)
		}
		if got := object(t, s3c, bkt, crlf.Key); !bytes.Equal(got, data) {
			t.Errorf("object = %q", got)
		}
	}
	if fine := entries(t, rows, "fine")["b.txt"]; fine.Key == "" {
		t.Errorf("entry of the ordinary document = %+v, want a key", fine)
	}
	invalid := []string{"number", "length", "data", "traversal", "sha256", "short", "nodigest", "negative"}
	for _, id := range invalid {
		var doc struct {
			Attachments map[string]map[string]any `json:"_attachments"`
		}
		for _, r := range rows {
			if r.ID == id {
				if err := json.Unmarshal(r.Doc, &doc); err != nil {
					t.Fatalf("%s: %v", id, err)
				}
			}
		}
		e := doc.Attachments["a.txt"]
		if e["s3_skipped"] != attach.SkippedInvalid || e["s3_key"] != nil || e["data"] != nil {
			t.Errorf("%s: entry = %v, want s3_skipped %q, no key, no data", id, e, attach.SkippedInvalid)
		}
	}
	for _, r := range rows {
		if r.ID == "notobject" && !strings.Contains(string(r.Doc), `"_attachments":"attachments"`) {
			t.Errorf("document whose _attachments is not an object = %s, want it as it was", r.Doc)
		}
	}
	recorded := map[string]string{}
	for _, e := range q.entries {
		if e.Kind != quarantine.Attachment {
			t.Errorf("quarantine entry of kind %q", e.Kind)
		}
		recorded[string(e.Seq)] = e.Reason
	}
	for seq, want := range map[string]string{"2": "not an object", "3": "length", "4": "data", "5": "digest", "6": "digest", "7": "digest", "8": "digest", "9": "_attachments", "10": "length"} {
		if got, ok := recorded[seq]; !ok || !strings.Contains(got, want) {
			t.Errorf("quarantine reason for seq %s = %q, want one naming %q", seq, got, want)
		}
	}
	if len(q.entries) != 9 {
		t.Errorf("%d quarantine entries, want 9: %+v", len(q.entries), q.entries)
	}
	for _, k := range testbucket.Keys(t.Context(), t, s3c, bkt) {
		if !strings.HasPrefix(k, "h/md5-") {
			t.Errorf("object %q outside the prefix's digests", k)
		}
	}

	t.Run("refused by S3", func(t *testing.T) {
		t.Parallel()
		long := strings.Repeat("n", 1100)
		q := &recorder{}
		st := &attach.Stage{
			Config: &config.Attachments{Enabled: true, Bucket: bkt, Prefix: "r/", KeyTemplate: "{name}/{digest}", MaxBytes: 1 << 20, OnMissing: config.OnMissingFail},
			S3:     refusing{S3: s3c, refuse: "refuse-me"}, Job: "orders", Quarantine: q,
		}
		inline := func(name string) string {
			return `{"` + name + `":{"content_type":"text/plain","digest":"` + good + `","data":"` + b64 + `"}}`
		}
		rows := []feed.Row{row(1, "long", inline(long)), row(2, "refused", inline("refuse-me")), row(3, "fine", inline("fine.txt"))}
		if _, err := st.Process(t.Context(), rows); err != nil {
			t.Fatalf("Process: %v", err)
		}
		for _, c := range []struct{ id, name string }{{"long", long}, {"refused", "refuse-me"}} {
			if e := entries(t, rows, c.id)[c.name]; e.Skipped != attach.SkippedRefused || e.Key != "" {
				t.Errorf("%s: entry = %+v, want s3_skipped %q", c.id, e, attach.SkippedRefused)
			}
		}
		if e := entries(t, rows, "fine")["fine.txt"]; e.Key == "" {
			t.Errorf("fine: entry = %+v, want a key", e)
		}
		if len(q.entries) != 2 {
			t.Errorf("quarantine = %+v, want the two refused attachments", q.entries)
		}
	})
}

// TestEncodedAttachment: CouchDB's digest of an attachment it stores
// compressed is of the compressed bytes. The stage asks for them, checks
// them against the digest and stores the content they decode to; bytes
// that match the digest in neither form are a mismatch and never stored.
func TestEncodedAttachment(t *testing.T) {
	t.Parallel()
	s3c, bkt := testbucket.New(t)
	text := bytes.Repeat([]byte("compressible text. "), 4000)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(text)
	_ = zw.Close()
	other := []byte("not what the digest says")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/lie.txt"):
			_, _ = w.Write(other)
		case strings.Contains(r.Header.Get("Accept-Encoding"), "gzip"):
			w.Header().Set("Content-Encoding", "gzip")
			_, _ = w.Write(gz.Bytes())
		default:
			_, _ = w.Write(text)
		}
	}))
	t.Cleanup(srv.Close)
	q := &recorder{}
	st := &attach.Stage{
		Config: &config.Attachments{Enabled: true, Bucket: bkt, Prefix: "gz/", KeyTemplate: "{digest}", MaxBytes: 1 << 20, OnMissing: config.OnMissingFail},
		Source: sourceClient(t, srv.URL), S3: s3c, Job: "orders", Quarantine: q,
	}
	lie := stub(2, "lie", "lie.txt", md5Digest(text), len(other))
	lie.Doc = json.RawMessage(strings.Replace(string(lie.Doc), `"stub":true`, `"stub":true,"encoding":"gzip","encoded_length":25`, 1))
	rows := []feed.Row{stub(1, "text", "a.txt", md5Digest(gz.Bytes()), len(text)), lie}
	if _, err := st.Process(t.Context(), rows); err != nil {
		t.Fatalf("Process: %v", err)
	}
	e := entries(t, rows, "text")["a.txt"]
	if e.Key == "" {
		t.Fatalf("entry of the compressed attachment = %+v (quarantine %+v), want a key", e, q.entries)
	}
	if got := object(t, s3c, bkt, e.Key); !bytes.Equal(got, text) {
		t.Errorf("object holds %d bytes, want the %d bytes of the decoded content", len(got), len(text))
	}
	if e := entries(t, rows, "lie")["lie.txt"]; e.Skipped != attach.SkippedMismatch || e.Key != "" {
		t.Errorf("entry whose content matches no digest = %+v, want s3_skipped %q", e, attach.SkippedMismatch)
	}
	if keys := testbucket.Keys(t.Context(), t, s3c, bkt); len(keys) != 1 {
		t.Errorf("bucket holds %v, want the one verified object", keys)
	}
}

// TestSlowTransfer: a transfer that keeps making progress has a deadline
// that follows its size, so a large one completes however long it takes
// at the configured rate; a transfer that stalls fails transiently, and
// once an attachment has failed Attempts times its document is delivered
// marked "failed" and recorded in the quarantine.
func TestSlowTransfer(t *testing.T) {
	t.Parallel()
	s3c, bkt := testbucket.New(t)
	large := random(t, 3<<20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/large.bin"):
			// 3 MiB in about 2.4 s: 64 KiB every 50 ms, longer than the
			// stall timeout and well inside the transfer's 7 s (the stall
			// timeout and 3 MiB at min_bytes_per_second), so that a loaded
			// machine's slower pace and upload stay inside it too.
			w.Header().Set("Content-Length", strconv.Itoa(len(large)))
			for rest := large; len(rest) > 0; {
				n := min(64<<10, len(rest))
				if _, err := w.Write(rest[:n]); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				rest = rest[n:]
				time.Sleep(50 * time.Millisecond)
			}
		default: // stalls after a few bytes
			_, _ = w.Write([]byte("first bytes"))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	}))
	t.Cleanup(srv.Close)
	q := &recorder{}
	st := &attach.Stage{
		Config: &config.Attachments{Enabled: true, Bucket: bkt, Prefix: "slow/", KeyTemplate: "{digest}", MaxBytes: 64 << 20, OnMissing: config.OnMissingFail,
			StallTimeout: config.Duration(time.Second), MinBytesPerSecond: 512 << 10, Attempts: 2},
		Source: sourceClient(t, srv.URL), S3: s3c, Job: "orders", Quarantine: q, PartSize: 5 << 20,
	}

	rows := []feed.Row{stub(1, "large", "large.bin", md5Digest(large), len(large))}
	if _, err := st.Process(t.Context(), rows); err != nil {
		t.Fatalf("Process of a slow large attachment: %v", err)
	}
	if e := entries(t, rows, "large")["large.bin"]; e.Key == "" {
		t.Errorf("entry of the slow large attachment = %+v, want a key", e)
	}

	stalled := stub(2, "stalled", "stalled.bin", md5Digest([]byte("never")), 1<<20)
	doc := stalled.Doc
	start := time.Now()
	rows = []feed.Row{stalled}
	_, err := st.Process(t.Context(), rows)
	if err == nil || !feed.Transient(err) {
		t.Errorf("first Process of a stalled attachment = %v, want a transient error", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the stalled transfer was given up after %s, want about the 1s stall timeout", d)
	}
	if !bytes.Equal(rows[0].Doc, doc) || len(q.entries) != 0 {
		t.Errorf("after one failed attempt: row %s, quarantine %+v; want both untouched", rows[0].Doc, q.entries)
	}
	rows = []feed.Row{{Seq: stalled.Seq, ID: stalled.ID, Rev: stalled.Rev, Doc: doc}}
	st2, err := st.Process(t.Context(), rows)
	if err != nil {
		t.Fatalf("Process on the last attempt: %v", err)
	}
	if e := entries(t, rows, "stalled")["stalled.bin"]; e.Skipped != attach.SkippedFailed || e.Key != "" {
		t.Errorf("entry after %d failed attempts = %+v, want s3_skipped %q", 2, e, attach.SkippedFailed)
	}
	if len(q.entries) != 1 || q.entries[0].Attempts != 2 || !strings.Contains(q.entries[0].Reason, "no progress") {
		t.Errorf("quarantine = %+v, want the stalled attachment after 2 attempts", q.entries)
	}
	if st2.Quarantined != 1 {
		t.Errorf("stats = %+v, want 1 quarantined", st2)
	}
}

// TestTransferWithinInvocation: a transfer that would outlast its caller's
// deadline ends before it, counted as a failed attempt, so that an
// attachment that cannot be copied within one invocation is given up too.
func TestTransferWithinInvocation(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for {
			if _, err := w.Write(bytes.Repeat([]byte("x"), 1024)); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}))
	t.Cleanup(srv.Close)
	q := &recorder{}
	st := &attach.Stage{
		Config: &config.Attachments{Enabled: true, Bucket: "b", Prefix: "t/", KeyTemplate: "{digest}", MaxBytes: 64 << 20, OnMissing: config.OnMissingFail,
			StallTimeout: config.Duration(time.Second), MinBytesPerSecond: 1024, Attempts: 1},
		Source: sourceClient(t, srv.URL), S3: absent{}, Job: "orders", Quarantine: q,
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
	defer cancel()
	rows := []feed.Row{stub(1, "big", "big.bin", md5Digest([]byte("x")), 50<<20)}
	if _, err := st.Process(ctx, rows); err != nil {
		t.Fatalf("Process: %v", err)
	}
	if ctx.Err() != nil {
		t.Errorf("Process returned after its caller's deadline")
	}
	if e := entries(t, rows, "big")["big.bin"]; e.Skipped != attach.SkippedFailed {
		t.Errorf("entry = %+v, want s3_skipped %q", e, attach.SkippedFailed)
	}
	if len(q.entries) != 1 {
		t.Errorf("quarantine = %+v, want the attachment", q.entries)
	}
}

// TestSourceRefusesAttachment: an error answer from the source for one
// attachment (a 400 here) is a failed transfer of that attachment, not a
// permanent failure of the job: transient until it has failed Attempts
// times, at least a stall timeout apart (a quick retry's failure does not
// count), then the document is delivered marked "failed" and recorded.
func TestSourceRefusesAttachment(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"bad_request","reason":"invalid attachment name"}`, http.StatusBadRequest)
	}))
	t.Cleanup(srv.Close)
	q := &recorder{}
	st := &attach.Stage{
		Config: &config.Attachments{Enabled: true, Bucket: "b", Prefix: "t/", KeyTemplate: "{digest}", MaxBytes: 1 << 20, OnMissing: config.OnMissingFail,
			Attempts: 2, StallTimeout: config.Duration(300 * time.Millisecond)},
		Source: sourceClient(t, srv.URL), S3: absent{}, Job: "orders", Quarantine: q,
	}
	row := stub(4, "refused", "r.bin", md5Digest([]byte("r")), 1)
	rows := []feed.Row{row}
	if _, err := st.Process(t.Context(), rows); err == nil || !feed.Transient(err) {
		t.Fatalf("first Process = %v, want a transient error", err)
	}
	rows = []feed.Row{row}
	if _, err := st.Process(t.Context(), rows); err == nil || !feed.Transient(err) {
		t.Fatalf("Process at once again = %v, want a transient error: a failure within a stall timeout of the last does not count", err)
	}
	time.Sleep(350 * time.Millisecond)
	rows = []feed.Row{row}
	if _, err := st.Process(t.Context(), rows); err != nil {
		t.Fatalf("second Process = %v, want the attachment given up", err)
	}
	if e := entries(t, rows, "refused")["r.bin"]; e.Skipped != attach.SkippedFailed {
		t.Errorf("entry = %+v, want s3_skipped %q", e, attach.SkippedFailed)
	}
	if len(q.entries) != 1 || !strings.Contains(q.entries[0].Reason, "400") {
		t.Errorf("quarantine = %+v, want the refused attachment", q.entries)
	}
}
