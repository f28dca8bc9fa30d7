// Package delivertest is the conformance suite every deliver.Sink runs: it
// checks the monotonic-apply contract of deliver.Sink against a real output,
// so a sink that passes cannot regress a document however its changes are
// duplicated, reordered or interrupted.
//
// A sink's own tests call Run with a Harness that creates a fresh output per
// case and reads back what that output holds.
package delivertest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/deliver"
)

// StateFunc reports what an output holds for a document: its revision and
// true, or "" and false when the output holds no live copy (never written,
// deleted, or removed).
type StateFunc func(t *testing.T, docID string) (rev string, present bool)

// Harness adapts one sink implementation to the suite.
type Harness struct {
	// New returns a sink writing to a fresh, empty output used by no other
	// case, and the function reading that output back. It is called once per
	// case, from parallel subtests, and should register its own cleanup.
	New func(t *testing.T) (deliver.Sink, StateFunc)
}

// Job and Output are the job and output ids of the changes the helpers build.
const (
	Job    = "job-1"
	Output = "out-1"
)

// V returns the version (generation, counter).
func V(generation, counter int64) change.Version {
	return change.Version{Generation: generation, Counter: counter}
}

// Live returns a live change of docID at revision rev observed at version v.
// Its body is a JSON object holding the id, the revision and the version, so
// every (document, version) pair has a distinct body.
func Live(docID, rev string, v change.Version) *change.Envelope {
	body, err := json.Marshal(map[string]string{"_id": docID, "_rev": rev, "observed": v.String()})
	if err != nil {
		// A map of strings always encodes; this cannot happen.
		body = []byte(`{}`)
	}
	e := envelope(docID, rev, v)
	e.Doc = body
	return e
}

// Deleted returns a tombstone (a deleted document) of docID at version v.
func Deleted(docID, rev string, v change.Version) *change.Envelope {
	e := envelope(docID, rev, v)
	e.Deleted = true
	return e
}

// Removed returns a change reporting that docID left the reader's channels.
func Removed(docID, rev string, v change.Version) *change.Envelope {
	e := envelope(docID, rev, v)
	e.Removed = true
	return e
}

