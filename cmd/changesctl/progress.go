package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progress reports how far a long operation got, on stderr. On a terminal it
// redraws one line (a bar when the total is known) at most ten times a
// second; elsewhere (a pipe, a log file, a test) it prints a plain line
// whenever another tenth of the total is done, or every lineEvery, so logs
// stay readable. Safe for concurrent use.
type progress struct {
	w     io.Writer
	tty   bool
	label string
	unit  string

	mu        sync.Mutex
	start     time.Time
	last      time.Time
	lastTenth int64
	done      int64
	total     int64
	printed   int64 // done at the last plain line, -1 before the first
	finished  bool
}

// lineEvery is how often a non-terminal progress prints a line.
const lineEvery = 2 * time.Second

func newProgress(w io.Writer, label, unit string) *progress {
	return &progress{w: raw(w), tty: isTerminal(w), label: label, unit: unit, start: time.Now(), lastTenth: -1, printed: -1}
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := raw(w).(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Set records done of total (total 0: unknown) and redraws when due.
func (p *progress) Set(done, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished {
		return
	}
	p.done, p.total = done, total
	now := time.Now()
	if p.tty {
		if now.Sub(p.last) >= 100*time.Millisecond || (total > 0 && done >= total) {
			p.last = now
			fmt.Fprintf(p.w, "\r\033[K%s", p.line(now))
		}
		return
	}
	tenth := int64(-1)
	if total > 0 {
		tenth = done * 10 / total
	}
	if tenth > p.lastTenth || now.Sub(p.last) >= lineEvery {
		p.lastTenth = max(p.lastTenth, tenth)
		p.last = now
		p.printed = done
		fmt.Fprintln(p.w, p.line(now))
	}
}

// Finish prints the final state and ends the line.
func (p *progress) Finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished {
		return
	}
	p.finished = true
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s\n", p.line(time.Now()))
		return
	}
	if p.printed != p.done {
		fmt.Fprintln(p.w, p.line(time.Now()))
	}
}

func (p *progress) line(now time.Time) string {
	elapsed := now.Sub(p.start)
	rate := ""
	if s := elapsed.Seconds(); s >= 0.5 {
		rate = fmt.Sprintf(", %.0f %s/s", float64(p.done)/s, p.unit)
	}
	if p.total <= 0 {
		return fmt.Sprintf("%s: %d %s%s, %s", p.label, p.done, p.unit, rate, elapsed.Round(100*time.Millisecond))
	}
	frac := min(float64(p.done)/float64(p.total), 1)
	s := fmt.Sprintf("%s: %d/%d %s (%d%%)%s, %s", p.label, p.done, p.total, p.unit, int(frac*100), rate, elapsed.Round(100*time.Millisecond))
	if p.tty {
		const width = 30
		n := int(frac * width)
		s = fmt.Sprintf("%s [%s%s] %s", p.label, strings.Repeat("#", n), strings.Repeat(".", width-n), s[len(p.label)+2:])
	}
	return s
}
