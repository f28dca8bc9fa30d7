package sample_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/changes-worker/changes-worker/shared/demo/sample"
)

// TestBulkAnswerBound: a database whose _bulk_docs answer does not end is
// read only so far and reported, not read to its end.
func TestBulkAnswerBound(t *testing.T) {
	t.Parallel()
	var written atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		chunk := []byte("[" + strings.Repeat(" ", 32<<10))
		for written.Load() < 256<<20 {
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
			chunk[0] = ' '
		}
	}))
	t.Cleanup(srv.Close)
	if _, err := sample.Load(t.Context(), srv.Client(), srv.URL+"/db", sample.Options{Docs: 3}); err == nil {
		t.Error("Load: no error")
	}
	if n := written.Load(); n > 64<<20 {
		t.Errorf("the database wrote %d bytes before the read stopped, want at most 64 MiB", n)
	}
}
