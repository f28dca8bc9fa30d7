package lease_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

// fakeKeeper is a lease store whose answers the test chooses. A nil func
// field answers with an error naming the call.
type fakeKeeper struct {
	mu       sync.Mutex
	calls    []string
	get      func() (*lease.State, error)
	acquire  func() (*lease.Lease, *lease.State, error)
	force    func() (*lease.Lease, error)
	renew    func(l *lease.Lease, pending int64) error
	release  func(ctx context.Context, l *lease.Lease) error
	released []*lease.Lease
}

var errUnexpected = errors.New("unexpected call")

func (f *fakeKeeper) record(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

func (f *fakeKeeper) count(call string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == call {
			n++
		}
	}
	return n
}

func (f *fakeKeeper) Get(context.Context, string) (*lease.State, error) {
	f.record("get")
	if f.get == nil {
		return nil, errUnexpected
	}
	return f.get()
}

func (f *fakeKeeper) Acquire(context.Context, string, string, string, time.Duration) (*lease.Lease, *lease.State, error) {
	f.record("acquire")
	if f.acquire == nil {
		return nil, nil, errUnexpected
	}
	return f.acquire()
}

func (f *fakeKeeper) ForceTake(context.Context, string, string, string, time.Duration) (*lease.Lease, error) {
	f.record("force")
	if f.force == nil {
		return nil, errUnexpected
	}
	return f.force()
}

func (f *fakeKeeper) Renew(_ context.Context, l *lease.Lease, pending int64) error {
	f.record("renew")
	if f.renew == nil {
		return errUnexpected
	}
	return f.renew(l, pending)
}

func (f *fakeKeeper) Release(ctx context.Context, l *lease.Lease) error {
	f.record("release")
	f.mu.Lock()
	f.released = append(f.released, l)
	f.mu.Unlock()
	if f.release == nil {
		return nil
	}
	return f.release(ctx, l)
}

const ttl = 9 * time.Second

func held(owner string, gen int64) *lease.State {
	return &lease.State{Exists: true, Owner: owner, Generation: gen, ExpiresAt: time.Now().Add(time.Hour)}
}

// heldThen answers n reads with a held lease, then with after.
func heldThen(n int, after *lease.State) func() (*lease.State, error) {
	var mu sync.Mutex
	return func() (*lease.State, error) {
		mu.Lock()
		defer mu.Unlock()
		if n > 0 {
			n--
			return held("poller-1", 4), nil
		}
		return after, nil
	}
}

// acquireAfter refuses the first n acquisitions (the lease is held by
// poller-1), then grants generation 5.
func acquireAfter(n int) func() (*lease.Lease, *lease.State, error) {
	var mu sync.Mutex
	return func() (*lease.Lease, *lease.State, error) {
		mu.Lock()
		defer mu.Unlock()
		if n > 0 {
			n--
			return nil, held("poller-1", 4), lease.ErrLeaseHeld
		}
		return &lease.Lease{JobID: "job", Owner: "me", Generation: 5, Kind: lease.Handoff, RenewedAt: time.Now(), TTL: ttl}, nil, nil
	}
}

