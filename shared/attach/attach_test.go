package attach_test

import (
	"bytes"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/changes-worker/changes-worker/shared/attach"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/testbucket"
)

func object(t *testing.T, c *s3.Client, bucket, key string) []byte {
	t.Helper()
	out, err := c.GetObject(t.Context(), &s3.GetObjectInput{Bucket: &bucket, Key: &key})
	if err != nil {
		t.Fatalf("get s3://%s/%s: %v", bucket, key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatalf("read s3://%s/%s: %v", bucket, key, err)
	}
	return b
}

func random(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := crand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// source is a database the test writes to and the feed reads.
type source struct {
	put func(id string, body map[string]any) string // returns the new rev
	get func(id string) map[string]any              // current body with attachment stubs
	del func(id, rev string) string
	url string
	typ string
	// user and password of the reader, if any.
	user, password string
	fetch          string
}

func couchSource(t *testing.T) *source {
	db := testenv.CouchDB(t)
	do := func(method, path string, body any) map[string]any {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequestWithContext(t.Context(), method, db+path, rd)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		if resp.StatusCode > 299 {
			t.Fatalf("%s %s: status %d: %v", method, path, resp.StatusCode, out)
		}
		return out
	}
	return &source{
		url: db, typ: config.SourceCouchDB, fetch: config.FetchIncludeDocs,
		put: func(id string, body map[string]any) string {
			return do(http.MethodPut, "/"+url.PathEscape(id), body)["rev"].(string)
		},
		get: func(id string) map[string]any { return do(http.MethodGet, "/"+url.PathEscape(id), nil) },
		del: func(id, rev string) string {
			return do(http.MethodDelete, "/"+url.PathEscape(id)+"?rev="+url.QueryEscape(rev), nil)["rev"].(string)
		},
	}
}

func syncGatewaySource(t *testing.T) *source {
	sg := testenv.StartSyncGateway(t, testenv.SyncGatewayOptions{})
	db := sg.CreateDB(t, "")
	db.PutUser("reader", "readerpw", "att")
	return &source{
		url: db.URL(), typ: config.SourceSyncGateway, fetch: config.FetchBulkGet, user: "reader", password: "readerpw",
		put: func(id string, body map[string]any) string {
			rev, _ := body["_rev"].(string)
			delete(body, "_rev")
			body["channels"] = []string{"att"}
			r := db.Put(id, rev, body)
			db.WaitCached()
			return r
		},
		get: func(id string) map[string]any { return db.Admin(http.MethodGet, "/"+url.PathEscape(id), nil) },
		del: func(id, rev string) string { r := db.Delete(id, rev); db.WaitCached(); return r },
	}
}

func (s *source) client(t *testing.T) *feed.Client {
	t.Helper()
	c, err := feed.New(feed.Options{
		SourceType: s.typ, URL: s.url, Limit: 1000, Fetch: s.fetch,
		Username: s.user, Password: s.password,
		Slack: 10 * time.Second, RequestTimeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatalf("new feed client: %v", err)
	}
	return c
}

// read reads the feed from since to its end through the attachment stage.
func read(t *testing.T, f *attach.Feed, since json.RawMessage) ([]feed.Row, json.RawMessage) {
	t.Helper()
	b, err := f.Changes(t.Context(), since, 0)
	if err != nil {
		t.Fatalf("changes: %v", err)
	}
	if err := f.FetchDocs(t.Context(), b.Rows); err != nil {
		t.Fatalf("fetch docs: %v", err)
	}
	return b.Rows, b.LastSeq
}

func inline(contentType string, b []byte) map[string]any {
	return map[string]any{"content_type": contentType, "data": base64.StdEncoding.EncodeToString(b)}
}

type entry struct {
	ContentType string `json:"content_type"`
	Digest      string `json:"digest"`
	Length      int64  `json:"length"`
	Bucket      string `json:"s3_bucket"`
	Key         string `json:"s3_key"`
	Skipped     string `json:"s3_skipped"`
	Data        any    `json:"data"`
	Stub        any    `json:"stub"`
}

func entries(t *testing.T, rows []feed.Row, id string) map[string]entry {
	t.Helper()
	for _, r := range rows {
		if r.ID != id {
			continue
		}
		var doc struct {
			Attachments map[string]entry `json:"_attachments"`
		}
		if err := json.Unmarshal(r.Doc, &doc); err != nil {
			t.Fatalf("doc %s: %v", id, err)
		}
		return doc.Attachments
	}
	t.Fatalf("no row for %s", id)
	return nil
}

func TestAttachmentsToS3(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		src  func(*testing.T) *source
	}{
		{"pouchdb-server", couchSource},
		{"sync gateway", syncGatewaySource},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s3c, bkt := testbucket.New(t)
			src := tt.src(t)
			var stats []attach.Stats
			f := &attach.Feed{
				Inner: src.client(t),
				Stage: &attach.Stage{
					Config: &config.Attachments{Enabled: true, Bucket: bkt, Prefix: "attachments/j/", KeyTemplate: "{digest}",
						MaxBytes: 1 << 20, OnMissing: config.OnMissingFail},
					Source: src.client(t), S3: s3c, PartSize: 5 << 20,
				},
				OnStats: func(s attach.Stats) { stats = append(stats, s) },
			}
			one, two, big := random(t, 300<<10), random(t, 1000), random(t, 2<<20)
			src.put("a", map[string]any{"k": 1, "_attachments": map[string]any{
				"one.bin":   inline("application/octet-stream", one),
				"two.bin":   inline("image/png", two),
				"three.txt": inline("text/plain", []byte("three")),
			}})
			revB := src.put("b", map[string]any{"k": 2, "_attachments": map[string]any{
				"same.bin": inline("application/octet-stream", one),
			}})
			src.put("c", map[string]any{"k": 3, "_attachments": map[string]any{"big.bin": inline("application/octet-stream", big)}})
			src.put("plain", map[string]any{"k": 4})

			rows, since := read(t, f, nil)
			a := entries(t, rows, "a")
			if len(a) != 3 {
				t.Fatalf("doc a has %d attachments, want 3: %+v", len(a), a)
			}
			want := map[string]struct {
				ct   string
				body []byte
			}{"one.bin": {"application/octet-stream", one}, "two.bin": {"image/png", two}, "three.txt": {"text/plain", []byte("three")}}
			for name, w := range want {
				e := a[name]
				if e.ContentType != w.ct || e.Length != int64(len(w.body)) || e.Digest == "" || e.Bucket != bkt ||
					!strings.HasPrefix(e.Key, "attachments/j/") || e.Data != nil || e.Stub != nil {
					t.Errorf("a/%s entry = %+v", name, e)
					continue
				}
				if got := object(t, s3c, bkt, e.Key); !bytes.Equal(got, w.body) {
					t.Errorf("a/%s object %s: %d bytes, not the attachment's %d", name, e.Key, len(got), len(w.body))
				}
			}
			if b := entries(t, rows, "b")["same.bin"]; b.Key != a["one.bin"].Key {
				t.Errorf("b/same.bin key %q, want a/one.bin's %q (same digest)", b.Key, a["one.bin"].Key)
			}
			if c := entries(t, rows, "c")["big.bin"]; c.Skipped != attach.SkippedTooLarge || c.Key != "" {
				t.Errorf("c/big.bin over max_bytes = %+v, want s3_skipped too_large and no key", c)
			}
			if p := entries(t, rows, "plain"); p != nil {
				t.Errorf("doc without attachments gained %v", p)
			}
			if len(stats) != 1 || stats[0].Uploaded != 3 || stats[0].Present != 0 || stats[0].Skipped != 1 {
				t.Errorf("first read stats = %+v, want 3 uploaded (one.bin once), 1 skipped", stats)
			}

			// Update: two.bin changes, three.txt is removed, one.bin stays.
			cur := src.get("a")
			atts := cur["_attachments"].(map[string]any)
			delete(atts, "three.txt")
			two2 := random(t, 2000)
			atts["two.bin"] = inline("image/png", two2)
			src.put("a", cur)
			src.del("b", revB)

			stats = nil
			rows, _ = read(t, f, since)
			a2 := entries(t, rows, "a")
			if _, ok := a2["three.txt"]; ok || len(a2) != 2 {
				t.Errorf("after the update doc a has %v, want one.bin and two.bin", a2)
			}
			if a2["one.bin"].Key != a["one.bin"].Key {
				t.Errorf("unchanged one.bin key %q, want %q", a2["one.bin"].Key, a["one.bin"].Key)
			}
			if a2["two.bin"].Key == a["two.bin"].Key || a2["two.bin"].Digest == a["two.bin"].Digest {
				t.Errorf("updated two.bin kept key %q", a2["two.bin"].Key)
			}
			if got := object(t, s3c, bkt, a2["two.bin"].Key); !bytes.Equal(got, two2) {
				t.Errorf("new two.bin object differs")
			}
			if got := object(t, s3c, bkt, a["two.bin"].Key); !bytes.Equal(got, two) {
				t.Errorf("old two.bin object changed")
			}
			if got := object(t, s3c, bkt, a["three.txt"].Key); string(got) != "three" {
				t.Errorf("removed three.txt object = %q, want kept", got)
			}
			var deleted bool
			for _, r := range rows {
				if r.ID == "b" {
					deleted = r.Deleted && r.Doc == nil
				}
			}
			if !deleted {
				t.Errorf("row of deleted doc b missing or not a tombstone: %+v", rows)
			}
			if len(stats) != 1 || stats[0].Uploaded != 1 || stats[0].Present != 1 {
				t.Errorf("second read stats = %+v, want two.bin uploaded and one.bin found present", stats)
			}
		})
	}
}

