package attach_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/attach"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/testenv/testbucket"
)

// TestThroughput copies 200 attachments of 256 KiB (one per document) from
// pouchdb-server to the local S3 and logs the rate; a second pass over the
// same rows finds every object present and uploads nothing.
func TestThroughput(t *testing.T) {
	t.Parallel()
	const docs, size = 200, 256 << 10
	s3c, bkt := testbucket.New(t)
	src := couchSource(t)
	for start := 0; start < docs; start += 20 {
		var batch []map[string]any
		for i := start; i < start+20; i++ {
			batch = append(batch, map[string]any{"_id": fmt.Sprintf("d%03d", i),
				"_attachments": map[string]any{"blob.bin": inline("application/octet-stream", random(t, size))}})
		}
		b, _ := json.Marshal(map[string]any{"docs": batch})
		resp, err := http.Post(src.url+"/_bulk_docs", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("bulk docs: status %d", resp.StatusCode)
		}
	}
	c := src.client(t)
	b, err := c.Changes(t.Context(), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.FetchDocs(t.Context(), b.Rows); err != nil {
		t.Fatal(err)
	}
	if len(b.Rows) != docs {
		t.Fatalf("read %d rows, want %d", len(b.Rows), docs)
	}
	stage := &attach.Stage{
		Config: &config.Attachments{Enabled: true, Bucket: bkt, Prefix: "t/", KeyTemplate: "{digest}", MaxBytes: 1 << 20, OnMissing: "fail"},
		Source: c, S3: s3c,
	}
	rows := append([]feed.Row(nil), b.Rows...)
	st, err := stage.Process(t.Context(), rows)
	if err != nil {
		t.Fatal(err)
	}
	if st.Uploaded != docs || st.Bytes != docs*size {
		t.Fatalf("stats %+v, want %d uploaded, %d bytes", st, docs, docs*size)
	}
	sec := st.Elapsed.Seconds()
	t.Logf("upload: %d attachments x %d KiB in %s: %.1f MB/s, %.0f attachments/s (concurrency %d)",
		st.Uploaded, size>>10, st.Elapsed.Round(time.Millisecond), float64(st.Bytes)/1e6/sec, float64(st.Uploaded)/sec, attach.DefaultConcurrency)

	again, err := stage.Process(t.Context(), append([]feed.Row(nil), b.Rows...))
	if err != nil {
		t.Fatal(err)
	}
	if again.Uploaded != 0 || again.Present != docs {
		t.Fatalf("second pass %+v, want none uploaded, %d present", again, docs)
	}
	t.Logf("unchanged: %d attachments found present (HEAD only) in %s: %.0f attachments/s",
		again.Present, again.Elapsed.Round(time.Millisecond), float64(again.Present)/again.Elapsed.Seconds())
}
