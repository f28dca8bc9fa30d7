package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite docs/benchmarks.md from docs/bench-results.json")

// TestBenchmarksPage checks that docs/benchmarks.md is the page the
// committed results give; -update writes it.
func TestBenchmarksPage(t *testing.T) {
	t.Parallel()
	const source = "docs/bench-results.json"
	root := filepath.Join("..", "..")
	r, err := readResults(filepath.Join(root, source))
	if err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	if err := writeReport(&got, r, source); err != nil {
		t.Fatal(err)
	}
	page := filepath.Join(root, "docs", "benchmarks.md")
	if *update {
		if err := os.WriteFile(page, []byte(got.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), got.String()); diff != "" {
		t.Errorf("docs/benchmarks.md is not what %s gives (go test ./tests/bench -run TestBenchmarksPage -update rewrites it) (-page +generated):\n%s", source, diff)
	}
}

// TestEveryRowHasItsFigures checks that each row reads only figures its
// benchmark records, by rendering it from a results file that holds them.
func TestEveryRowHasItsFigures(t *testing.T) {
	t.Parallel()
	r, err := readResults(filepath.Join("..", "..", "docs", "bench-results.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range figureRows {
		f := &figureReader{figures: r.Figures[row.bench]}
		row.value(f)
		if f.missing {
			t.Errorf("row %q reads a figure that docs/bench-results.json lacks for %s", row.what, row.bench)
		}
	}
}

func TestGroupThousands(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
	}{
		{"small", "999", "999"},
		{"thousands", "31760", "31,760"},
		{"millions with fraction", "1234567.89", "1,234,567.89"},
		{"negative", "-4800", "-4,800"},
		{"fraction only", "0.099", "0.099"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := groupThousands(tt.in); got != tt.want {
				t.Errorf("groupThousands(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}