// TestMissingAttachment: the source answers 404 for an attachment the entry
// names; "fail" stops with a permanent error and leaves the rows as they
// were, "skip" marks the entry.
func TestMissingAttachment(t *testing.T) {
	t.Parallel()
	s3c, bkt := testbucket.New(t)
	src := couchSource(t)
	c := src.client(t)
	digest := "md5-" + base64.StdEncoding.EncodeToString(make([]byte, 16))
	doc := json.RawMessage(`{"_id":"x","_rev":"1-a","_attachments":{"gone.bin":{"content_type":"x/y","digest":"` + digest + `","length":3,"stub":true}}}`)
	for _, tt := range []struct {
		policy string
		ok     bool
	}{{config.OnMissingFail, false}, {config.OnMissingSkip, true}} {
		st := &attach.Stage{Config: &config.Attachments{Enabled: true, Bucket: bkt, Prefix: tt.policy + "/", KeyTemplate: "{digest}", MaxBytes: 100, OnMissing: tt.policy},
			Source: c, S3: s3c}
		rows := []feed.Row{{ID: "x", Rev: "1-a", Doc: doc}}
		_, err := st.Process(t.Context(), rows)
		if tt.ok {
			if err != nil {
				t.Fatalf("%s: %v", tt.policy, err)
			}
			if e := entries(t, rows, "x")["gone.bin"]; e.Skipped != attach.SkippedMissing || e.Key != "" {
				t.Errorf("%s: entry = %+v", tt.policy, e)
			}
			continue
		}
		if err == nil || !errors.Is(err, feed.ErrNotFound) || feed.Transient(err) {
			t.Errorf("%s: error %v, want a permanent not found", tt.policy, err)
		}
		if !bytes.Equal(rows[0].Doc, doc) {
			t.Errorf("%s: failed call changed the row", tt.policy)
		}
	}
}

