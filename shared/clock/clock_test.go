package clock

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestClockNow(t *testing.T) {
	t.Parallel()
	fixed := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	if got := Clock(func() time.Time { return fixed }).Now(); !got.Equal(fixed) {
		t.Errorf("fake clock Now() = %v, want %v", got, fixed)
	}
	var zero Clock
	if got := zero.Now(); time.Since(got) > time.Minute || time.Since(got) < 0 {
		t.Errorf("zero clock Now() = %v, want about time.Now()", got)
	}
	if got := Clock(func() time.Time { return fixed }).Since(fixed.Add(-time.Second)); got != time.Second {
		t.Errorf("Since = %v, want 1s", got)
	}
}

func TestSleep(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		d       time.Duration
		cancel  bool
		wantErr error
		maxWait time.Duration
	}{
		{name: "elapses", d: 20 * time.Millisecond, maxWait: time.Second},
		{name: "zero", d: 0, maxWait: 10 * time.Millisecond},
		{name: "cancelled", d: time.Hour, cancel: true, wantErr: context.Canceled, maxWait: time.Second},
		{name: "cancelled zero", d: 0, cancel: true, wantErr: context.Canceled, maxWait: 10 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancel {
				cancel()
			}
			start := time.Now()
			err := Sleep(ctx, tt.d)
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("Sleep err = %v, want %v", err, tt.wantErr)
			}
			if took := time.Since(start); took > tt.maxWait || (tt.wantErr == nil && took < tt.d) {
				t.Errorf("Sleep(%v) took %v", tt.d, took)
			}
		})
	}
}

func TestEvery(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		stopAfter int // fn returns false on this call; 0: never
		cancelAt  int // fn ends the context on this call; 0: never
		wantCalls int
	}{
		{name: "until fn returns false", stopAfter: 3, wantCalls: 3},
		{name: "until ctx ends, never after", cancelAt: 2, wantCalls: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			calls := 0
			Every(ctx, time.Millisecond, func() bool {
				calls++
				if calls == tt.cancelAt {
					cancel()
					time.Sleep(5 * time.Millisecond) // the next tick is due too
				}
				return calls != tt.stopAfter
			})
			if calls != tt.wantCalls {
				t.Errorf("%d calls, want %d", calls, tt.wantCalls)
			}
		})
	}
}
