package clock

import (
	"sync"
	"time"
)

// Manual is a clock that moves only when told to, for tests: its Now
// method is a Clock. Safe for concurrent use.
type Manual struct {
	mu sync.Mutex
	t  time.Time
}

// NewManual returns a clock that reads t until advanced.
func NewManual(t time.Time) *Manual { return &Manual{t: t} }

// Now returns the clock's time.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.t
}

// Advance moves the clock forward by d.
func (m *Manual) Advance(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.t = m.t.Add(d)
}
