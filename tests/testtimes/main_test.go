package main

import (
	"strings"
	"testing"
)

// TestRun: plain go test's lines come through, a passing test's output does
// not, a failing test's does, the slowest top-level tests come last, and a
// failure is reported. A test's wait for a slot is not counted.
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
		`{"Action":"output","Package":"p","Test":"TestW","Output":"    harness_test.go:97: waited 1m30s for a test slot\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestW","Elapsed":100}`,
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
	for _, want := range []string{"b_test.go:9: boom", "FAIL\tp\t13.8s", "ok  \tq\t0.2s", "the 2 slowest tests", "12.3s  p TestB (failed)\n", "10s  p TestW\n"} {
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

// TestFailuresSummed: each message a failed test logged, with the first
// lines it goes on with (a diff) but not the lines of a log it dumps below
// it, comes again after the slowest tests, where the tail of a long output
// still shows it.
func TestFailuresSummed(t *testing.T) {
	t.Parallel()
	lines := []string{
		`{"Action":"output","Package":"p","Test":"TestF","Output":"=== CONT  TestF\n"}`,
		`{"Action":"output","Package":"p","Test":"TestF","Output":"    f_test.go:10: waited 2s for a test slot\n"}`,
		`{"Action":"output","Package":"p","Test":"TestF","Output":"    f_test.go:20: round 3: no holder within 39s\n"}`,
		`{"Action":"output","Package":"p","Test":"TestF","Output":"        detail of the message\n"}`,
		`{"Action":"output","Package":"p","Test":"TestF","Output":"    f_test.go:25: output pg (-source +output):\n"}`,
		`{"Action":"output","Package":"p","Test":"TestF","Output":"        \u00a0\u00a0map[string]string{\n"}`,
		`{"Action":"output","Package":"p","Test":"TestF","Output":"        -\u00a0\"a\": \"1-x\",\n"}`,
		`{"Action":"output","Package":"p","Test":"TestF","Output":"        +\u00a0\"a\": \"2-y\",\n"}`,
		`{"Action":"output","Package":"p","Test":"TestF","Output":"        \u00a0\u00a0}\n"}`,
		`{"Action":"output","Package":"p","Test":"TestF","Output":"    f_test.go:30: poller logs:\n"}`,
		`{"Action":"output","Package":"p","Test":"TestF","Output":"        --- poller a (pid 1)\n"}`,
	}
	for i := range 200 {
		lines = append(lines, `{"Action":"output","Package":"p","Test":"TestF","Output":"        time=12:00 level=INFO msg=\"dumped log line `+strings.Repeat("x", i%7)+`\"\n"}`)
	}
	lines = append(lines,
		`{"Action":"output","Package":"p","Test":"TestF","Output":"--- FAIL: TestF (50.00s)\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestF","Elapsed":50}`,
		`{"Action":"output","Package":"p","Test":"TestG/sub","Output":"    g_test.go:5: `+strings.Repeat("long ", 200)+`\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestG/sub","Elapsed":1}`,
		`{"Action":"fail","Package":"p","Test":"TestG","Elapsed":1}`,
		`{"Action":"pass","Package":"p","Test":"TestH","Elapsed":1}`,
		`{"Action":"fail","Package":"p","Elapsed":51}`,
	)
	var out strings.Builder
	if _, err := run(strings.NewReader(strings.Join(lines, "\n")), &out, 3); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	i := strings.Index(got, "the 3 slowest tests")
	if i < 0 {
		t.Fatalf("no slowest tests:\n%s", got)
	}
	tail := got[i:]
	want := "\nwhat the failed tests logged (their messages without the logs they dump; their whole output is above):\n" +
		"  p TestF:\n" +
		"    f_test.go:20: round 3: no holder within 39s\n" +
		"        detail of the message\n" +
		"    f_test.go:25: output pg (-source +output):\n" +
		"        \u00a0\u00a0map[string]string{\n" +
		"        -\u00a0\"a\": \"1-x\",\n" +
		"        +\u00a0\"a\": \"2-y\",\n" +
		"    f_test.go:30: poller logs:\n" +
		"  p TestG/sub:\n" +
		"    g_test.go:5: " + strings.Repeat("long ", 60)[:summaryWidth-1-len("g_test.go:5: ")] + "…\n"
	if !strings.HasSuffix(tail, want) {
		t.Errorf("output ends\n%s\nwant it to end\n%s", tail, want)
	}
}