func envelope(docID, rev string, v change.Version) *change.Envelope {
	return &change.Envelope{
		V:          change.EnvelopeVersion,
		Job:        Job,
		Output:     Output,
		DocID:      docID,
		Rev:        rev,
		Seq:        json.RawMessage(strconv.Quote(fmt.Sprintf("%d:%d", v.Generation, v.Counter))),
		Version:    v,
		EnqueuedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}

// absent is the wanted state of a document the output must not hold.
const absent = ""

// Run runs the conformance suite against the sink h builds. Every case runs
// in parallel on its own output.
func Run(t *testing.T, h Harness) {
	t.Helper()
	sequences := []struct {
		name    string
		batches [][]*change.Envelope
		// want maps a document id to its wanted revision, or absent.
		want map[string]string
	}{
		{
			name: "apply live documents",
			batches: [][]*change.Envelope{{
				Live("a", "1-a", V(1, 1)),
				Live("b/with slash", "1-b", V(1, 2)),
				Live("ünïcødé ✓", "1-c", V(1, 3)),
			}},
			want: map[string]string{"a": "1-a", "b/with slash": "1-b", "ünïcødé ✓": "1-c", "never-written": absent},
		},
		{
			name: "redelivery is idempotent",
			batches: [][]*change.Envelope{
				{Live("a", "1-a", V(1, 1)), Deleted("b", "2-b", V(1, 2))},
				{Live("a", "1-a", V(1, 1)), Deleted("b", "2-b", V(1, 2))},
				{Live("a", "1-a", V(1, 1))},
			},
			want: map[string]string{"a": "1-a", "b": absent},
		},
		{
			name: "an older version never overwrites a newer one",
			batches: [][]*change.Envelope{
				{Live("a", "3-a", V(1, 30))},
				{Live("a", "2-a", V(1, 20))},
				{Live("a", "1-a", V(1, 10))},
			},
			want: map[string]string{"a": "3-a"},
		},
		{
			name: "a newer generation beats any counter of an older one",
			batches: [][]*change.Envelope{
				{Live("a", "2-a", V(2, 1))},
				// A zombie poller of generation 1 sent this later, with a far higher counter.
				{Live("a", "9-z", V(1, 999))},
			},
			want: map[string]string{"a": "2-a"},
		},
		{
			name: "tombstone then a stale update stays deleted",
			batches: [][]*change.Envelope{
				{Live("a", "1-a", V(1, 1))},
				{Deleted("a", "3-a", V(1, 3))},
				{Live("a", "2-a", V(1, 2))},
				{Live("a", "1-a", V(1, 1))},
			},
			want: map[string]string{"a": absent},
		},
		{
			name: "a tombstone arriving first still blocks older changes",
			batches: [][]*change.Envelope{
				{Deleted("a", "3-a", V(1, 3))},
				{Live("a", "2-a", V(1, 2))},
			},
			want: map[string]string{"a": absent},
		},
		{
			name: "a newer live change revives a deleted document",
			batches: [][]*change.Envelope{
				{Live("a", "1-a", V(1, 1))},
				{Deleted("a", "2-a", V(1, 2))},
				{Live("a", "3-a", V(1, 3))},
				{Live("a", "1-a", V(1, 1))},
			},
			want: map[string]string{"a": "3-a"},
		},
		{
			name: "removed from channels deletes",
			batches: [][]*change.Envelope{
				{Live("a", "1-a", V(1, 1))},
				{Removed("a", "1-a", V(1, 2))},
				{Live("a", "1-a", V(1, 1))},
			},
			want: map[string]string{"a": absent},
		},
		{
			// When the winning branch of a conflict is deleted, the new winner
			// can have a lower revision; observation order, not revision
			// order, decides.
			name: "a lower revision with a newer version wins",
			batches: [][]*change.Envelope{
				{Live("a", "3-b", V(5, 9))},
				{Live("a", "2-a", V(5, 10))},
				{Live("a", "3-b", V(5, 9))},
			},
			want: map[string]string{"a": "2-a"},
		},
	}
	for _, tc := range sequences {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sink, state := h.New(t)
			for i, batch := range tc.batches {
				applyOK(t, sink, batch, fmt.Sprintf("batch %d", i))
			}
			checkState(t, state, tc.want)
		})
	}

	t.Run("shuffled deliveries end at the highest version", func(t *testing.T) {
		t.Parallel()
		sink, state := h.New(t)
		changes, want := history(4, 12)
		r := newRand(t)
		r.Shuffle(len(changes), func(i, j int) { changes[i], changes[j] = changes[j], changes[i] })
		for i, batch := range batches(changes, 10) {
			applyOK(t, sink, batch, fmt.Sprintf("batch %d", i))
		}
		checkState(t, state, want)
	})

	t.Run("concurrent shuffled deliveries end at the highest version", func(t *testing.T) {
		t.Parallel()
		sink, state := h.New(t)
		changes, want := history(3, 10)
		r := newRand(t)
		var wg sync.WaitGroup
		for w := range 3 {
			mine := append([]*change.Envelope(nil), changes...)
			r.Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
			wg.Go(func() {
				for i, batch := range batches(mine, 5) {
					applyRetrying(t, sink, batch, fmt.Sprintf("worker %d batch %d", w, i))
				}
			})
		}
		wg.Wait()
		checkState(t, state, want)
	})

	t.Run("cancelled context fails transient and applies nothing", func(t *testing.T) {
		t.Parallel()
		sink, state := h.New(t)
		applyOK(t, sink, []*change.Envelope{Live("a", "1-a", V(1, 1)), Live("b", "1-b", V(1, 2))}, "setup")

		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		batch := []*change.Envelope{Live("a", "2-a", V(1, 3)), Deleted("b", "2-b", V(1, 4)), Live("c", "1-c", V(1, 5))}
		errs := sink.Apply(ctx, batch)
		if len(errs) != len(batch) {
			t.Fatalf("Apply returned %d errors for %d changes", len(errs), len(batch))
		}
		for i, err := range errs {
			if err == nil {
				t.Errorf("change %d (%s): got nil error with a cancelled context", i, batch[i].DocID)
				continue
			}
			if got := deliver.Classify(err).Class; got != deliver.Transient {
				t.Errorf("change %d (%s): got class %q (%v), want transient", i, batch[i].DocID, got, err)
			}
		}
		checkState(t, state, map[string]string{"a": "1-a", "b": "1-b", "c": absent})

		// The retry SQS would make succeeds.
		applyOK(t, sink, batch, "retry")
		checkState(t, state, map[string]string{"a": "2-a", "b": absent, "c": "1-c"})
	})
}

// history returns, for docs documents, versions changes each spread over two
// generations, every third one a tombstone, and the state the highest version
// of each document leaves.
func history(docs, versions int) ([]*change.Envelope, map[string]string) {
	var all []*change.Envelope
	want := map[string]string{}
	counter := int64(0)
	for v := 1; v <= versions; v++ {
		gen := int64(1)
		if v > versions/2 {
			gen = 2
		}
		for d := range docs {
			counter++
			id := fmt.Sprintf("doc-%d", d)
			// Revisions deliberately do not follow the version order.
			rev := fmt.Sprintf("%d-%x", (v*7)%5+1, counter)
			if (v+d)%3 == 0 {
				all = append(all, Deleted(id, rev, V(gen, counter)))
				want[id] = absent
			} else {
				all = append(all, Live(id, rev, V(gen, counter)))
				want[id] = rev
			}
		}
	}
	return all, want
}

