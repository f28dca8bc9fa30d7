// Command bench measures the pipeline on the local services and prints its
// figures; they are also written to bench-results.json, with the commit and
// the machine they were measured on. Run it with `make bench` (which starts
// the services and writes docs/benchmarks.md from the results). Figures are
// ratios measured side by side in one run, and medians, because a shared
// machine is noisy.
//
// With -report FILE it measures nothing: it prints the benchmarks page for
// the results in FILE.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// benchmark is one measurement; it records its figures in r.
type benchmark struct {
	name string
	run  func(ctx context.Context, r *results) error
}

// benchmarks lists every measurement, in the order they run. Each lives in
// its own file.
var benchmarks []benchmark

func register(name string, run func(ctx context.Context, r *results) error) {
	benchmarks = append(benchmarks, benchmark{name: name, run: run})
}

// results collects figures by benchmark and name, with when, where and at
// which commit they were measured.
type results struct {
	mu      sync.Mutex // add, for a benchmark whose parts run side by side
	current string
	Figures map[string]map[string]any `json:"figures"`
	Started time.Time                 `json:"started"`
	Machine map[string]any            `json:"machine"`
	// Commit is the git commit measured; Dirty says the worktree had
	// uncommitted changes to tracked files.
	Commit string `json:"commit"`
	Dirty  bool   `json:"dirty,omitempty"`
	// Note, when set, is printed under the page's heading; a run sets none.
	Note string `json:"note,omitempty"`
	// Runs says, by benchmark, which run measured its figures, when a
	// results file holds figures of several runs (-merge). A benchmark
	// without one was measured by the run the fields above describe.
	Runs map[string]run `json:"runs,omitempty"`
}

// run is when and at which commit one run measured, and how loaded the
// machine was as it began.
type run struct {
	Started time.Time `json:"started"`
	Commit  string    `json:"commit"`
	Dirty   bool      `json:"dirty,omitempty"`
	Load    string    `json:"load,omitempty"`
	Note    string    `json:"note,omitempty"`
}

// runOf returns the run that measured benchmark name.
func (r *results) runOf(name string) run {
	if x, ok := r.Runs[name]; ok {
		return x
	}
	return run{Started: r.Started, Commit: r.Commit, Dirty: r.Dirty, Note: r.Note}
}

// merge returns older with the figures of the benchmarks r measured
// replaced by r's, each recorded with r's run; r's machine is the file's.
// A benchmark that failed in r keeps its figures from older: failed names
// them.
func (r *results) merge(older *results) (m *results, failed []string) {
	m = &results{Figures: map[string]map[string]any{}, Runs: map[string]run{},
		Started: r.Started, Machine: r.Machine, Commit: r.Commit, Dirty: r.Dirty}
	for name, figs := range older.Figures {
		m.Figures[name], m.Runs[name] = figs, older.runOf(name)
	}
	for name, figs := range r.Figures {
		if _, ok := figs["error"]; ok {
			failed = append(failed, name)
			continue
		}
		m.Figures[name], m.Runs[name] = figs, r.runOf(name)
	}
	slices.Sort(failed)
	return m, failed
}

// add records one figure of the running benchmark and prints it.
func (r *results) add(name string, value any, note string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Figures[r.current] == nil {
		r.Figures[r.current] = map[string]any{}
	}
	r.Figures[r.current][name] = value
	if note != "" {
		note = "  (" + note + ")"
	}
	fmt.Printf("  %-44s %v%s\n", name, format(value), note)
}

func format(v any) any {
	if f, ok := v.(float64); ok {
		return fmt.Sprintf("%.3f", f)
	}
	return v
}

func main() {
	only := flag.String("only", "", "comma-separated benchmark names to run (default: all)")
	out := flag.String("out", "bench-results.json", "where to write the figures")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	report := flag.String("report", "", "print the benchmarks page (markdown) for the results in this file, measuring nothing")
	mergeInto := flag.String("merge", "", "also write the figures into this results file, replacing those of the benchmarks run and keeping the others with their runs")
	flag.Parse()
	if *standInFlag {
		if err := serveStandIn(); err != nil {
			fmt.Fprintln(os.Stderr, "bench: stand-in sqs:", err)
			os.Exit(1)
		}
		return
	}
	if *report != "" {
		r, err := readResults(*report)
		if err == nil {
			err = writeReport(os.Stdout, r, *report)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "bench: start cpu profile:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	r := &results{Figures: map[string]map[string]any{}, Started: time.Now().UTC(), Machine: machine()}
	r.Commit, r.Dirty = commit(ctx)
	r.Runs = map[string]run{}
	failed := 0
	for _, b := range benchmarks {
		if *only != "" && !contains(strings.Split(*only, ","), b.name) {
			continue
		}
		fmt.Printf("== %s\n", b.name)
		r.current = b.name
		r.Runs[b.name] = run{Started: time.Now().UTC(), Commit: r.Commit, Dirty: r.Dirty, Load: loadAverage()}
		start := time.Now()
		if err := b.run(ctx, r); err != nil {
			fmt.Printf("  FAILED: %v\n", err)
			r.add("error", err.Error(), "")
			failed++
		}
		fmt.Printf("  (%s)\n", time.Since(start).Round(time.Second))
	}
	b, _ := json.MarshalIndent(r, "", "  ")
	if err := os.WriteFile(*out, b, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "bench: write results:", err)
		os.Exit(1)
	}
	fmt.Printf("figures written to %s\n", *out)
	if *mergeInto != "" {
		if err := mergeResults(r, *mergeInto); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		fmt.Printf("figures merged into %s\n", *mergeInto)
	}
	if failed > 0 {
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// median of a sample (which it sorts).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// percentile p (0-100) of a sample (which it sorts), nearest rank.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	i := int(p/100*float64(len(xs))+0.5) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(xs) {
		i = len(xs) - 1
	}
	return xs[i]
}

func numCPU() int { return runtime.NumCPU() }

// machine describes the machine the figures are measured on.
func machine() map[string]any {
	host, _ := os.Hostname()
	m := map[string]any{"host": host, "cpus": numCPU(), "os": runtime.GOOS + "/" + runtime.GOARCH, "go": runtime.Version()}
	if v := procField("/proc/cpuinfo", "model name"); v != "" {
		m["cpu"] = v
	}
	if v := procField("/proc/meminfo", "MemTotal"); v != "" {
		if kb, err := strconv.ParseFloat(strings.TrimSuffix(v, " kB"), 64); err == nil {
			m["memory"] = fmt.Sprintf("%.0f GiB", kb/(1<<20))
		}
	}
	return m
}

// procField returns the value of the first "name: value" line of a /proc
// file, or "" when there is none.
func procField(path, name string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// commit returns the git commit of the working directory and whether
// tracked files differ from it; "" when git cannot tell.
func commit(ctx context.Context) (string, bool) {
	out, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "", false
	}
	status, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no").Output()
	return strings.TrimSpace(string(out)), err == nil && len(strings.TrimSpace(string(status))) > 0
}

// mergeResults writes r's figures into the results file path (see
// results.merge); a missing file is created.
func mergeResults(r *results, path string) error {
	older := &results{}
	if _, err := os.Stat(path); err == nil {
		if older, err = readResults(path); err != nil {
			return err
		}
	}
	m, failed := r.merge(older)
	if len(failed) > 0 {
		fmt.Printf("not merged into %s, failed: %s\n", path, strings.Join(failed, ", "))
	}
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}
