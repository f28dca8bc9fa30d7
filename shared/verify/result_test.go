package verify

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestResultFit: a result too large for the verify function's answer keeps
// its counts whole and shows fewer samples, and a report decoded from JSON
// (counts, no drift list) is not clean when it counts drift.
func TestResultFit(t *testing.T) {
	t.Parallel()
	rep := &Report{SourceDocs: 3000, Counts: map[Kind]int{}}
	for i := range 2000 {
		rep.Drift = append(rep.Drift, Drift{Kind: Missing, DocID: fmt.Sprintf("%04d-%s", i, strings.Repeat("x", 200)), SourceRev: "1-a"})
	}
	rep.Drift = append(rep.Drift, Drift{Kind: Stale, DocID: "s", SourceRev: "2-b", OutputRev: "1-a"})
	for _, d := range rep.Drift {
		rep.Counts[d.Kind]++
	}
	res := NewResult("orders", "pg", rep, 1000)
	if got := len(res.Samples[Missing]); got != 1000 {
		t.Fatalf("%d missing samples, want 1000", got)
	}
	const limit = 64 << 10
	if err := res.Fit(limit); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > limit {
		t.Errorf("%d bytes after Fit(%d)", len(b), limit)
	}
	if n := len(res.Samples[Missing]); n == 0 || n >= 1000 || len(res.Samples[Stale]) != 1 {
		t.Errorf("samples after Fit: %d missing, %d stale; want fewer than 1000 missing but some, the one stale", n, len(res.Samples[Stale]))
	}
	var back Result
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Report.Counts[Missing] != 2000 || back.Report.Counts[Stale] != 1 || back.Report.Clean() {
		t.Errorf("decoded report: counts %v, clean %v; want 2000 missing, 1 stale, not clean", back.Report.Counts, back.Report.Clean())
	}
	if err := NewResult("orders", "pg", rep, 10).Fit(100); err == nil {
		t.Error("Fit(100) of a result whose counts alone take more: no error")
	}
}
