package pipeline

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/secret"
)

// TestHTTPSinkResolvesEverySecret: the writer's HTTP sink gets the headers
// given by reference and the url_secret from the secret resolver.
func TestHTTPSinkResolvesEverySecret(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var path, key, source string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		path, key, source = r.URL.EscapedPath(), r.Header.Get("X-Api-Key"), r.Header.Get("X-Source")
	}))
	t.Cleanup(srv.Close)
	f, err := config.Parse([]byte(`{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"outputs":[
		{"id":"h","type":"http","http":{"url":"` + srv.URL + `/hooks/{secret}/{doc_id}","url_secret":{"env":"HOOK_PATH"},
			"headers":{"X-Api-Key":{"env":"API_KEY"},"X-Source":"demo"}}}]}]}`))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	env := map[string]string{"HOOK_PATH": "T1/B2", "API_KEY": "k-9"}
	d := &Deps{Config: f, Secrets: &secret.Resolver{Lookup: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}}
	j := f.Jobs[0]
	s, err := d.Sink(t.Context(), config.Route{Job: j, Output: j.Outputs[0]})
	if err != nil {
		t.Fatalf("open sink: %v", err)
	}
	c := &change.Envelope{V: 1, Job: "a", Output: "h", DocID: "d1", Rev: "1-a", Seq: []byte(`1`),
		Version: change.Version{Generation: 1, Counter: 1}, Doc: []byte(`{"_id":"d1"}`)}
	if err := s.Apply(t.Context(), []*change.Envelope{c})[0]; err != nil {
		t.Fatalf("apply: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join([]string{path, key, source}, " "); got != "/hooks/T1/B2/d1 k-9 demo" {
		t.Errorf("endpoint saw %q, want %q", got, "/hooks/T1/B2/d1 k-9 demo")
	}

	delete(env, "API_KEY")
	if _, err := d.Sink(t.Context(), config.Route{Job: j, Output: j.Outputs[0]}); err == nil || !strings.Contains(err.Error(), "X-Api-Key") {
		t.Errorf("open sink without the header's secret: got %v, want an error naming X-Api-Key", err)
	}
}
