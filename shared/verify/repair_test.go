package verify

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

// repairKeeper is a free lease whose renewals answer with renew.
type repairKeeper struct {
	mu       sync.Mutex
	now      func() time.Time
	renew    func(n int) error
	renewals int
	released int
}

func (k *repairKeeper) Get(context.Context, string) (*lease.State, error) {
	return &lease.State{}, nil
}

func (k *repairKeeper) Acquire(_ context.Context, job, owner, _ string, ttl time.Duration) (*lease.Lease, *lease.State, error) {
	return &lease.Lease{JobID: job, Owner: owner, Generation: 3, Kind: lease.Handoff, RenewedAt: k.now(), TTL: ttl,
		Previous: lease.State{Pending: 12}}, nil, nil
}

func (k *repairKeeper) ForceTake(context.Context, string, string, string, time.Duration) (*lease.Lease, error) {
	return nil, errors.New("force take: not expected")
}

func (k *repairKeeper) Renew(_ context.Context, l *lease.Lease, pending int64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.renewals++
	if pending != 12 {
		return fmt.Errorf("renewed with pending %d, want the poller's 12", pending)
	}
	if err := k.renew(k.renewals); err != nil {
		return err
	}
	l.RenewedAt = k.now()
	return nil
}

func (k *repairKeeper) Release(context.Context, *lease.Lease) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.released++
	return nil
}

// slowSender takes a whole TTL of the clock per request: the fence must
// renew the lease before every request.
type slowSender struct {
	advance func()
	sent    []string
}

func (s *slowSender) Send(_ context.Context, _ []fanout.Target, changes []*change.Envelope, fence fanout.Fence) (fanout.Stats, error) {
	for start := 0; start < len(changes); start += 10 {
		if err := fence(); err != nil {
			return fanout.Stats{}, err
		}
		for _, c := range changes[start:min(start+10, len(changes))] {
			s.sent = append(s.sent, c.DocID)
		}
		s.advance()
	}
	return fanout.Stats{Messages: len(changes)}, nil
}

func TestRepairFencesEverySend(t *testing.T) {
	t.Parallel()
	const ttl = 10 * time.Second
	tests := []struct {
		name         string
		renew        func(n int) error
		wantSent     int
		wantRenewals int
		wantErr      error
	}{
		{
			name:         "renews before each request",
			renew:        func(int) error { return nil },
			wantSent:     60,
			wantRenewals: 5, // before every request but the first; the keep-alive before the second chunk serves its one request
		},
		{
			name: "stops at a lost lease",
			renew: func(n int) error {
				if n == 3 {
					return lease.ErrLeaseLost
				}
				return nil
			},
			wantSent:     30,
			wantRenewals: 3,
			wantErr:      lease.ErrLeaseLost,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			at := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
			now := func() time.Time { mu.Lock(); defer mu.Unlock(); return at }
			k := &repairKeeper{now: now, renew: tt.renew}
			snd := &slowSender{advance: func() { mu.Lock(); defer mu.Unlock(); at = at.Add(ttl) }}
			var ids []string
			docs := map[string]string{}
			for i := range 60 {
				id := fmt.Sprintf("d%02d", i)
				ids = append(ids, id)
				docs[id] = "1-a"
			}
			r := &Repairer{
				Source: &fakeSource{docs: docs, seq: "9"}, Leases: k, Sender: snd, Clock: now,
				Job:    &config.Job{ID: "orders", Lease: config.Lease{TTL: config.Duration(ttl)}},
				Target: fanout.Target{Output: "pg"}, Owner: "verify",
			}
			_, err := r.Repair(t.Context(), ids)
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("Repair = %v, want %v", err, tt.wantErr)
			}
			if len(snd.sent) != tt.wantSent {
				t.Errorf("sent %d changes, want %d", len(snd.sent), tt.wantSent)
			}
			if k.renewals != tt.wantRenewals {
				t.Errorf("%d renewals, want %d", k.renewals, tt.wantRenewals)
			}
			if k.released != 1 {
				t.Errorf("released %d times, want 1", k.released)
			}
		})
	}
}
