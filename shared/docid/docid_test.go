package docid

import (
	"net/url"
	"strings"
	"testing"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

func TestPathSegment(t *testing.T) {
	t.Parallel()
	tests := []struct {
		id, want string
	}{
		{"plain", "plain"},
		{".", "%2E"},
		{"..", "%2E%2E"},
		{"...", "%2E%2E%2E"},
		{".a", ".a"},
		{"a..b", "a..b"},
		{"a/../../b", "a%2F..%2F..%2Fb"},
		{"%2e%2e/", "%252e%252e%2F"},
		{"+1 2", "%2B1%202"},
		{"é", "%C3%A9"},
		{"e\u0301", "e%CC%81"},
		{"nul\x00", "nul%00"},
		{"q?x#y", "q%3Fx%23y"},
		{"", ""},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			t.Parallel()
			got := PathSegment(tt.id)
			if got != tt.want {
				t.Errorf("PathSegment(%q) = %q, want %q", tt.id, got, tt.want)
			}
			if back, err := url.PathUnescape(got); err != nil || back != tt.id {
				t.Errorf("PathUnescape(%q) = %q, %v; want %q", got, back, err, tt.id)
			}
		})
	}
}

// FuzzPathSegment: for any id, the segment unescapes to the id, holds no
// '/', '?' or '#', and is never a dot segment.
func FuzzPathSegment(f *testing.F) {
	for _, id := range testenv.HostileIDs() {
		f.Add(id)
	}
	f.Fuzz(func(t *testing.T, id string) {
		seg := PathSegment(id)
		if strings.ContainsAny(seg, "/?#") || seg == "." || seg == ".." {
			t.Fatalf("PathSegment(%q) = %q", id, seg)
		}
		if back, err := url.PathUnescape(seg); err != nil || back != id {
			t.Fatalf("PathUnescape(PathSegment(%q)) = %q, %v", id, back, err)
		}
	})
}
