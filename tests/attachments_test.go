package tests

import (
	"bytes"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/statetable/quarantine"
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