func TestSessionWait(t *testing.T) {
	t.Parallel()
	errDown := errors.New("table unavailable")
	readFailsOnce := func() func() (*lease.State, error) {
		var mu sync.Mutex
		failed := false
		return func() (*lease.State, error) {
			mu.Lock()
			defer mu.Unlock()
			if !failed {
				failed = true
				return nil, errDown
			}
			return &lease.State{Exists: true, Owner: "poller-1", Generation: 4, Released: true}, nil
		}
	}
	tests := []struct {
		name         string
		keeper       *fakeKeeper
		wait         time.Duration
		cancel       bool
		wantErr      error
		wantGen      int64
		wantAcquires int
		wantWatched  bool
	}{
		{
			name:         "free lease",
			keeper:       &fakeKeeper{acquire: acquireAfter(0)},
			wait:         time.Second,
			wantGen:      5,
			wantAcquires: 1,
		},
		{
			name: "takes over when the holder releases",
			keeper: &fakeKeeper{acquire: acquireAfter(1),
				get: heldThen(3, &lease.State{Exists: true, Owner: "poller-1", Generation: 4, Released: true})},
			wait:         5 * time.Second,
			wantGen:      5,
			wantAcquires: 2,
			wantWatched:  true,
		},
		{
			name: "takes over when the lease expires",
			keeper: &fakeKeeper{acquire: acquireAfter(1),
				get: heldThen(2, &lease.State{Exists: true, Owner: "poller-1", Generation: 4, ExpiresAt: time.Now().Add(-time.Millisecond)})},
			wait:         5 * time.Second,
			wantGen:      5,
			wantAcquires: 2,
			wantWatched:  true,
		},
		{
			name:         "a failed read does not end the watch",
			keeper:       &fakeKeeper{acquire: acquireAfter(1), get: readFailsOnce()},
			wait:         5 * time.Second,
			wantGen:      5,
			wantAcquires: 2,
			wantWatched:  true,
		},
		{
			name:         "gives up when the holder keeps the lease",
			keeper:       &fakeKeeper{acquire: acquireAfter(1000), get: heldThen(1000, nil)},
			wait:         100 * time.Millisecond,
			wantErr:      lease.ErrLeaseHeld,
			wantAcquires: 1,
			wantWatched:  true,
		},
		{
			name:         "no wait: one attempt",
			keeper:       &fakeKeeper{acquire: acquireAfter(1000)},
			wait:         0,
			wantErr:      lease.ErrLeaseHeld,
			wantAcquires: 1,
			wantWatched:  true,
		},
		{
			name:         "cancelled",
			keeper:       &fakeKeeper{acquire: acquireAfter(1000), get: heldThen(1000, nil)},
			wait:         time.Hour,
			cancel:       true,
			wantErr:      context.Canceled,
			wantAcquires: 1,
			wantWatched:  true,
		},
		{
			name:         "acquire fails",
			keeper:       &fakeKeeper{},
			wait:         time.Second,
			wantErr:      errUnexpected,
			wantAcquires: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			s := lease.NewSession(tt.keeper, "job", "me", "host", ttl)
			s.Interval = 10 * time.Millisecond
			announced := 0
			s.Announce = func(_ context.Context, job, owner string) error {
				if job != "job" || owner != "me" {
					t.Errorf("announced %s/%s", job, owner)
				}
				announced++
				return nil
			}
			var watched []string
			s.Watching = func(h *lease.State) {
				watched = append(watched, h.Owner)
				if tt.cancel {
					cancel()
				}
			}
			start := time.Now()
			err := s.Wait(ctx, start.Add(tt.wait))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Wait = %v, want %v", err, tt.wantErr)
			}
			if got := tt.keeper.count("acquire"); got != tt.wantAcquires {
				t.Errorf("acquire called %d times, want %d", got, tt.wantAcquires)
			}
			if tt.wantWatched != (len(watched) > 0) {
				t.Errorf("watched the holder %d times, want %t", len(watched), tt.wantWatched)
			}
			for _, w := range watched {
				if w != "poller-1" {
					t.Errorf("watched holder %q, want poller-1", w)
				}
			}
			if tt.wantWatched && announced != 1 {
				// A third of the TTL is 3s: one announcement within these waits.
				t.Errorf("announced %d times, want 1", announced)
			}
			if tt.wantErr != nil {
				if s.Lease() != nil {
					t.Errorf("holds a lease after %v", err)
				}
				if errors.Is(err, lease.ErrLeaseHeld) {
					var he *lease.HeldError
					if !errors.As(err, &he) || he.Holder.Owner != "poller-1" {
						t.Errorf("Wait = %v, want the holder named", err)
					}
					if elapsed := time.Since(start); elapsed > tt.wait+time.Second {
						t.Errorf("gave up after %s, want about %s", elapsed, tt.wait)
					}
				}
				return
			}
			if l := s.Lease(); l == nil || l.Generation != tt.wantGen {
				t.Errorf("lease %+v, want generation %d", l, tt.wantGen)
			}
		})
	}
}

