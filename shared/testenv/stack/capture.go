package stack

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// captureLimit bounds what a Capture keeps: past it, the oldest half goes.
const captureLimit = 16 << 20

// Capture keeps what a pipeline writes (log lines, metric records), the
// most recent captureLimit bytes of it. It is safe for concurrent use.
type Capture struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (c *Capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.b.Len()+len(p) > captureLimit {
		old := c.b.Bytes()[c.b.Len()/2:]
		if i := bytes.IndexByte(old, '\n'); i >= 0 {
			old = old[i+1:]
		}
		kept := bytes.Clone(old)
		c.b.Reset()
		c.b.Write(kept)
	}
	return c.b.Write(p)
}

// String returns everything kept.
func (c *Capture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.String()
}

// Tail returns the last n lines kept.
func (c *Capture) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(c.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WaitFor waits up to within for the capture to hold s, and fails t if it
// does not.
func (c *Capture) WaitFor(t testing.TB, s string, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); !strings.Contains(c.String(), s); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the pipeline log within %s", s, within)
		}
	}
}

// CheckOneStream fails t unless the pipeline log shows exactly one stream
// opened and no stream closed, no fallback to pages and no lease released:
// every change came through that one stream.
func (c *Capture) CheckOneStream(t testing.TB) {
	t.Helper()
	logs := c.String()
	if n := strings.Count(logs, `msg="stream opened"`); n != 1 {
		t.Errorf("%d streams opened, want 1", n)
	}
	for _, bad := range []string{`msg="stream closed"`, `msg="stream ended; catching up with pages"`, `msg="lease released"`} {
		if strings.Contains(logs, bad) {
			t.Errorf("the log has %s before the output caught up: the changes did not all come through one stream", bad)
		}
	}
}
