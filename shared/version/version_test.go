package version

import (
	"runtime"
	"testing"
)

// TestStrings: what a binary says of itself with and without a stamped
// release and commit. Not parallel: it sets the stamped variables.
func TestStrings(t *testing.T) {
	goPart := runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")"
	tests := []struct {
		name, version, commit string
		wantString, wantLong  string
	}{
		{"unstamped", "", "", "devel", "devel (" + goPart},
		{"release only", "1.0.0", "", "1.0.0", "1.0.0 (" + goPart},
		{"release and commit", "1.2.3", "8df98482f5c1", "1.2.3", "1.2.3 (commit 8df98482f5c1, " + goPart},
	}
	defer func(v, c string) { version, commit = v, c }(version, commit)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			version, commit = tt.version, tt.commit
			if got := String(); got != tt.wantString {
				t.Errorf("String() = %q, want %q", got, tt.wantString)
			}
			if got := Commit(); got != tt.commit {
				t.Errorf("Commit() = %q, want %q", got, tt.commit)
			}
			if got := Long(); got != tt.wantLong {
				t.Errorf("Long() = %q, want %q", got, tt.wantLong)
			}
		})
	}
}
