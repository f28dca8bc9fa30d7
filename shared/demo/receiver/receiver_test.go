package receiver_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

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
func serve(t *testing.T) (string, *httptest.Server) {
	t.Helper()
	dir := t.TempDir()
	s, err := receiver.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return dir, srv
}

// TestBodyBound: a body longer than the receiver takes is refused with 413
// after at most that much is read, and nothing is stored.
func TestBodyBound(t *testing.T) {
	t.Parallel()
	dir, srv := serve(t)
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
	dir, srv := serve(t)
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
