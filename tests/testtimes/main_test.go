package main

import (
	"strings"
	"testing"
)

// TestRun: plain go test's lines come through, a passing test's output does
// not, a failing test's does, the slowest top-level tests come last, and a
// failure is reported.
func TestRun(t *testing.T) {
	t.Parallel()
	in := strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"chatty line of a passing test\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestA","Elapsed":1.5}`,
		`{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:9: boom\n"}`,
		`{"Action":"output","Package":"p","Test":"TestB/sub","Output":"sub output\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestB/sub","Elapsed":9}`,
		`{"Action":"fail","Package":"p","Test":"TestB","Elapsed":12.25}`,
		`{"Action":"output","Package":"p","Output":"FAIL\tp\t13.8s\n"}`,
		`{"Action":"fail","Package":"p","Elapsed":13.8}`,
		`{"Action":"output","Package":"q","Output":"ok  \tq\t0.2s\n"}`,
		`{"Action":"pass","Package":"q","Test":"TestC","Elapsed":0.2}`,
		`{"Action":"pass","Package":"q","Elapsed":0.2}`,
	}, "\n")
	var out strings.Builder
	failed, err := run(strings.NewReader(in), &out, 2)
	if err != nil || !failed {
		t.Fatalf("run = %v, %v; want failed", failed, err)
	}
	got := out.String()
	for _, want := range []string{"b_test.go:9: boom", "FAIL\tp\t13.8s", "ok  \tq\t0.2s", "the 2 slowest tests:\n", "12.3s  p TestB (failed)\n", "1.5s  p TestA\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "chatty") || strings.Contains(got, "TestC") || strings.Contains(got, "=== RUN") {
		t.Errorf("output holds what plain go test leaves out, or a third test:\n%s", got)
	}
}

// TestRunPassing: nothing failed, nothing reported as failed; no result at
// all is a failure.
func TestRunPassing(t *testing.T) {
	t.Parallel()
	in := `{"Action":"pass","Package":"q","Test":"TestC","Elapsed":0.2}
{"Action":"pass","Package":"q","Elapsed":0.2}`
	if failed, err := run(strings.NewReader(in), &strings.Builder{}, 10); failed || err != nil {
		t.Errorf("run = %v, %v; want a pass", failed, err)
	}
	if failed, err := run(strings.NewReader(`{"Action":"run","Package":"q","Test":"TestC"}`), &strings.Builder{}, 10); !failed || err == nil {
		t.Errorf("run of a stream without results = %v, %v; want a failure", failed, err)
	}
}
