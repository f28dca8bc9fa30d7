package receiver_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/demo/receiver"
)

// endless is a body that never ends (up to 256 MiB, so that a reader
// without a bound finishes too), counting what was read.
type endless struct{ n atomic.Int64 }

func (e *endless) Read(p []byte) (int, error) {
	if e.n.Load() >= 256<<20 {
		return 0, io.EOF
	}
	for i := range p {
		p[i] = ' '
	}
	e.n.Add(int64(len(p)))
	return len(p), nil
}

// serve starts a receiver storing into a new directory.
func serve(t *testing.T) (string, *receiver.Server, *httptest.Server) {
	t.Helper()
	dir := t.TempDir()
	s, err := receiver.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return dir, s, srv
}

// TestBodyBound: a body longer than the receiver takes is refused with 413
// after at most that much is read, and nothing is stored.
func TestBodyBound(t *testing.T) {
	t.Parallel()
	dir, _, srv := serve(t)
	body := &endless{}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, srv.URL+"/docs/a", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Changes-Version", "1.1")
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	if err == nil && resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("status %d, want 413", resp.StatusCode)
	}
	if n := body.n.Load(); n > (32<<20)+(8<<20) {
		t.Errorf("the client sent %d bytes, want about %d at most", n, 32<<20)
	}
	if _, err := os.Stat(filepath.Join(dir, receiver.FileName("a"))); !os.IsNotExist(err) {
		t.Errorf("stat stored file: %v, want none", err)
	}
	// A body within the bound is stored.
	req, _ = http.NewRequestWithContext(t.Context(), http.MethodPut, srv.URL+"/docs/a", strings.NewReader(`{"_id":"a"}`))
	req.Header.Set("X-Changes-Version", "1.2")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("status of a small body %d, want 204", resp.StatusCode)
	}
}

// TestReadersSeeWholeDocuments: a reader of the directory (the tests, the
// demo's summary) never finds a document half written while a newer
// version replaces it, nor a file that is not a document.
func TestReadersSeeWholeDocuments(t *testing.T) {
	t.Parallel()
	dir, _, srv := serve(t)
	body := `{"_id":"a","pad":"` + strings.Repeat("x", 1<<20) + `"}`
	done := make(chan struct{})
	var torn atomic.Int64
	go func() {
		defer close(done)
		for i := 1; i <= 200; i++ {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, srv.URL+"/docs/a", strings.NewReader(body))
			req.Header.Set("X-Changes-Version", fmt.Sprintf("1.%d", i))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
		}
	}()
	for reading := true; reading; {
		select {
		case <-done:
			reading = false
		default:
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Name() != receiver.FileName("a") {
				t.Fatalf("file %s in the receiver's directory, want documents only", e.Name())
			}
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			if err == nil && len(b) != len(body) {
				torn.Add(1)
			}
		}
	}
	if n := torn.Load(); n > 0 {
		t.Errorf("%d reads found a document of another length than the %d bytes written", n, len(body))
	}
}

// TestDocs: Docs reads back what the server holds after puts and deletes,
// ids that need escaping included, and nothing else in its directory.
func TestDocs(t *testing.T) {
	t.Parallel()
	dir, s, srv := serve(t)
	send := func(method, id, version, body string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+"/docs/"+url.PathEscape(id), strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Changes-Version", version)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("%s %s: status %d", method, id, resp.StatusCode)
		}
	}
	send(http.MethodPut, "a", "1.1", `{"_id":"a","_rev":"1-a"}`)
	send(http.MethodPut, "a", "1.2", `{"_id":"a","_rev":"2-a"}`)
	send(http.MethodPut, "with/slash ünï.x", "1.3", `{"_id":"with/slash ünï.x","_rev":"1-s"}`)
	send(http.MethodPut, "gone", "1.4", `{"_id":"gone","_rev":"1-g"}`)
	send(http.MethodDelete, "gone", "1.5", "")
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not a document"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := s.Docs()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]receiver.Doc{
		"a":                {ID: "a", Rev: "2-a", Body: json.RawMessage(`{"_id":"a","_rev":"2-a"}`)},
		"with/slash ünï.x": {ID: "with/slash ünï.x", Rev: "1-s", Body: json.RawMessage(`{"_id":"with/slash ünï.x","_rev":"1-s"}`)},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Docs (-want +got):\n%s", diff)
	}
}
