package deliver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
)

func env(doc string, counter int64) *change.Envelope {
	return &change.Envelope{DocID: doc, Rev: fmt.Sprintf("%d-x", counter), Version: change.Version{Generation: 1, Counter: counter}}
}

func noCheck(*change.Envelope) error { return nil }

// Changes of one document are applied oldest version first, whatever their
// order in the batch; at most parallelism applies run at once; a failing
// change or a refused check fails that change only.
func TestEachDocument(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		changes     []*change.Envelope
		parallelism int
		check       func(*change.Envelope) error
		fail        string // rev whose apply fails
		wantOrder   map[string][]int64
		wantErrs    []string // "" for success
	}{
		{
			name:        "per-document order, oldest first",
			changes:     []*change.Envelope{env("a", 3), env("b", 2), env("a", 1), env("c", 9), env("a", 2), env("b", 1)},
			parallelism: 2,
			wantOrder:   map[string][]int64{"a": {1, 2, 3}, "b": {1, 2}, "c": {9}},
			wantErrs:    []string{"", "", "", "", "", ""},
		},
		{
			name:        "one failure stops no other change",
			changes:     []*change.Envelope{env("a", 1), env("a", 2), env("b", 1), env("a", 3)},
			parallelism: 1,
			fail:        "2-x",
			wantOrder:   map[string][]int64{"a": {1, 2, 3}, "b": {1}},
			wantErrs:    []string{"", "boom 2-x", "", ""},
		},
		{
			name:    "a refused check is the change's result and nothing is sent",
			changes: []*change.Envelope{env("a", 1), env("", 2), env("b", 1)},
			check: func(c *change.Envelope) error {
				if c.DocID == "" {
					return PermanentError("invalid_change", errors.New("doc_id is empty"))
				}
				return nil
			},
			parallelism: 4,
			wantOrder:   map[string][]int64{"a": {1}, "b": {1}},
			wantErrs:    []string{"", "permanent invalid_change: doc_id is empty", ""},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			check := tt.check
			if check == nil {
				check = noCheck
			}
			var (
				mu          sync.Mutex
				order       = map[string][]int64{}
				running     atomic.Int32
				maxParallel atomic.Int32
			)
			errs := EachDocument(t.Context(), tt.changes, tt.parallelism, check, func(ctx context.Context, c *change.Envelope) error {
				n := running.Add(1)
				defer running.Add(-1)
				for {
					m := maxParallel.Load()
					if n <= m || maxParallel.CompareAndSwap(m, n) {
						break
					}
				}
				time.Sleep(5 * time.Millisecond)
				mu.Lock()
				order[c.DocID] = append(order[c.DocID], c.Counter)
				mu.Unlock()
				if c.Rev == tt.fail {
					return errors.New("boom " + c.Rev)
				}
				return nil
			})
			got := make([]string, len(errs))
			for i, err := range errs {
				if err != nil {
					got[i] = err.Error()
				}
			}
			if d := cmp.Diff(tt.wantErrs, got); d != "" {
				t.Errorf("errors (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tt.wantOrder, order); d != "" {
				t.Errorf("apply order per document (-want +got):\n%s", d)
			}
			if m := maxParallel.Load(); int(m) > tt.parallelism {
				t.Errorf("%d applies ran at once, want at most %d", m, tt.parallelism)
			}
		})
	}
}

// Once ctx ends, the changes that have not started fail transient with the
// context's error; the one in progress ends as apply says.
func TestEachDocumentContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	changes := []*change.Envelope{env("a", 1), env("a", 2), env("b", 1), env("b", 2)}
	errs := EachDocument(ctx, changes, 1, noCheck, func(ctx context.Context, c *change.Envelope) error {
		cancel()
		return nil // the first change applied before the end
	})
	started := 0
	for i, err := range errs {
		if err == nil {
			started++
			continue
		}
		e := Classify(err)
		if e.Class != Transient || e.Reason != "timeout" || !errors.Is(err, context.Canceled) {
			t.Errorf("change %d: %v, want transient timeout wrapping context.Canceled", i, err)
		}
	}
	if started != 1 {
		t.Errorf("%d changes applied, want 1 (%v)", started, errs)
	}
}