// TestSessionWaitTakesOverAtExpiry: a standby whose next look would come
// after the holder's lease expires looks as it expires, so a crashed holder
// is replaced within its TTL, not within its TTL plus the interval.
func TestSessionWaitTakesOverAtExpiry(t *testing.T) {
	t.Parallel()
	expires := time.Now().Add(150 * time.Millisecond)
	var mu sync.Mutex
	k := &fakeKeeper{
		get: func() (*lease.State, error) {
			return &lease.State{Exists: true, Owner: "poller-1", Generation: 4, ExpiresAt: expires}, nil
		},
		acquire: func() (*lease.Lease, *lease.State, error) {
			mu.Lock()
			defer mu.Unlock()
			if time.Now().Before(expires) {
				return nil, &lease.State{Exists: true, Owner: "poller-1", Generation: 4, ExpiresAt: expires}, lease.ErrLeaseHeld
			}
			return &lease.Lease{JobID: "job", Owner: "me", Generation: 5, Kind: lease.Failover, RenewedAt: time.Now(), TTL: ttl}, nil, nil
		},
	}
	s := lease.NewSession(k, "job", "me", "host", ttl)
	s.Interval = 10 * time.Second
	start := time.Now()
	if err := s.Wait(t.Context(), start.Add(time.Minute)); err != nil {
		t.Fatalf("Wait = %v", err)
	}
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("took over %s after the start, want at the expiry (150ms), well before the interval (10s)", elapsed)
	}
	if l := s.Lease(); l == nil || l.Generation != 5 {
		t.Errorf("lease %+v, want generation 5", l)
	}
}

func TestSessionForce(t *testing.T) {
	t.Parallel()
	k := &fakeKeeper{force: func() (*lease.Lease, error) {
		return &lease.Lease{Generation: 9, Kind: lease.Forced}, nil
	}}
	s := lease.NewSession(k, "job", "me", "host", ttl)
	if err := s.Force(t.Context()); err != nil {
		t.Fatal(err)
	}
	if l := s.Lease(); l == nil || l.Generation != 9 || l.Kind != lease.Forced {
		t.Errorf("lease %+v, want generation 9 forced", l)
	}
	if diff := cmp.Diff([]string{"force"}, k.calls); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}

