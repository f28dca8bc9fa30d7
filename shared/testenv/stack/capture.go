package stack

import (
	"bytes"
	"strings"
	"sync"
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
