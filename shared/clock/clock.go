// Package clock is the pipeline's one source of time: a Clock that tests and
// the fault tests' skewed processes can replace, and a wait that ends early
// when its context does.
package clock

import (
	"context"
	"time"
)

// Clock tells the current time. The zero value is the system clock, so a
// struct field of this type needs no initialisation; tests set it to a fake.
type Clock func() time.Time

// Now returns the clock's time, or time.Now for the zero Clock.
func (c Clock) Now() time.Time {
	if c == nil {
		return time.Now()
	}
	return c()
}

// Since is Now().Sub(t) on this clock.
func (c Clock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// Sleep waits for d or until ctx is done, whichever comes first, and returns
// ctx.Err() in the second case. A d of zero or less returns at once (nil,
// unless ctx is already done).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Every calls fn every interval (real time), the first time one interval
// from now, until ctx ends or fn returns false. fn is never called once
// ctx has ended.
func Every(ctx context.Context, interval time.Duration, fn func() bool) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil || !fn() {
			return
		}
	}
}