// held session returns a session holding a lease renewed at the clock's
// time, whose renewals answer with renewErr (and move RenewedAt on success).
func heldSession(t *testing.T, renewErr error) (*lease.Session, *fakeKeeper, *clock.Manual) {
	t.Helper()
	c := clock.NewManual(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	k := &fakeKeeper{
		acquire: func() (*lease.Lease, *lease.State, error) {
			return &lease.Lease{Generation: 3, RenewedAt: c.Now(), TTL: ttl}, nil, nil
		},
		renew: func(l *lease.Lease, pending int64) error {
			if pending != 17 {
				t.Errorf("renewed with pending %d, want 17", pending)
			}
			if renewErr != nil {
				return renewErr
			}
			l.RenewedAt = c.Now()
			return nil
		},
	}
	s := lease.NewSession(k, "job", "me", "host", ttl)
	s.Clock = c.Now
	s.Pending = 17
	if err := s.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s, k, c
}

// TestSessionRenewals: KeepAlive renews once a third of the TTL passed;
// Fence renews once less than half the TTL is left, and refuses to let an
// action through when it cannot.
func TestSessionRenewals(t *testing.T) {
	t.Parallel()
	errDown := errors.New("table unavailable")
	keepAlive := func(s *lease.Session, ctx context.Context) error { return s.KeepAlive(ctx) }
	fence := func(s *lease.Session, ctx context.Context) error { return s.Fence(ctx) }
	tests := []struct {
		name       string
		call       func(*lease.Session, context.Context) error
		after      time.Duration
		renewErr   error
		wantRenews int
		wantErr    []error
	}{
		{name: "keep alive: fresh", call: keepAlive, after: ttl/3 - time.Millisecond},
		{name: "keep alive: a third of the TTL", call: keepAlive, after: ttl / 3, wantRenews: 1},
		{name: "keep alive: refused", call: keepAlive, after: ttl / 2, renewErr: lease.ErrLeaseLost, wantRenews: 1, wantErr: []error{lease.ErrLeaseLost}},
		{name: "keep alive: failed", call: keepAlive, after: ttl / 2, renewErr: errDown, wantRenews: 1, wantErr: []error{errDown}},
		{name: "fence: half the TTL left", call: fence, after: ttl / 2},
		{name: "fence: less than half the TTL left", call: fence, after: ttl/2 + time.Millisecond, wantRenews: 1},
		{name: "fence: expired by the local clock", call: fence, after: 2 * ttl, wantRenews: 1},
		{name: "fence: lease lost", call: fence, after: ttl/2 + time.Millisecond, renewErr: lease.ErrLeaseLost, wantRenews: 1,
			wantErr: []error{lease.ErrFenced, lease.ErrLeaseLost}},
		{name: "fence: renewal failed", call: fence, after: 3 * ttl / 4, renewErr: errDown, wantRenews: 1,
			wantErr: []error{lease.ErrFenced, errDown}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, k, c := heldSession(t, tt.renewErr)
			renewed := 0
			s.Renewed = func() { renewed++ }
			c.Advance(tt.after)
			err := tt.call(s, t.Context())
			if len(tt.wantErr) == 0 && err != nil {
				t.Fatalf("error %v, want nil", err)
			}
			for _, want := range tt.wantErr {
				if !errors.Is(err, want) {
					t.Errorf("error %v, want %v", err, want)
				}
			}
			if got := k.count("renew"); got != tt.wantRenews {
				t.Errorf("renewed %d times, want %d", got, tt.wantRenews)
			}
			if err != nil {
				if renewed != 0 {
					t.Errorf("Renewed hook called %d times after a failed renewal", renewed)
				}
				return
			}
			if renewed != tt.wantRenews {
				t.Errorf("Renewed hook called %d times, want %d", renewed, tt.wantRenews)
			}
			if tt.wantRenews > 0 && !s.Lease().RenewedAt.Equal(c.Now()) {
				t.Errorf("lease renewed at %s, want %s", s.Lease().RenewedAt, c.Now())
			}
			// Right after, neither renews again.
			if err := tt.call(s, t.Context()); err != nil || k.count("renew") != tt.wantRenews {
				t.Errorf("second call: %v, %d renewals, want nil and %d", err, k.count("renew"), tt.wantRenews)
			}
		})
	}
}

func TestSessionWithoutLease(t *testing.T) {
	t.Parallel()
	k := &fakeKeeper{}
	s := lease.NewSession(k, "job", "me", "host", ttl)
	if err := s.Fence(t.Context()); !errors.Is(err, lease.ErrFenced) {
		t.Errorf("Fence without a lease = %v, want ErrFenced", err)
	}
	if err := s.KeepAlive(t.Context()); err == nil || !strings.Contains(err.Error(), "no lease held") {
		t.Errorf("KeepAlive without a lease = %v, want an error", err)
	}
	if err := s.Release(t.Context()); err != nil {
		t.Errorf("Release without a lease = %v, want nil", err)
	}
	if len(k.calls) != 0 {
		t.Errorf("the store was called: %v", k.calls)
	}
}

