package faults

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// Sample is the job item as read at one moment.
type Sample struct {
	At    time.Time
	State lease.State
	Seq   int64 // the checkpoint as a number
}

// CheckpointedByHolder reports whether the item's checkpoint was written by
// the generation holding it (and not inherited from the one before).
func (s Sample) CheckpointedByHolder() bool {
	return s.State.Checkpoint != nil && !s.State.CheckpointAt.Before(s.State.AcquiredAt)
}

// Watcher samples the job item at a fixed interval with strongly
// consistent reads and checks that the checkpoint never moves back. Safe for
// concurrent use.
type Watcher struct {
	stack  *Stack
	cancel context.CancelFunc
	done   chan struct{}

	mu          sync.Mutex
	samples     []Sample
	regressions []string
	readErrors  int
	maxSeq      int64
	maxAt       Sample
}

// Watch starts sampling the job item every interval until Stop.
func (s *Stack) Watch(ctx context.Context, every time.Duration) *Watcher {
	ctx, cancel := context.WithCancel(ctx)
	w := &Watcher{stack: s, cancel: cancel, done: make(chan struct{}), maxSeq: -1}
	go func() {
		defer close(w.done)
		w.sample(ctx)
		clock.Every(ctx, every, func() bool {
			w.sample(ctx)
			return true
		})
	}()
	return w
}

func (w *Watcher) sample(ctx context.Context) {
	st, err := w.stack.Leases.Get(ctx, Job)
	at := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			w.readErrors++
		}
		return
	}
	if !st.Exists {
		return
	}
	seq, err := SeqNumber(st.Checkpoint)
	if err != nil {
		w.regressions = append(w.regressions, fmt.Sprintf("%s: checkpoint %s is not numeric", at.Format(time.RFC3339Nano), st.Checkpoint))
		return
	}
	s := Sample{At: at, State: *st, Seq: seq}
	if seq < w.maxSeq {
		w.regressions = append(w.regressions, fmt.Sprintf("%s: checkpoint moved back from %d (generation %d, owner %s, read %s) to %d (generation %d, owner %s)",
			at.Format(time.RFC3339Nano), w.maxSeq, w.maxAt.State.Generation, w.maxAt.State.Owner, w.maxAt.At.Format(time.RFC3339Nano),
			seq, st.Generation, st.Owner))
	}
	if seq > w.maxSeq {
		w.maxSeq, w.maxAt = seq, s
	}
	w.samples = append(w.samples, s)
}

// Stop ends the sampling.
func (w *Watcher) Stop() {
	w.cancel()
	<-w.done
}

// Samples returns the samples so far, oldest first.
func (w *Watcher) Samples() []Sample {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Sample(nil), w.samples...)
}

// Len is the number of samples so far.
func (w *Watcher) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.samples)
}

// Last returns the latest sample (false when there is none).
func (w *Watcher) Last() (Sample, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.samples) == 0 {
		return Sample{}, false
	}
	return w.samples[len(w.samples)-1], true
}

// Regressions describes every time the checkpoint was seen lower than
// before (and every non-numeric checkpoint). Empty is the expected result.
func (w *Watcher) Regressions() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.regressions...)
}

// ReadErrors is how many reads of the job item failed.
func (w *Watcher) ReadErrors() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.readErrors
}

// WaitFor waits for a sample, taken at index from or later, that match
// accepts, and returns it.
func (w *Watcher) WaitFor(ctx context.Context, from int, timeout time.Duration, match func(Sample) bool) (Sample, error) {
	var found Sample
	err := testenv.Poll(ctx, timeout, 20*time.Millisecond, func(context.Context) (bool, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		for ; from < len(w.samples); from++ {
			if match(w.samples[from]) {
				found = w.samples[from]
				return true, nil
			}
		}
		return false, nil
	})
	if errors.Is(err, testenv.ErrTimeout) {
		last, _ := w.Last()
		err = fmt.Errorf("job item never matched within %s (last: generation %d owner %s released %v checkpoint %s)",
			timeout, last.State.Generation, last.State.Owner, last.State.Released, last.State.Checkpoint)
	}
	return found, err
}

// FirstCheckpoint returns the first sample showing a checkpoint written by
// generation gen. Its State.CheckpointAt is the time of that write by the
// holder's clock; when the sampling missed earlier checkpoints of gen, it is
// later than the first one (the figure errs on the slow side).
func (w *Watcher) FirstCheckpoint(gen int64) (Sample, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.samples {
		if s.State.Generation == gen && s.CheckpointedByHolder() {
			return s, true
		}
	}
	return Sample{}, false
}
