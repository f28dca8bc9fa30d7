package tests

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// rankedSlots is a semaphore whose waiters are served by rank, the lowest
// first (in the order they came among equals), rather than in the order
// they came.
type rankedSlots struct {
	mu      sync.Mutex
	free    int
	waiting []*slotWaiter
	seq     int
}

type slotWaiter struct {
	rank, seq int
	ready     chan struct{}
}

func newRankedSlots(n int) *rankedSlots { return &rankedSlots{free: n} }

// take waits for a slot and returns the function that gives it back.
func (s *rankedSlots) take(rank int) (release func()) {
	s.mu.Lock()
	if s.free > 0 && len(s.waiting) == 0 {
		s.free--
		s.mu.Unlock()
		return s.give
	}
	w := &slotWaiter{rank: rank, seq: s.seq, ready: make(chan struct{})}
	s.seq++
	s.waiting = append(s.waiting, w)
	s.mu.Unlock()
	<-w.ready
	return s.give
}

// give hands a slot to the first waiter by rank, or frees it.
func (s *rankedSlots) give() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waiting) == 0 {
		s.free++
		return
	}
	i := 0
	for j, w := range s.waiting {
		if w.rank < s.waiting[i].rank || (w.rank == s.waiting[i].rank && w.seq < s.waiting[i].seq) {
			i = j
		}
	}
	w := s.waiting[i]
	s.waiting = slices.Delete(s.waiting, i, i+1)
	close(w.ready)
}

// waiters is how many wait for a slot.
func (s *rankedSlots) waiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}

func TestRankedSlots(t *testing.T) {
	t.Parallel()
	s := newRankedSlots(1)
	release := s.take(5)
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i, rank := range []int{3, 1, 2, 1} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := s.take(rank)
			mu.Lock()
			order = append(order, rank*10+i)
			mu.Unlock()
			r()
		}()
		for s.waiters() < i+1 {
			time.Sleep(time.Millisecond)
		}
	}
	release()
	wg.Wait()
	if want := []int{11, 13, 22, 30}; !slices.Equal(order, want) {
		t.Errorf("served rank*10+arrival %v, want %v: by rank, then arrival", order, want)
	}
	// A slot given back with nobody waiting is free again.
	two := newRankedSlots(2)
	a, _ := two.take(0), two.take(0)
	a()
	if two.free != 1 {
		t.Errorf("%d slots free after one of two given back, want 1", two.free)
	}
}
