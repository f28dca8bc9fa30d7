package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReleaseDocumented: VERSION names a release MAJOR.MINOR.PATCH that
// CHANGELOG.md has a section for, and LICENSE holds the Apache License 2.0.
func TestReleaseDocumented(t *testing.T) {
	read := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	v := strings.TrimSpace(read("VERSION"))
	if !regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`).MatchString(v) {
		t.Fatalf("VERSION holds %q, want MAJOR.MINOR.PATCH", v)
	}
	section := regexp.MustCompile(`(?m)^## \[` + regexp.QuoteMeta(v) + `\]`)
	if !section.MatchString(read("CHANGELOG.md")) {
		t.Errorf("CHANGELOG.md has no section \"## [%s]\" for the release VERSION names", v)
	}
	license := read("LICENSE")
	for _, want := range []string{"Apache License\n                           Version 2.0, January 2004",
		"TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION", "END OF TERMS AND CONDITIONS"} {
		if !strings.Contains(license, want) {
			t.Errorf("LICENSE lacks %q: it is not the Apache License 2.0", want)
		}
	}
}
