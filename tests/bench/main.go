// Command bench measures the pipeline on the local services and prints its
// figures; they are also written to bench-results.json. Run it with
// `make bench` (which starts the services). Figures are ratios measured side
// by side in one run, and medians, because a shared machine is noisy.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
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

// results collects figures by benchmark and name.
type results struct {
	current string
	Figures map[string]map[string]any `json:"figures"`
	Started time.Time                 `json:"started"`
	Machine map[string]any            `json:"machine"`
}

// add records one figure of the running benchmark and prints it.
func (r *results) add(name string, value any, note string) {
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
	flag.Parse()
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
	host, _ := os.Hostname()
	r := &results{Figures: map[string]map[string]any{}, Started: time.Now().UTC(), Machine: map[string]any{"host": host, "cpus": numCPU()}}
	failed := 0
	for _, b := range benchmarks {
		if *only != "" && !contains(strings.Split(*only, ","), b.name) {
			continue
		}
		fmt.Printf("== %s\n", b.name)
		r.current = b.name
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
