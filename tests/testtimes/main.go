// Command testtimes reads the JSON events of `go test -json` on its input and
// prints what plain `go test` prints (each package's result line, and the
// output of the tests that failed), then the slowest top-level tests. It
// exits with status 1 when a test or package failed or the stream ended
// without a result, so `go test -json | testtimes` can stand for `go test`.
//
//	go test -json ./... | go run ./tests/testtimes -n 10
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// timing is how long one top-level test took.
type timing struct {
	pkg, test string
	elapsed   time.Duration
	failed    bool
}

func main() {
	n := flag.Int("n", 10, "how many of the slowest tests to print")
	flag.Parse()
	failed, err := run(os.Stdin, os.Stdout, *n)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testtimes:", err)
		os.Exit(1)
	}
	if failed {
		os.Exit(1)
	}
}

// run copies r's events to w as plain `go test` would print them, then the
// n slowest top-level tests; it reports whether anything failed.
func run(r io.Reader, w io.Writer, n int) (failed bool, err error) {
	type key struct{ pkg, test string }
	held := map[key][]string{} // output of tests still running
	var times []timing
	results := map[string]bool{} // packages with a result
	in := bufio.NewScanner(r)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	for in.Scan() {
		line := in.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			// Not an event (a build error printed by go test itself).
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		k := key{e.Package, e.Test}
		switch {
		case e.Test == "" && e.Action == "output":
			out := e.Output
			if strings.HasPrefix(out, "=== ") || strings.HasPrefix(out, "--- ") || out == "PASS\n" {
				continue
			}
			fmt.Fprint(w, out)
		case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			results[e.Package] = true
			if e.Action == "fail" {
				failed = true
			}
		case e.Action == "output":
			held[k] = append(held[k], e.Output)
		case e.Action == "pass" || e.Action == "skip" || e.Action == "fail":
			if e.Action == "fail" {
				failed = true
				fmt.Fprint(w, strings.Join(held[k], ""))
			}
			delete(held, k)
			if !strings.Contains(e.Test, "/") && e.Action != "skip" {
				times = append(times, timing{pkg: e.Package, test: e.Test, elapsed: time.Duration(e.Elapsed * float64(time.Second)), failed: e.Action == "fail"})
			}
		}
	}
	if err := in.Err(); err != nil {
		return true, fmt.Errorf("read go test's events: %w", err)
	}
	// A test still running when the stream ended (a panic, a timeout):
	// its output is all there is to see.
	for k, out := range held {
		if strings.Contains(k.test, "/") {
			continue
		}
		failed = true
		fmt.Fprintf(w, "--- %s (%s) had no result:\n%s", k.test, k.pkg, strings.Join(out, ""))
	}
	if len(results) == 0 {
		return true, fmt.Errorf("no package result in the input")
	}
	printSlowest(w, times, n)
	return failed, nil
}

func printSlowest(w io.Writer, times []timing, n int) {
	slices.SortFunc(times, func(a, b timing) int { return cmp.Compare(b.elapsed, a.elapsed) })
	times = times[:min(n, len(times))]
	if len(times) == 0 {
		return
	}
	fmt.Fprintf(w, "\nthe %d slowest tests:\n", len(times))
	for _, t := range times {
		mark := ""
		if t.failed {
			mark = " (failed)"
		}
		fmt.Fprintf(w, "  %8s  %s %s%s\n", t.elapsed.Round(100*time.Millisecond), strings.TrimPrefix(t.pkg, "github.com/changes-worker/changes-worker/"), t.test, mark)
	}
}
