package clock

import (
	"testing"
	"time"
)

func TestManual(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	m := NewManual(start)
	var c Clock = m.Now
	if got := c.Now(); !got.Equal(start) {
		t.Errorf("Now = %v, want %v", got, start)
	}
	m.Advance(1500 * time.Millisecond)
	if got := c.Since(start); got != 1500*time.Millisecond {
		t.Errorf("Since the start after Advance(1.5s) = %v", got)
	}
}