func TestSessionRelease(t *testing.T) {
	t.Parallel()
	s, k, _ := heldSession(t, nil)
	l := s.Lease()
	k.release = func(ctx context.Context, _ *lease.Lease) error {
		if ctx.Err() != nil {
			t.Errorf("released on a done context: %v", ctx.Err())
		}
		if _, ok := ctx.Deadline(); !ok {
			t.Error("released without a deadline")
		}
		return nil
	}
	// The caller's context is done (the invocation's deadline passed):
	// the release still goes out.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Lease() != nil {
		t.Error("the session still holds the lease after Release")
	}
	if err := s.Release(ctx); err != nil {
		t.Errorf("second Release = %v", err)
	}
	if len(k.released) != 1 || k.released[0] != l {
		t.Errorf("released %v, want the held lease once", k.released)
	}
}

func TestSessionReleaseLost(t *testing.T) {
	t.Parallel()
	s, k, _ := heldSession(t, nil)
	k.release = func(context.Context, *lease.Lease) error { return lease.ErrLeaseLost }
	if err := s.Release(t.Context()); !errors.Is(err, lease.ErrLeaseLost) {
		t.Errorf("Release = %v, want ErrLeaseLost", err)
	}
}

// TestWaitLooksAtTheAnnouncedRelease: a standby whose holder announced when
// it will release the lease (State.ReleaseAt) reads the job item from that
// moment every few tens of milliseconds, and takes over within tens of
// milliseconds of the release rather than at its next regular look (one a
// second here); for a bounded time only, so that a holder late to release,
// or an item that announces nothing (written by an earlier release), is
// watched at the regular interval.
func TestWaitLooksAtTheAnnouncedRelease(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// announced and released are the holder's moments, after the
		// standby starts; announced 0: nothing announced.
		announced, released time.Duration
		// wantFrom and wantBy bound when the standby takes over.
		wantFrom, wantBy time.Duration
		maxReads         int
	}{
		{name: "released as announced", announced: 200 * time.Millisecond, released: 230 * time.Millisecond,
			wantFrom: 230 * time.Millisecond, wantBy: 330 * time.Millisecond, maxReads: 5},
		{name: "nothing announced", released: 230 * time.Millisecond,
			wantFrom: time.Second, wantBy: 1300 * time.Millisecond, maxReads: 1},
		{name: "announced long ago", announced: -1500 * time.Millisecond, released: 230 * time.Millisecond,
			wantFrom: time.Second, wantBy: 1300 * time.Millisecond, maxReads: 1},
		{name: "released well after the announced moment", announced: 100 * time.Millisecond, released: 1300 * time.Millisecond,
			wantFrom: 2 * time.Second, wantBy: 2300 * time.Millisecond, maxReads: 60},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			holder := func() *lease.State {
				st := held("poller-1", 4)
				if tt.announced != 0 {
					st.ReleaseAt = start.Add(tt.announced)
				}
				if time.Since(start) >= tt.released {
					st.Released = true
				}
				return st
			}
			var acquired time.Duration
			k := &fakeKeeper{
				get: func() (*lease.State, error) { return holder(), nil },
				acquire: func() (*lease.Lease, *lease.State, error) {
					if st := holder(); !st.Released {
						return nil, st, lease.ErrLeaseHeld
					}
					acquired = time.Since(start)
					return &lease.Lease{JobID: "job", Owner: "me", Generation: 5, Kind: lease.Handoff, RenewedAt: time.Now(), TTL: ttl}, nil, nil
				},
			}
			s := lease.NewSession(k, "job", "me", "host", ttl)
			s.Interval = time.Second
			if err := s.Wait(t.Context(), start.Add(10*time.Second)); err != nil {
				t.Fatalf("wait: %v", err)
			}
			if acquired < tt.wantFrom || acquired > tt.wantBy {
				t.Errorf("took over %s after the start, want between %s and %s", acquired.Round(time.Millisecond), tt.wantFrom, tt.wantBy)
			}
			if got := k.count("get"); got > tt.maxReads {
				t.Errorf("%d reads, want at most %d", got, tt.maxReads)
			}
		})
	}
}