// batches splits changes into batches of at most size changes in which no
// document appears twice, as on a per_document output.
func batches(changes []*change.Envelope, size int) [][]*change.Envelope {
	var out [][]*change.Envelope
	for _, c := range changes {
		placed := false
		for i, b := range out {
			if len(b) >= size || holds(b, c.DocID) {
				continue
			}
			out[i] = append(b, c)
			placed = true
			break
		}
		if !placed {
			out = append(out, []*change.Envelope{c})
		}
	}
	return out
}

func holds(batch []*change.Envelope, docID string) bool {
	for _, c := range batch {
		if c.DocID == docID {
			return true
		}
	}
	return false
}

func newRand(t *testing.T) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("shuffle seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed>>1))
}

// applyOK applies batch and fails the test unless every change succeeded.
func applyOK(t *testing.T, sink deliver.Sink, batch []*change.Envelope, what string) {
	t.Helper()
	errs := sink.Apply(t.Context(), batch)
	if len(errs) != len(batch) {
		t.Fatalf("%s: Apply returned %d errors for %d changes", what, len(errs), len(batch))
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: change %d (%s %s): %v", what, i, batch[i].DocID, batch[i].Version, err)
		}
	}
}

// ApplyAll applies batches through sink one after the other and fails the
// test unless every change of every batch succeeded.
func ApplyAll(t *testing.T, sink deliver.Sink, batches ...[]*change.Envelope) {
	t.Helper()
	for i, batch := range batches {
		applyOK(t, sink, batch, fmt.Sprintf("batch %d", i))
	}
}

// ApplyConcurrently applies changes through sink from writers goroutines at
// once, each in its own shuffled order and in consecutive batches of at most
// size changes (a batch may hold a document twice), re-applying changes that
// failed transiently as SQS would redeliver them. It returns once every
// writer is done; a permanent failure fails the test.
func ApplyConcurrently(t *testing.T, sink deliver.Sink, changes []*change.Envelope, writers, size int) {
	t.Helper()
	r := newRand(t)
	var wg sync.WaitGroup
	for w := range writers {
		mine := append([]*change.Envelope(nil), changes...)
		r.Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
		wg.Go(func() {
			for start := 0; start < len(mine); start += size {
				batch := mine[start:min(start+size, len(mine))]
				applyRetrying(t, sink, batch, fmt.Sprintf("writer %d batch at %d", w, start))
			}
		})
	}
	wg.Wait()
}

// applyRetrying applies batch, re-applying changes that failed transiently as
// SQS would redeliver them, and fails the test on a permanent failure.
func applyRetrying(t *testing.T, sink deliver.Sink, batch []*change.Envelope, what string) {
	t.Helper()
	for attempt := 1; len(batch) > 0; attempt++ {
		errs := sink.Apply(t.Context(), batch)
		if len(errs) != len(batch) {
			t.Errorf("%s: Apply returned %d errors for %d changes", what, len(errs), len(batch))
			return
		}
		var again []*change.Envelope
		for i, err := range errs {
			if err == nil {
				continue
			}
			if deliver.Classify(err).Class != deliver.Transient || attempt == 20 {
				t.Errorf("%s: change %d (%s %s), attempt %d: %v", what, i, batch[i].DocID, batch[i].Version, attempt, err)
				return
			}
			again = append(again, batch[i])
		}
		batch = again
	}
}

func checkState(t *testing.T, state StateFunc, want map[string]string) {
	t.Helper()
	for id, wantRev := range want {
		rev, present := state(t, id)
		switch {
		case wantRev == absent && present:
			t.Errorf("document %q: output holds rev %q, want it absent", id, rev)
		case wantRev != absent && !present:
			t.Errorf("document %q: absent from the output, want rev %q", id, wantRev)
		case rev != wantRev:
			t.Errorf("document %q: output holds rev %q, want %q", id, rev, wantRev)
		}
	}
}

// CheckNew checks the error of a sink's constructor against want, a text
// the error must contain ("" when the constructor must succeed). It reports
// whether the constructor succeeded, so that the caller goes on to check what
// it built.
func CheckNew(t testing.TB, err error, want string) bool {
	t.Helper()
	if want != "" {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New error = %v, want one mentioning %q", err, want)
		}
		return false
	}
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return true
}
