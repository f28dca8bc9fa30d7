package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// parallelStore marks t parallel and returns its context and a store on a
// fresh state table.
func parallelStore(t *testing.T) (context.Context, *lease.Store) {
	t.Helper()
	t.Parallel()
	return t.Context(), lease.New(testenv.StateTable(t))
}

func TestAcquireRenewCheckpointRelease(t *testing.T) {
	ctx, s := parallelStore(t)
	ttl := 10 * time.Second

	a, _, err := s.Acquire(ctx, "job", "a", "host-a", ttl)
	if err != nil {
		t.Fatalf("acquire a: %v", err)
	}
	if a.Generation != 1 || a.Kind != lease.First {
		t.Errorf("first acquire: generation %d kind %s, want 1 first", a.Generation, a.Kind)
	}
	_, held, err := s.Acquire(ctx, "job", "b", "host-b", ttl)
	if !errors.Is(err, lease.ErrLeaseHeld) {
		t.Fatalf("acquire b while a holds: %v, want ErrLeaseHeld", err)
	}
	if held.Owner != "a" {
		t.Errorf("held by %q, want a", held.Owner)
	}
	seq := json.RawMessage(`"12-g1AAAA"`)
	if err := s.Checkpoint(ctx, a, seq, 7); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	st, err := s.Get(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if string(st.Checkpoint) != string(seq) || st.Pending != 7 || st.Checkpoints != 1 {
		t.Errorf("stored checkpoint %s pending %d count %d", st.Checkpoint, st.Pending, st.Checkpoints)
	}
	if err := s.Release(ctx, a); err != nil {
		t.Fatalf("release: %v", err)
	}
	b, _, err := s.Acquire(ctx, "job", "b", "host-b", ttl)
	if err != nil {
		t.Fatalf("acquire b after release: %v", err)
	}
	if b.Generation != 2 || b.Kind != lease.Handoff || string(b.Checkpoint) != string(seq) {
		t.Errorf("handoff: generation %d kind %s checkpoint %s", b.Generation, b.Kind, b.Checkpoint)
	}
	// The old holder is fenced: every write is refused.
	if err := s.Checkpoint(ctx, a, json.RawMessage(`99`), 0); !errors.Is(err, lease.ErrLeaseLost) {
		t.Errorf("zombie checkpoint: %v, want ErrLeaseLost", err)
	}
	if err := s.Renew(ctx, a, 0); !errors.Is(err, lease.ErrLeaseLost) {
		t.Errorf("zombie renew: %v, want ErrLeaseLost", err)
	}
	if err := s.Release(ctx, a); !errors.Is(err, lease.ErrLeaseLost) {
		t.Errorf("zombie release: %v, want ErrLeaseLost", err)
	}
	st, _ = s.Get(ctx, "job")
	if string(st.Checkpoint) != string(seq) || st.Handoffs != 1 {
		t.Errorf("after zombie writes: checkpoint %s handoffs %d", st.Checkpoint, st.Handoffs)
	}
}

func TestExpiredLeaseIsTakenOver(t *testing.T) {
	ctx, s := parallelStore(t)
	clock := time.Now()
	s.Clock = func() time.Time { return clock }
	a, _, err := s.Acquire(ctx, "job", "a", "h", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(6 * time.Second)
	b, _, err := s.Acquire(ctx, "job", "b", "h", 5*time.Second)
	if err != nil {
		t.Fatalf("take over expired lease: %v", err)
	}
	if b.Kind != lease.Failover || b.Generation != a.Generation+1 {
		t.Errorf("takeover kind %s generation %d", b.Kind, b.Generation)
	}
	if err := s.Checkpoint(ctx, a, json.RawMessage(`5`), 0); !errors.Is(err, lease.ErrLeaseLost) {
		t.Errorf("expired holder's checkpoint: %v, want ErrLeaseLost", err)
	}
	st, _ := s.Get(ctx, "job")
	if st.Failovers != 1 {
		t.Errorf("failovers %d, want 1", st.Failovers)
	}
}

func TestForceTakeFencesHolder(t *testing.T) {
	ctx, s := parallelStore(t)
	a, _, err := s.Acquire(ctx, "job", "a", "h", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	op, err := s.ForceTake(ctx, "job", "operator", "h", time.Minute)
	if err != nil {
		t.Fatalf("force take: %v", err)
	}
	if err := s.SetCheckpoint(ctx, op, nil); err != nil {
		t.Fatalf("reset: %v", err)
	}
	if err := s.Checkpoint(ctx, a, json.RawMessage(`1`), 0); !errors.Is(err, lease.ErrLeaseLost) {
		t.Errorf("fenced holder's checkpoint: %v, want ErrLeaseLost", err)
	}
	st, _ := s.Get(ctx, "job")
	if st.Checkpoint != nil || st.Generation != 2 || st.ReplayEpoch != 2 {
		t.Errorf("after forced reset: checkpoint %s generation %d replay epoch %d; want none, 2, 2", st.Checkpoint, st.Generation, st.ReplayEpoch)
	}
	// The next holder learns the epoch; its own checkpoints keep it.
	if err := s.Release(ctx, op); err != nil {
		t.Fatal(err)
	}
	b, _, err := s.Acquire(ctx, "job", "b", "h", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(ctx, b, json.RawMessage(`9`), 0); err != nil {
		t.Fatal(err)
	}
	st, _ = s.Get(ctx, "job")
	if b.Previous.ReplayEpoch != 2 || st.ReplayEpoch != 2 {
		t.Errorf("replay epoch: %d at the takeover, %d after a checkpoint; want 2, 2", b.Previous.ReplayEpoch, st.ReplayEpoch)
	}
}

// TestOneWinnerPerRound races N acquirers for the same lease, round after
// round, through the real store against the DynamoDB endpoint in use: the
// engine's conditional write must let exactly one of them win every round.
// Each round starts from a released lease, so every racer's condition holds
// when it reads the item and only the engine's atomicity can refuse all but
// one. The racers of a round are released together by closing a channel.
func TestOneWinnerPerRound(t *testing.T) {
	ctx, s := parallelStore(t)
	const rounds = 300
	racers := []int{8, 12, 16}
	var races, wins int
	for round := range rounds {
		n := racers[round%len(racers)]
		start := make(chan struct{})
		var mu sync.Mutex
		var winners []*lease.Lease
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				owner := fmt.Sprintf("r%d-c%d", round, i)
				<-start
				l, _, err := s.Acquire(ctx, "job", owner, "h", time.Minute)
				switch {
				case err == nil:
					mu.Lock()
					winners = append(winners, l)
					mu.Unlock()
				case !errors.Is(err, lease.ErrLeaseHeld):
					t.Errorf("round %d: acquire %s: %v", round, owner, err)
				}
			})
		}
		close(start)
		wg.Wait()
		races += n
		wins += len(winners)
		if len(winners) != 1 {
			owners := make([]string, len(winners))
			for i, w := range winners {
				owners[i] = fmt.Sprintf("%s (generation %d)", w.Owner, w.Generation)
			}
			t.Fatalf("round %d of %d racers: %d winners %v, want exactly 1", round, n, len(winners), owners)
		}
		// The winner holds the next generation, and the item says so.
		st, err := s.Get(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		if w := winners[0]; st.Owner != w.Owner || st.Generation != w.Generation || w.Generation != int64(round+1) {
			t.Fatalf("round %d: item holds %s at generation %d, winner %s at %d; want generation %d",
				round, st.Owner, st.Generation, w.Owner, w.Generation, round+1)
		}
		if err := s.Release(ctx, winners[0]); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d rounds, %d acquire calls by 8, 12 and 16 racers, %d winners", rounds, races, wins)
}

// A holder that announces when it will release the lease (AcquireUntil)
// has that moment on the job item, where a standby reads it; a takeover
// that announces nothing, or announces another moment, replaces it, and a
// holder of a release that does not know the attribute leaves none.
func TestAcquireUntilAnnouncesTheRelease(t *testing.T) {
	ctx, s := parallelStore(t)
	ttl := time.Minute
	at := time.UnixMilli(time.Now().Add(90 * time.Second).UnixMilli())

	a, _, err := s.AcquireUntil(ctx, "job", "a", "h", ttl, at)
	if err != nil {
		t.Fatalf("acquire a: %v", err)
	}
	_, held, err := s.Acquire(ctx, "job", "b", "h", ttl)
	if !errors.Is(err, lease.ErrLeaseHeld) || !held.ReleaseAt.Equal(at) {
		t.Fatalf("acquire b while a holds: %v, holder's release at %v, want ErrLeaseHeld and %v", err, held.ReleaseAt, at)
	}
	if err := s.Renew(ctx, a, 0); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if st, _ := s.Get(ctx, "job"); !st.ReleaseAt.Equal(at) {
		t.Errorf("after a renewal: release at %v, want %v", st.ReleaseAt, at)
	}
	if err := s.Release(ctx, a); err != nil {
		t.Fatalf("release: %v", err)
	}
	b, _, err := s.Acquire(ctx, "job", "b", "h", ttl)
	if err != nil {
		t.Fatalf("acquire b: %v", err)
	}
	if st, _ := s.Get(ctx, "job"); !st.ReleaseAt.IsZero() {
		t.Errorf("taken by a holder that announced nothing: release at %v, want none", st.ReleaseAt)
	}
	if err := s.Release(ctx, b); err != nil {
		t.Fatalf("release b: %v", err)
	}
	later := at.Add(time.Minute)
	if _, _, err := s.AcquireUntil(ctx, "job", "c", "h", ttl, later); err != nil {
		t.Fatalf("acquire c: %v", err)
	}
	if st, _ := s.Get(ctx, "job"); !st.ReleaseAt.Equal(later) {
		t.Errorf("taken by c: release at %v, want %v", st.ReleaseAt, later)
	}
}

// writeWatcher passes calls to a state table and reads the item after every
// write that succeeds.
type writeWatcher struct {
	lease.DynamoDB
	store *lease.Store // reads for the watcher, not through it
	mu    sync.Mutex
	seen  []*lease.State
}

func (w *writeWatcher) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	out, err := w.DynamoDB.UpdateItem(ctx, in, optFns...)
	if err == nil {
		st, gerr := w.store.Get(ctx, "job")
		if gerr != nil {
			return nil, gerr
		}
		w.mu.Lock()
		w.seen = append(w.seen, st)
		w.mu.Unlock()
	}
	return out, err
}

// watched returns what the watcher saw since the last call.
func (w *writeWatcher) watched() []*lease.State {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := w.seen
	w.seen = nil
	return seen
}

// TestTakeoverIsOneWrite: each takeover (first, handoff, failover, forced)
// is one write that records its kind and counts it, so that nobody reading
// the item (status, a standby) sees the lease taken without how, and a
// count is never missed.
func TestTakeoverIsOneWrite(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, table := testenv.StateTable(t)
	w := &writeWatcher{DynamoDB: db, store: lease.New(db, table)}
	s := lease.New(w, table)
	clock := time.Now()
	s.Clock = func() time.Time { return clock }
	check := func(step string, l *lease.Lease, want lease.Takeover, handoffs, failovers int64) {
		t.Helper()
		if l.Kind != want {
			t.Errorf("%s: lease kind %s, want %s", step, l.Kind, want)
		}
		seen := w.watched()
		if len(seen) != 1 {
			t.Errorf("%s: %d writes took effect, want 1", step, len(seen))
		}
		for i, st := range seen {
			if st.Owner != l.Owner || st.TakeoverKind != want || st.Handoffs != handoffs || st.Failovers != failovers {
				t.Errorf("%s: after write %d the item reads owner %s, takeover %s, handoffs %d, failovers %d; want %s, %s, %d, %d",
					step, i+1, st.Owner, st.TakeoverKind, st.Handoffs, st.Failovers, l.Owner, want, handoffs, failovers)
			}
		}
	}
	a, _, err := s.Acquire(ctx, "job", "a", "h", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	check("the first take", a, lease.First, 0, 0)
	if err := s.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	w.watched()
	b, _, err := s.Acquire(ctx, "job", "b", "h", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	check("a handoff", b, lease.Handoff, 1, 0)
	clock = clock.Add(6 * time.Second)
	c, _, err := s.Acquire(ctx, "job", "c", "h", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	check("a failover", c, lease.Failover, 1, 1)
	if _, _, err := s.Acquire(ctx, "job", "d", "h", 5*time.Second); !errors.Is(err, lease.ErrLeaseHeld) {
		t.Fatalf("take of a held lease: %v, want ErrLeaseHeld", err)
	}
	if seen := w.watched(); len(seen) != 0 {
		t.Errorf("the take of a held lease changed the item %d times", len(seen))
	}
	e, err := s.ForceTake(ctx, "job", "e", "h", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	check("a forced take", e, lease.Forced, 1, 1)
}
