package pipeline_test

import (
	"bytes"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// TestHandleScheduleAttachments: with attachments enabled, the poller Lambda's
// handler queues the document with its attachment in the stack bucket and a
// reference in place of the stub.
func TestHandleScheduleAttachments(t *testing.T) {
	t.Parallel()
	s := newScheduleStackWith(t, `"attachments": {"enabled": true},`)
	content := make([]byte, 100<<10)
	if _, err := crand.Read(content); err != nil {
		t.Fatal(err)
	}
	body := `{"n":1,"_attachments":{"photo.jpg":{"content_type":"image/jpeg","data":"` + base64.StdEncoding.EncodeToString(content) + `"}}}`
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, s.db+"/a", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("put a: status %d", resp.StatusCode)
	}
	if res, err := s.invoke("req-1", 3*time.Second); err != nil || res.Enqueued != 1 {
		t.Fatalf("invocation: %+v, %v", res, err)
	}
	q := s.queued(1)
	if len(q) != 1 {
		t.Fatalf("queued %d envelopes, want 1", len(q))
	}
	var doc struct {
		Attachments map[string]map[string]any `json:"_attachments"`
	}
	if err := json.Unmarshal(q[0].Doc, &doc); err != nil {
		t.Fatal(err)
	}
	e := doc.Attachments["photo.jpg"]
	key, _ := e["s3_key"].(string)
	if e["s3_bucket"] != "changes-worker-tests" || !strings.HasPrefix(key, "attachments/"+s.cfg.Stack.Prefix+"/orders/md5-") || e["stub"] != nil ||
		e["content_type"] != "image/jpeg" || e["length"] != float64(len(content)) {
		t.Fatalf("queued entry = %v", e)
	}
	out, err := s.deps.S3.GetObject(t.Context(), &s3.GetObjectInput{Bucket: &s.cfg.Stack.Bucket, Key: &key})
	if err != nil {
		t.Fatalf("get the attachment object: %v", err)
	}
	defer out.Body.Close()
	got, _ := io.ReadAll(out.Body)
	if !bytes.Equal(got, content) {
		t.Errorf("object %s holds %d bytes that are not the attachment's", key, len(got))
	}
}