// TestContentMismatch: content whose digest is not the entry's is refused
// and no object is left, for a single put and for a multipart upload; the
// document goes on with the entry marked "s3_skipped": "mismatch".
func TestContentMismatch(t *testing.T) {
	t.Parallel()
	s3c, bkt := testbucket.New(t)
	for _, size := range []int{10, 11 << 20} {
		data := base64.StdEncoding.EncodeToString(random(t, size))
		digest := "md5-" + base64.StdEncoding.EncodeToString(make([]byte, 16))
		doc := json.RawMessage(fmt.Sprintf(`{"_attachments":{"f":{"content_type":"x/y","digest":%q,"data":%q}}}`, digest, data))
		st := &attach.Stage{Config: &config.Attachments{Enabled: true, Bucket: bkt, Prefix: "m/", KeyTemplate: "{digest}", MaxBytes: 64 << 20, OnMissing: "fail"},
			S3: s3c, PartSize: 5 << 20}
		rows := []feed.Row{{ID: "x", Rev: "1-a", Doc: doc}}
		if _, err := st.Process(t.Context(), rows); err != nil {
			t.Errorf("%d bytes: %v", size, err)
		}
		if e := entries(t, rows, "x")["f"]; e.Skipped != attach.SkippedMismatch || e.Key != "" {
			t.Errorf("%d bytes: entry = %+v, want s3_skipped %q and no key", size, e, attach.SkippedMismatch)
		}
		out, lerr := s3c.ListObjectsV2(t.Context(), &s3.ListObjectsV2Input{Bucket: &bkt})
		if lerr != nil {
			t.Fatal(lerr)
		}
		if len(out.Contents) != 0 {
			t.Errorf("%d bytes: %d objects left, want none", size, len(out.Contents))
		}
		mu, lerr := s3c.ListMultipartUploads(t.Context(), &s3.ListMultipartUploadsInput{Bucket: &bkt})
		if lerr != nil {
			t.Fatal(lerr)
		}
		if len(mu.Uploads) != 0 {
			t.Errorf("%d bytes: %d multipart uploads left open", size, len(mu.Uploads))
		}
	}
}
