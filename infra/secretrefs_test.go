package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
)

// TestSecretRefsOfHTTPHeaders: the writer may read the secrets of headers
// given by reference and of url_secret, and nothing the poller reads.
func TestSecretRefsOfHTTPHeaders(t *testing.T) {
	t.Parallel()
	f, err := config.Parse([]byte(`{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"outputs":[
		{"id":"h","type":"http","http":{"url":"https://x/hooks/{secret}/{doc_id}","url_secret":{"secret":"hooks/a"},
			"headers":{"X-Api-Key":{"env":"API_KEY"},"Cookie":{"secret":"hooks/a","json_key":"cookie"},"X-Source":"demo"}}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	src, out := secretRefs(f)
	if len(src) != 0 {
		t.Errorf("source refs = %v, want none", src)
	}
	want := []config.SecretRef{{Secret: "hooks/a"}, {Env: "API_KEY"}}
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("output refs (-want +got):\n%s", diff)
	}
}
