package s3sink

import (
	"strings"
	"testing"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// FuzzKey: for any prefix and key template New accepts and any two ids,
// the object and marker keys start with the prefix and have no "." or ".."
// segment after it (so no key leaves the prefix, even for a client that
// resolves them), the id adds no '/', and distinct ids get distinct keys
// that never equal a marker key.
func FuzzKey(f *testing.F) {
	for _, id := range testenv.HostileIDs() {
		f.Add("docs/", "{doc_id}.json", id, "..")
		f.Add("", "by-id/{doc_id}", id, id+"x")
		f.Add("a.b/", "{doc_id}/{doc_id}", "."+id, id)
	}
	f.Add("_tombstones/", "{doc_id}", "a", "_tombstones%2Fa")
	f.Add("p/", ".{doc_id}", ".", "..")
	f.Add("p/./", "{doc_id}", "a", "b")
	f.Add("p/", "x/./{doc_id}/.", "a", "b")
	f.Fuzz(func(t *testing.T, prefix, tmpl, id, other string) {
		s, err := New(&fakeS3{}, config.S3Output{Bucket: "b", Prefix: prefix, KeyTemplate: tmpl})
		if err != nil {
			return
		}
		key, marker := s.Key(id), s.TombstoneKey(id)
		for _, k := range []string{key, marker} {
			if !strings.HasPrefix(k, prefix) {
				t.Fatalf("key %q does not start with the prefix %q", k, prefix)
			}
			for _, seg := range strings.Split(k[len(prefix):], "/") {
				if seg == "." || seg == ".." {
					t.Fatalf("key %q (prefix %q, template %q, id %q) has a %q segment", k, prefix, tmpl, id, seg)
				}
			}
		}
		if got, want := strings.Count(key, "/"), strings.Count(prefix+strings.ReplaceAll(tmpl, "{doc_id}", ""), "/"); got != want {
			t.Fatalf("key %q of id %q has %d '/', the template %d", key, id, got, want)
		}
		if key == marker {
			t.Fatalf("object and marker keys of %q are both %q", id, key)
		}
		if id != other {
			if k := s.Key(other); k == key {
				t.Fatalf("ids %q and %q share the key %q", id, other, key)
			}
			if s.TombstoneKey(other) == key {
				t.Fatalf("the marker of %q is the object key of %q", other, id)
			}
		}
	})
}
