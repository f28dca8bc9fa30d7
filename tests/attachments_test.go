package tests

import (
	"bytes"
	"context"
	"crypto/md5"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/metrics"
	"github.com/changes-worker/changes-worker/shared/statetable/quarantine"
	"github.com/changes-worker/changes-worker/shared/testenv/testbucket"
	"github.com/changes-worker/changes-worker/tests/faults"
)

// With attachments enabled, every output (PostgreSQL body, HTTP body, S3
// object) receives the documents with s3_bucket/s3_key references whose
// objects hold the attachments' bytes.
func TestAttachmentsReachEveryOutput(t *testing.T) {
	ctx, s := parallelStack(t, stackOptions{attachments: &config.Attachments{Enabled: true}})
	contents := map[string][]byte{}
	for _, id := range []string{"a", "b", "c"} {
		b := make([]byte, 70<<10)
		if _, err := crand.Read(b); err != nil {
			t.Fatal(err)
		}
		contents[id] = b
		if _, err := s.PutDoc(ctx, id, map[string]any{"type": "order", "_attachments": map[string]any{
			"scan.pdf": map[string]any{"content_type": "application/pdf", "data": base64.StdEncoding.EncodeToString(b)},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	sum := s.runUntilIdle(ctx, localrun.Options{})
	for k, st := range sum.Outputs {
		if st.DeadLettered != 0 {
			t.Errorf("%s: %d dead-lettered", k, st.DeadLettered)
		}
	}
	c := s.Deps.S3
	bucket := s.Config.Stack.Bucket
	if a := s.Config.Job("orders").Attachments; a.Bucket != bucket || a.Prefix != "attachments/"+s.Config.Stack.Prefix+"/orders/" {
		t.Fatalf("attachments setting after defaults: %+v", a)
	}
	check := func(output, id string, body []byte) {
		t.Helper()
		var d struct {
			Attachments map[string]struct {
				Bucket string `json:"s3_bucket"`
				Key    string `json:"s3_key"`
				Stub   any    `json:"stub"`
				Length int    `json:"length"`
			} `json:"_attachments"`
		}
		if err := json.Unmarshal(body, &d); err != nil {
			t.Fatalf("%s %s: %v", output, id, err)
		}
		e, ok := d.Attachments["scan.pdf"]
		if !ok || e.Bucket != bucket || !strings.HasPrefix(e.Key, "attachments/"+s.Config.Stack.Prefix+"/orders/") || e.Key == "" || e.Stub != nil || e.Length != len(contents[id]) {
			t.Errorf("%s %s: entry %+v", output, id, e)
			return
		}
		g, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: &e.Bucket, Key: &e.Key})
		if err != nil {
			t.Fatalf("%s %s: get %s: %v", output, id, e.Key, err)
		}
		got, _ := io.ReadAll(g.Body)
		g.Body.Close()
		if !bytes.Equal(got, contents[id]) {
			t.Errorf("%s %s: object %s is not the attachment", output, id, e.Key)
		}
	}
	// seen counts, per output, the bodies of the test's documents found
	// there, each checked.
	seen := map[string]int{}
	for id := range contents {
		for output, name := range map[string]string{"pg": "postgres", "archive": "s3"} {
			body, ok, err := s.Body(ctx, "orders", output, id)
			if err != nil {
				t.Fatalf("%s %s: %v", name, id, err)
			}
			if ok {
				seen[name]++
				check(name, id, body)
			}
		}
	}
	docs, err := s.recv.Docs()
	if err != nil {
		t.Fatal(err)
	}
	for id := range contents {
		if d, ok := docs[id]; ok {
			seen["http"]++
			check("http", id, d.Body)
		}
	}
	for _, output := range []string{"postgres", "http", "s3"} {
		if seen[output] != len(contents) {
			t.Errorf("%s output holds %d of the %d documents", output, seen[output], len(contents))
		}
	}
}

// An attachment whose source streams past the length its entry declares is
// its document's failure, not the page's: the poller reads a bounded part
// of it, delivers the document with the entry marked "s3_skipped":
// "mismatch", records it in the job's quarantine, and the checkpoint moves
// past it to the changes after.
func TestAttachmentLongerThanItsEntry(t *testing.T) {
	ctx, s := parallelStack(t, stackOptions{outputs: []string{"pg"}, attachments: &config.Attachments{Enabled: true}})
	if _, err := s.PutDoc(ctx, "a", map[string]any{"_attachments": map[string]any{"f.bin": map[string]any{"content_type": "x/y", "data": base64.StdEncoding.EncodeToString([]byte("ten bytes!"))}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutDoc(ctx, "b", map[string]any{"n": 1}); err != nil {
		t.Fatal(err)
	}
	// The job reads the database through a proxy that serves every
	// attachment without end.
	target, err := url.Parse(s.SourceURL)
	if err != nil {
		t.Fatal(err)
	}
	var written atomic.Int64
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// GET /{db}/{doc}/{attachment}
		if parts := strings.Split(strings.Trim(r.URL.EscapedPath(), "/"), "/"); r.Method == http.MethodGet && len(parts) == 3 && !strings.HasPrefix(parts[1], "_") {
			chunk := bytes.Repeat([]byte("x"), 32<<10)
			for written.Load() < 256<<20 {
				n, err := w.Write(chunk)
				written.Add(int64(n))
				if err != nil {
					return
				}
			}
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(src.Close)
	s.Config.Job("orders").Source.URL = src.URL + target.Path
	sum := s.runUntilIdle(ctx, localrun.Options{})
	for k, st := range sum.Outputs {
		if st.DeadLettered != 0 {
			t.Errorf("%s: %d dead-lettered", k, st.DeadLettered)
		}
	}
	if n := written.Load(); n > 16<<20 {
		t.Errorf("the source wrote %d bytes of the attachment before the poller stopped reading, want at most 16 MiB", n)
	}
	if got := s.pgState(ctx); len(got) != 2 {
		t.Errorf("postgres holds %v, want a and b", got)
	}
	body, ok, err := s.Body(ctx, "orders", "pg", "a")
	if err != nil || !ok {
		t.Fatalf("postgres body of a: %v (stored: %v)", err, ok)
	}
	var doc struct {
		Attachments map[string]struct {
			Skipped string `json:"s3_skipped"`
			Key     string `json:"s3_key"`
		} `json:"_attachments"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	if e := doc.Attachments["f.bin"]; e.Skipped != "mismatch" || e.Key != "" {
		t.Errorf("body of a = %s, want its entry marked s3_skipped mismatch", body)
	}
	entries, err := quarantine.List(ctx, s.Deps.DynamoDB, s.Config.TableName(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Kind != quarantine.Attachment || !strings.Contains(entries[0].Reason, "11 bytes read, the entry says 10") {
		t.Errorf("quarantine = %+v, want the attachment of a", entries)
	}
	st, err := s.Leases.Get(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	seq, err := s.UpdateSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(st.Checkpoint) != string(seq) {
		t.Errorf("checkpoint %s, want the source's update_seq %s", st.Checkpoint, seq)
	}
}

// attachmentEntry is one _attachments entry as an output holds it.
type attachmentEntry struct {
	Skipped string `json:"s3_skipped"`
	Bucket  string `json:"s3_bucket"`
	Key     string `json:"s3_key"`
}

// pgEntries returns the _attachments entries of the document the pg output
// holds for id.
func (s *testStack) pgEntries(ctx context.Context, id string) map[string]attachmentEntry {
	s.t.Helper()
	body, ok, err := s.Body(ctx, "orders", "pg", id)
	if err != nil || !ok {
		s.t.Fatalf("postgres body of %s: %v (stored: %v)", id, err, ok)
	}
	var doc struct {
		Attachments map[string]attachmentEntry `json:"_attachments"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		s.t.Fatalf("postgres body of %s: %v", id, err)
	}
	return doc.Attachments
}

// objectBytes reads an attachment's object.
func (s *testStack) objectBytes(ctx context.Context, e attachmentEntry) []byte {
	s.t.Helper()
	g, err := s.Deps.S3.GetObject(ctx, &s3.GetObjectInput{Bucket: &e.Bucket, Key: &e.Key})
	if err != nil {
		s.t.Fatalf("get %s: %v", e.Key, err)
	}
	defer g.Body.Close()
	b, err := io.ReadAll(g.Body)
	if err != nil {
		s.t.Fatalf("read %s: %v", e.Key, err)
	}
	return b
}

// caughtUp checks that the job's checkpoint is the source's update_seq.
func (s *testStack) caughtUp(ctx context.Context) {
	s.t.Helper()
	st, err := s.Leases.Get(ctx, "orders")
	if err != nil {
		s.t.Fatal(err)
	}
	seq, err := s.UpdateSeq(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	if string(st.Checkpoint) != string(seq) {
		s.t.Errorf("checkpoint %s, want the source's update_seq %s", st.Checkpoint, seq)
	}
}

// jobMetricSum adds up what the poller recorded of a job metric.
func jobMetricSum(t *testing.T, out, name string) float64 {
	t.Helper()
	var total float64
	for _, line := range strings.Split(out, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["Output"] != nil {
			continue
		}
		switch v := rec[name].(type) {
		case float64:
			total += v
		case []any:
			for _, x := range v {
				total += x.(float64)
			}
		}
	}
	return total
}

// putAttached writes a document with inline attachments (name → content).
func putAttached(ctx context.Context, t *testing.T, s *testStack, id string, atts map[string][]byte) {
	t.Helper()
	m := map[string]any{}
	for name, b := range atts {
		m[name] = map[string]any{"content_type": "application/octet-stream", "data": base64.StdEncoding.EncodeToString(b)}
	}
	if _, err := s.PutDoc(ctx, id, map[string]any{"_attachments": m}); err != nil {
		t.Fatal(err)
	}
}

// A connection to the source cut in the middle of an attachment's transfer
// (the body ends before its Content-Length) is the source's failure, not
// the document's: the page is read again and the copy is made once a
// transfer completes, above the multipart threshold as below it; nothing
// is marked or quarantined, and no empty part is uploaded.
func TestAttachmentTransferCut(t *testing.T) {
	parts := &partCounter{}
	ctx, s := parallelStack(t, stackOptions{outputs: []string{"pg"}, limit: 1, attachments: &config.Attachments{Enabled: true},
		httpClient: func(c aws.HTTPClient) aws.HTTPClient { parts.next = c; return parts }})
	big, small := make([]byte, 12<<20), make([]byte, 3000)
	for _, b := range [][]byte{big, small} {
		if _, err := crand.Read(b); err != nil {
			t.Fatal(err)
		}
	}
	// One document a page (limit 1): each copy is tried on its own.
	putAttached(ctx, t, s, "a", map[string][]byte{"big.bin": big})
	putAttached(ctx, t, s, "c", map[string][]byte{"small.bin": small})
	if _, err := s.PutDoc(ctx, "b", map[string]any{"n": 1}); err != nil {
		t.Fatal(err)
	}
	proxy, err := faults.NewSourceProxy(s.SourceURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	// big.bin is cut after its first 8 MiB part is uploaded.
	proxy.Attachment("big.bin", faults.AttachmentFault{Cut: 2, CutAfter: 9 << 20})
	proxy.Attachment("small.bin", faults.AttachmentFault{Cut: 2})
	s.Config.Job("orders").Source.URL = proxy.URL()

	sum := s.runUntilIdle(ctx, localrun.Options{})
	for k, st := range sum.Outputs {
		if st.DeadLettered != 0 {
			t.Errorf("%s: %d dead-lettered", k, st.DeadLettered)
		}
	}
	if got := s.pgState(ctx); len(got) != 3 {
		t.Errorf("postgres holds %v, want a, b and c", got)
	}
	for id, att := range map[string]struct {
		name    string
		content []byte
	}{"a": {"big.bin", big}, "c": {"small.bin", small}} {
		e := s.pgEntries(ctx, id)[att.name]
		if e.Key == "" || e.Skipped != "" {
			t.Errorf("entry %s = %+v, want a copy", att.name, e)
			continue
		}
		if got := s.objectBytes(ctx, e); !bytes.Equal(got, att.content) {
			t.Errorf("object of %s holds %d bytes, not the attachment's %d", att.name, len(got), len(att.content))
		}
		if n := proxy.Downloads(att.name); n != 3 {
			t.Errorf("%s downloaded %d times, want the 2 cut ones and one whole", att.name, n)
		}
	}
	if n, empty := parts.counts(); empty != 0 || n > 6 {
		t.Errorf("%d parts uploaded, %d of them empty; want at most 6 (two 8 MiB parts a transfer), none empty", n, empty)
	}
	q, err := quarantine.List(ctx, s.Deps.DynamoDB, s.Config.TableName(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	if len(q) != 0 {
		t.Errorf("quarantine = %+v, want nothing", q)
	}
	s.caughtUp(ctx)
}

// partCounter counts the S3 UploadPart requests that pass through it, and
// the empty ones.
type partCounter struct {
	next         aws.HTTPClient
	mu           sync.Mutex
	parts, empty int
}

func (p *partCounter) Do(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPut && r.URL.Query().Has("partNumber") {
		p.mu.Lock()
		p.parts++
		if r.ContentLength == 0 {
			p.empty++
		}
		p.mu.Unlock()
	}
	return p.next.Do(r)
}

func (p *partCounter) counts() (parts, empty int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.parts, p.empty
}

// A large attachment the source serves slowly is copied however long its
// transfer takes, as long as it keeps the configured rate; one whose
// transfer can never complete (it stalls every time) is given up after
// attachments.attempts: its document is delivered with the entry marked
// "failed", the attachment recorded in the quarantine and counted by
// AttachmentsQuarantined, and the documents after it are delivered.
func TestSlowAttachment(t *testing.T) {
	ctx, s := parallelStack(t, stackOptions{outputs: []string{"pg"}, attachments: &config.Attachments{Enabled: true,
		StallTimeout: config.Duration(2 * time.Second), MinBytesPerSecond: 512 << 10, Attempts: 2}})
	ctx, cancel := context.WithTimeout(ctx, 150*time.Second)
	defer cancel()
	slow, stuck := make([]byte, 9<<20), make([]byte, 100<<10)
	for _, b := range [][]byte{slow, stuck} {
		if _, err := crand.Read(b); err != nil {
			t.Fatal(err)
		}
	}
	putAttached(ctx, t, s, "slow", map[string][]byte{"slow.bin": slow})
	putAttached(ctx, t, s, "stuck", map[string][]byte{"stuck.bin": stuck})
	for _, id := range []string{"c1", "c2", "c3"} {
		if _, err := s.PutDoc(ctx, id, map[string]any{"n": id}); err != nil {
			t.Fatal(err)
		}
	}
	proxy, err := faults.NewSourceProxy(s.SourceURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	proxy.Attachment("slow.bin", faults.AttachmentFault{BytesPerSecond: 2 << 20})
	proxy.Attachment("stuck.bin", faults.AttachmentFault{Stall: true})
	s.Config.Job("orders").Source.URL = proxy.URL()

	s.runUntilIdle(ctx, localrun.Options{})
	if got := s.pgState(ctx); len(got) != 5 {
		t.Errorf("postgres holds %v, want slow, stuck, c1, c2, c3", got)
	}
	if e := s.pgEntries(ctx, "slow")["slow.bin"]; e.Key == "" {
		t.Errorf("entry of the slow attachment = %+v, want a copy", e)
	} else if got := s.objectBytes(ctx, e); !bytes.Equal(got, slow) {
		t.Errorf("object of the slow attachment holds %d bytes, want %d", len(got), len(slow))
	}
	if e := s.pgEntries(ctx, "stuck")["stuck.bin"]; e.Skipped != "failed" || e.Key != "" {
		t.Errorf("entry of the stalled attachment = %+v, want s3_skipped failed", e)
	}
	if n := proxy.Downloads("stuck.bin"); n != 2 {
		t.Errorf("the stalled attachment was tried %d times, want attachments.attempts (2)", n)
	}
	q, err := quarantine.List(ctx, s.Deps.DynamoDB, s.Config.TableName(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	if len(q) != 1 || q[0].Kind != quarantine.Attachment || q[0].Attempts != 2 || !strings.Contains(q[0].Reason, "stuck.bin") {
		t.Errorf("quarantine = %+v, want the stalled attachment after 2 attempts", q)
	}
	if n := jobMetricSum(t, s.Metrics().String(), metrics.AttachmentsQuarantined); n != 1 {
		t.Errorf("AttachmentsQuarantined = %v, want 1", n)
	}
	s.caughtUp(ctx)
}

// A hostile document never stops the job: an attachment whose content_type
// holds CR/LF (stored as sent, which pouchdb-server then fails to serve)
// and an entry whose digest is not a digest are their documents' failures;
// those documents are delivered with the entries marked and recorded, and
// the ordinary documents after them are delivered.
func TestHostileAttachments(t *testing.T) {
	// A failed transfer is counted once a stall timeout: 1 s here, and two
	// failures give a copy up.
	ctx, s := parallelStack(t, stackOptions{outputs: []string{"pg"},
		attachments: &config.Attachments{Enabled: true, StallTimeout: config.Duration(time.Second), Attempts: 2}})
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if _, err := s.PutDoc(ctx, "crlf", map[string]any{"_attachments": map[string]any{"a.txt": map[string]any{
		"content_type": "text/plain\r\nX-Injected: 1", "data": base64.StdEncoding.EncodeToString([]byte("hello"))}}}); err != nil {
		t.Fatal(err)
	}
	marker := []byte("the digest of this one is rewritten")
	sum := md5.Sum(marker)
	digest := base64.StdEncoding.EncodeToString(sum[:])
	putAttached(ctx, t, s, "malformed", map[string][]byte{"m.bin": marker})
	ordinary := []string{"o1", "o2", "o3", "o4", "o5"}
	for _, id := range ordinary {
		putAttached(ctx, t, s, id, map[string][]byte{id + ".bin": []byte("ordinary " + id)})
	}
	proxy, err := faults.NewSourceProxy(s.SourceURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	proxy.Rewrite(`"md5-`+digest+`"`, `"../../elsewhere-`+digest+`"`)
	s.Config.Job("orders").Source.URL = proxy.URL()

	s.runUntilIdle(ctx, localrun.Options{})
	got := s.pgState(ctx)
	for _, id := range ordinary {
		if _, ok := got[id]; !ok {
			t.Errorf("ordinary document %s not delivered", id)
			continue
		}
		if e := s.pgEntries(ctx, id)[id+".bin"]; e.Key == "" {
			t.Errorf("%s: entry %+v, want a copy", id, e)
		}
	}
	if e := s.pgEntries(ctx, "malformed")["m.bin"]; e.Skipped != "invalid" || e.Key != "" {
		t.Errorf("entry with a malformed digest = %+v, want s3_skipped invalid", e)
	}
	crlf := s.pgEntries(ctx, "crlf")["a.txt"]
	if crlf.Key == "" && crlf.Skipped == "" {
		t.Errorf("entry with a CR/LF content_type = %+v, want a copy or a mark", crlf)
	}
	q, err := quarantine.List(ctx, s.Deps.DynamoDB, s.Config.TableName(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]bool{}
	for _, e := range q {
		for _, name := range []string{"m.bin", "a.txt"} {
			if strings.Contains(e.Reason, `"`+name+`"`) {
				reasons[name] = true
			}
		}
	}
	if !reasons["m.bin"] || (crlf.Skipped != "" && !reasons["a.txt"]) {
		t.Errorf("quarantine = %+v, want the malformed entry and any attachment not copied", q)
	}
	for _, k := range testbucketKeys(ctx, t, s) {
		if own := "attachments/" + s.Config.Stack.Prefix + "/orders/md5-"; !strings.HasPrefix(k, own) && strings.HasPrefix(k, "attachments/") {
			t.Errorf("attachment object %q outside the job's digests", k)
		}
	}
	s.caughtUp(ctx)
}

// testbucketKeys lists the stack bucket.
func testbucketKeys(ctx context.Context, t *testing.T, s *testStack) []string {
	t.Helper()
	return testbucket.Keys(ctx, t, s.Deps.S3, s.Config.Stack.Bucket)
}
