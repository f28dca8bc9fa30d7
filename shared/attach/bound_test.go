package attach_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/attach"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/statetable/quarantine"
	"github.com/changes-worker/changes-worker/shared/testenv/testbucket"
)

// endless serves every attachment as a body that does not end (up to
// 256 MiB, so that a reader without a bound finishes too) and counts the
// bytes it wrote.
type endless struct {
	written  atomic.Int64
	encoding atomic.Value // the Accept-Encoding of the last request
}

func (e *endless) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.encoding.Store(r.Header.Get("Accept-Encoding"))
	w.Header().Set("Content-Type", "application/octet-stream")
	chunk := []byte(strings.Repeat("x", 32<<10))
	for e.written.Load() < 256<<20 {
		n, err := w.Write(chunk)
		e.written.Add(int64(n))
		if err != nil {
			return
		}
	}
}

// TestAttachmentLongerThanItsEntry: an attachment whose entry declares 10
// bytes but whose source streams without end is read to 11 bytes, not to
// its end; the mismatch is the document's, not the page's: the call
// succeeds, the entry is delivered marked "s3_skipped": attach.SkippedMismatch with no
// key, and the rest of the page is copied.
func TestAttachmentLongerThanItsEntry(t *testing.T) {
	t.Parallel()
	s3c, bkt := testbucket.New(t)
	src := &endless{}
	srv := httptest.NewServer(src)
	t.Cleanup(srv.Close)
	c, err := feed.New(feed.Options{SourceType: config.SourceCouchDB, URL: srv.URL + "/db", Slack: time.Second, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	good := []byte("fine content")
	sum := md5.Sum(good)
	digest := "md5-" + base64.StdEncoding.EncodeToString(make([]byte, 16))
	rows := []feed.Row{
		{Seq: json.RawMessage(`7`), ID: "bad", Rev: "1-a", Doc: json.RawMessage(`{"_id":"bad","_rev":"1-a","_attachments":{"f.bin":{"content_type":"x/y","digest":"` + digest + `","length":10,"stub":true}}}`)},
		{Seq: json.RawMessage(`8`), ID: "good", Rev: "1-b", Doc: json.RawMessage(`{"_id":"good","_rev":"1-b","_attachments":{"g.txt":{"content_type":"text/plain","digest":"md5-` +
			base64.StdEncoding.EncodeToString(sum[:]) + `","data":"` + base64.StdEncoding.EncodeToString(good) + `"}}}`)},
	}
	q := &recorder{}
	st := &attach.Stage{
		Config: &config.Attachments{Enabled: true, Bucket: bkt, Prefix: "bound/", KeyTemplate: "{digest}", MaxBytes: 1 << 30, OnMissing: config.OnMissingFail},
		Source: c, S3: s3c, Job: "orders", Quarantine: q,
	}
	stats, err := st.Process(t.Context(), rows)
	if err != nil {
		t.Fatalf("Process: %v (the source wrote %d bytes)", err, src.written.Load())
	}
	// The socket buffers hold some of what the source wrote past the bound.
	if n := src.written.Load(); n > 16<<20 {
		t.Errorf("the source wrote %d bytes before the read stopped, want at most 16 MiB", n)
	}
	// Asked for by the stage itself, so the client decompresses nothing
	// past the bound; the stage decodes with a bound of its own.
	if got := src.encoding.Load(); got != "gzip" {
		t.Errorf("Accept-Encoding = %q, want gzip, set by the stage", got)
	}
	if e := entries(t, rows, "bad")["f.bin"]; e.Skipped != attach.SkippedMismatch || e.Key != "" {
		t.Errorf("entry of the mismatched attachment = %+v, want s3_skipped %q and no key", e, attach.SkippedMismatch)
	}
	if e := entries(t, rows, "good")["g.txt"]; e.Key == "" {
		t.Errorf("entry of the good attachment = %+v, want a key", e)
	}
	if stats.Uploaded != 1 || stats.Skipped != 1 {
		t.Errorf("stats = %+v, want 1 uploaded, 1 skipped", stats)
	}
	want := []quarantine.Entry{{Job: "orders", Kind: quarantine.Attachment, Seq: json.RawMessage(`7`),
		Reason: `copy attachment "f.bin" of "bad" rev 1-a: content does not match the attachment's entry: 11 bytes read, the entry says 10`,
		Raw:    []byte(`{"f.bin":{"content_type":"x/y","digest":"` + digest + `","length":10,"stub":true}}`)}}
	if diff := cmp.Diff(want, q.entries); diff != "" {
		t.Errorf("quarantine entries (-want +got):\n%s", diff)
	}

	// A quarantine that cannot record holds the page back: a transient
	// error, the rows as they were.
	q.err = errors.New("throttled")
	doc := json.RawMessage(`{"_id":"bad","_rev":"1-a","_attachments":{"f.bin":{"content_type":"x/y","digest":"` + digest + `","length":10,"stub":true}}}`)
	again := []feed.Row{{Seq: json.RawMessage(`7`), ID: "bad", Rev: "1-a", Doc: doc}}
	if _, err := st.Process(t.Context(), again); err == nil || !feed.Transient(err) {
		t.Errorf("Process with a failing quarantine = %v, want a transient error", err)
	}
	if !bytes.Equal(again[0].Doc, doc) {
		t.Errorf("a failed call changed the row: %s", again[0].Doc)
	}
}

// recorder is a quarantine that keeps what it records, or fails with err.
type recorder struct {
	mu      sync.Mutex
	entries []quarantine.Entry
	err     error
}

func (r *recorder) Record(_ context.Context, e quarantine.Entry) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	r.entries = append(r.entries, e)
	return nil
}

// TestAttachmentTimeout: a source that trickles an attachment, slower than
// min_bytes_per_second, is given up after stall_timeout plus the entry's
// length at that rate, with a transient error (the source may be slow for
// a while), not after the invocation's budget.
func TestAttachmentTimeout(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for {
			if _, err := w.Write([]byte("x")); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}))
	t.Cleanup(srv.Close)
	c, err := feed.New(feed.Options{SourceType: config.SourceCouchDB, URL: srv.URL + "/db", Slack: time.Second, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	digest := "md5-" + base64.StdEncoding.EncodeToString(make([]byte, 16))
	rows := []feed.Row{{Seq: json.RawMessage(`7`), ID: "slow", Rev: "1-a",
		Doc: json.RawMessage(`{"_id":"slow","_rev":"1-a","_attachments":{"f.bin":{"content_type":"x/y","digest":"` + digest + `","length":1000,"stub":true}}}`)}}
	st := &attach.Stage{
		Config: &config.Attachments{Enabled: true, Bucket: "b", Prefix: "t/", KeyTemplate: "{digest}", MaxBytes: 1 << 20, OnMissing: config.OnMissingFail,
			StallTimeout: config.Duration(300 * time.Millisecond), MinBytesPerSecond: 4096},
		Source: c, S3: absent{},
	}
	start := time.Now()
	_, err = st.Process(t.Context(), rows)
	if err == nil || !feed.Transient(err) {
		t.Errorf("Process = %v, want a transient error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Process took %s, want about 300ms + 1000 B at 4 KiB/s", d)
	}
}

// absent is an S3 that holds no object and must not be written to.
type absent struct{ attach.S3 }

func (absent) HeadObject(context.Context, *s3.HeadObjectInput, ...func(*s3.Options)) (*s3.HeadObjectOutput, error) {
	return nil, &s3types.NotFound{}
}

// TestCompressedAttachmentBound: a compressed answer is decoded with the
// same bound as any other: 200 MiB of zeros sent as 200 KiB of gzip for an
// entry of 10 bytes is read to 11 bytes and is a mismatch.
func TestCompressedAttachmentBound(t *testing.T) {
	t.Parallel()
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	zero := make([]byte, 1<<20)
	for range 200 {
		_, _ = zw.Write(zero)
	}
	_ = zw.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write(gz.Bytes())
	}))
	t.Cleanup(srv.Close)
	c, err := feed.New(feed.Options{SourceType: config.SourceCouchDB, URL: srv.URL + "/db", Slack: time.Second, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	digest := "md5-" + base64.StdEncoding.EncodeToString(make([]byte, 16))
	rows := []feed.Row{{Seq: json.RawMessage(`3`), ID: "bomb", Rev: "1-a",
		Doc: json.RawMessage(`{"_id":"bomb","_rev":"1-a","_attachments":{"z.bin":{"content_type":"x/y","digest":"` + digest + `","length":10,"stub":true}}}`)}}
	q := &recorder{}
	st := &attach.Stage{
		Config: &config.Attachments{Enabled: true, Bucket: "b", Prefix: "z/", KeyTemplate: "{digest}", MaxBytes: 1 << 30, OnMissing: config.OnMissingFail},
		Source: c, S3: absent{}, Job: "orders", Quarantine: q,
	}
	if _, err := st.Process(t.Context(), rows); err != nil {
		t.Fatalf("Process: %v", err)
	}
	if e := entries(t, rows, "bomb")["z.bin"]; e.Skipped != attach.SkippedMismatch {
		t.Errorf("entry = %+v, want s3_skipped %q", e, attach.SkippedMismatch)
	}
	if len(q.entries) != 1 || !strings.Contains(q.entries[0].Reason, "11 bytes read, the entry says 10") {
		t.Errorf("quarantine = %+v, want the attachment read to 11 bytes", q.entries)
	}
}
