// Command testtimes reads the JSON events of `go test -json` on its input and
// prints what plain `go test` prints (each package's result line, and the
// output of the tests that failed), then the slowest top-level tests, then
// the messages the failed tests logged without the logs they dump: a failed
// test's output can end in a long dump of logs, and a reader who sees only
// the end still sees why it failed. A test that logs "waited D for a test
// slot" (tests/harness_test.go) is timed from the end of that wait, as go
// test times a parallel test from the end of its own. It exits with status
// 1 when a test or package failed or the stream ended without a result, so
// `go test -json | testtimes` can stand for `go test`.
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
	"regexp"
	"slices"
	"strings"
	"time"
)

// slotWait is the line a test logs once it has waited for a slot of its own
// package's bound (tests/harness_test.go).
var slotWait = regexp.MustCompile(`: waited (\S+) for a test slot$`)

// message is the first line of a message logged by t.Log or t.Error: four
// spaces, then the file and line. What a message goes on with, and the logs
// a test dumps, are indented further.
var message = regexp.MustCompile(`^    \S+\.go:\d+: `)

// Limits of the failures' summary: lines per test, lines a message goes on
// with (a diff's first lines), characters per line. The tail of a long
// output that a reader may see holds about a hundred lines.
const (
	summaryLines = 10
	summaryMore  = 3
	summaryWidth = 300
)

// dumped matches a line that goes on a message but belongs to a log the
// test dumps (a log record, a process's header), not to the message.
var dumped = regexp.MustCompile(`^\s+(time=|\{|--- )`)

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
	waited := map[key]time.Duration{}
	var times []timing
	var failures []failure
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
			if m := slotWait.FindStringSubmatch(strings.TrimRight(e.Output, "\n")); m != nil {
				if d, err := time.ParseDuration(m[1]); err == nil {
					waited[k] = d
				}
			}
		case e.Action == "pass" || e.Action == "skip" || e.Action == "fail":
			if e.Action == "fail" {
				failed = true
				fmt.Fprint(w, strings.Join(held[k], ""))
				if m := messages(held[k]); len(m) > 0 {
					failures = append(failures, failure{pkg: e.Package, test: e.Test, messages: m})
				}
			}
			delete(held, k)
			if !strings.Contains(e.Test, "/") && e.Action != "skip" {
				elapsed := time.Duration(e.Elapsed*float64(time.Second)) - waited[k]
				times = append(times, timing{pkg: e.Package, test: e.Test, elapsed: max(elapsed, 0), failed: e.Action == "fail"})
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
	printFailures(w, failures)
	return failed, nil
}

// failure is what one failed test logged: the first line of each message.
type failure struct {
	pkg, test string
	messages  []string
}

// messages picks the messages in a test's output, the wait for a slot left
// out: each one's first line and up to summaryMore lines it goes on with,
// not a dumped log's. It keeps at most summaryLines lines (the last ones,
// where a test that logs as it goes ends with its error), each cut to
// summaryWidth characters.
func messages(out []string) []string {
	var m []string
	more := 0 // lines the current message may still go on with
	for _, line := range out {
		line = strings.TrimRight(line, "\n")
		switch {
		case message.MatchString(line) && !slotWait.MatchString(line):
			more = summaryMore
			line = strings.TrimPrefix(line, "    ")
		case more > 0 && strings.HasPrefix(line, "        ") && !dumped.MatchString(line):
			more--
			line = strings.TrimPrefix(line, "    ")
		default:
			more = 0
			continue
		}
		if r := []rune(line); len(r) > summaryWidth {
			line = string(r[:summaryWidth-1]) + "…"
		}
		m = append(m, line)
	}
	return m[max(0, len(m)-summaryLines):]
}

func printFailures(w io.Writer, failures []failure) {
	if len(failures) == 0 {
		return
	}
	fmt.Fprintln(w, "\nwhat the failed tests logged (their messages without the logs they dump; their whole output is above):")
	for _, f := range failures {
		fmt.Fprintf(w, "  %s %s:\n", shortPkg(f.pkg), f.test)
		for _, m := range f.messages {
			fmt.Fprintf(w, "    %s\n", m)
		}
	}
}

func shortPkg(pkg string) string {
	return strings.TrimPrefix(pkg, "github.com/changes-worker/changes-worker/")
}

func printSlowest(w io.Writer, times []timing, n int) {
	slices.SortFunc(times, func(a, b timing) int { return cmp.Compare(b.elapsed, a.elapsed) })
	times = times[:min(n, len(times))]
	if len(times) == 0 {
		return
	}
	fmt.Fprintf(w, "\nthe %d slowest tests (a wait for a test slot left out):\n", len(times))
	for _, t := range times {
		mark := ""
		if t.failed {
			mark = " (failed)"
		}
		fmt.Fprintf(w, "  %8s  %s %s%s\n", t.elapsed.Round(100*time.Millisecond), shortPkg(t.pkg), t.test, mark)
	}
}
