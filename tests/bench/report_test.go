package main

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
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

// TestMerge checks that a run of some benchmarks replaces their figures
// and runs in a results file and keeps the others with theirs, and the
// figures of a benchmark that failed in the run.
func TestMerge(t *testing.T) {
	t.Parallel()
	day := func(d int) time.Time { return time.Date(2026, 11, d, 0, 0, 0, 0, time.UTC) }
	older := &results{Started: day(1), Commit: "old", Note: "seeded", Figures: map[string]map[string]any{
		"failover": {"a": 1.0}, "cloud-idle": {"b": 2.0}}}
	r := &results{Started: day(2), Commit: "new", Figures: map[string]map[string]any{"failover": {"a": 3.0},
		"cloud-idle": {"b": 4.0, "error": "stopped"}}, Runs: map[string]run{
		"failover":   {Started: day(2), Commit: "new", Load: "0.50"},
		"cloud-idle": {Started: day(2), Commit: "new"}}}
	m, failed := r.merge(older)
	if !slices.Equal(failed, []string{"cloud-idle"}) {
		t.Errorf("merge failed = %v, want [cloud-idle], which keeps its seeded figures", failed)
	}
	want := &results{Started: day(2), Commit: "new", Figures: map[string]map[string]any{
		"failover": {"a": 3.0}, "cloud-idle": {"b": 2.0}}, Runs: map[string]run{
		"failover":   {Started: day(2), Commit: "new", Load: "0.50"},
		"cloud-idle": {Started: day(1), Commit: "old", Note: "seeded"}}}
	if diff := cmp.Diff(want, m, cmp.AllowUnexported(results{}), cmpopts.IgnoreTypes(sync.Mutex{})); diff != "" {
		t.Errorf("merge (-want +got):\n%s", diff)
	}
	groups := runGroups(m)
	if len(groups) != 2 || groups[0].run.Commit != "old" || groups[1].run.Commit != "new" {
		t.Errorf("runGroups = %+v, want the seeded run's cloud-idle, then the new run's failover", groups)
	}
}
