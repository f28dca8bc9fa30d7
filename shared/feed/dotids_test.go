package feed

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// dotIDs are document ids that a URL path would read as relative segments
// if they were not escaped.
var dotIDs = []string{".", "..", "...", "_design/.."}

// TestCouchGetDotIDs reads documents whose ids are made of dots, by id and
// by revision, from the real source: each answer must be that document,
// not the server's welcome or the database's info.
func TestCouchGetDotIDs(t *testing.T) {
	t.Parallel()
	db := testenv.CouchDB(t)
	var docs []map[string]any
	for _, id := range dotIDs {
		docs = append(docs, map[string]any{"_id": id, "v": id})
	}
	revs := bulkDocs(t, db, true, docs...)
	c := newCouchClient(t, db, nil)
	for i, id := range dotIDs {
		body, rev, err := c.Get(t.Context(), id)
		if err != nil {
			t.Errorf("Get(%q): %v", id, err)
			continue
		}
		var got struct {
			ID string `json:"_id"`
			V  string `json:"v"`
		}
		if err := json.Unmarshal(body, &got); err != nil || got.ID != id || got.V != id || rev != revs[i] {
			t.Errorf("Get(%q) = %s rev %s (%v), want the document at %s", id, body, rev, err, revs[i])
		}
		got.ID = ""
		body, err = c.getDoc(t.Context(), id, revs[i])
		if err != nil {
			t.Errorf("get %q at rev %s: %v", id, revs[i], err)
			continue
		}
		if err := json.Unmarshal(body, &got); err != nil || got.ID != id {
			t.Errorf("get %q at rev %s = %s (%v), want the document", id, revs[i], body, err)
		}
	}
}

// TestDocPathEscapesDots asserts the raw request path of per-document GETs.
func TestDocPathEscapesDots(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.EscapedPath())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"_id":"x","_rev":"1-a"}`))
	}))
	t.Cleanup(srv.Close)
	c := newCouchClient(t, srv.URL+"/db", func(o *Options) { o.RequestTimeout = 5 * time.Second })
	want := map[string]string{
		".":          "/db/%2E",
		"..":         "/db/%2E%2E",
		"...":        "/db/%2E%2E%2E",
		"_design/..": "/db/_design/%2E%2E",
		"_local/.":   "/db/_local/%2E",
		"a.b":        "/db/a.b",
		"a/../../b":  "/db/a%2F..%2F..%2Fb",
		"%2e%2e/":    "/db/%252e%252e%2F",
		"+1":         "/db/%2B1",
	}
	for id, path := range want {
		if _, _, err := c.Get(t.Context(), id); err != nil {
			t.Fatalf("Get(%q): %v", id, err)
		}
		mu.Lock()
		got := paths[len(paths)-1]
		mu.Unlock()
		if got != path {
			t.Errorf("Get(%q) requested %s, want %s", id, got, path)
		}
	}
}
