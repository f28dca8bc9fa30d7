package delivertest

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/deliver"
)

// StateReader is what the state suite calls on a sink's state reader.
type StateReader interface {
	Scan(ctx context.Context, fn func(deliver.Stored) error) error
	Lookup(ctx context.Context, ids []string) (map[string]deliver.Stored, error)
	CompareContent(ctx context.Context, docs []deliver.SourceDoc) (map[string]string, error)
}

// StateHarness adapts one sink and its state reader to the state suite.
type StateHarness struct {
	// New returns a sink writing to a fresh, empty output used by no other
	// case, and the state reader of that output. It is called once per
	// case, from parallel subtests, and should register its own cleanup.
	New func(t *testing.T) (deliver.Sink, StateReader)
	// Digests says the reader fills Stored.Digest of the documents it holds.
	Digests bool
}

// RunState checks that a state reader reports what changes applied through
// its own sink left: the version, revision and liveness of every document,
// the same through Scan and Lookup, (with Digests) a digest that follows
// the stored content, and a content comparison that finds a body other than
// the one applied, but not the same body written differently.
func RunState(t *testing.T, h StateHarness) {
	t.Helper()
	t.Run("reports what the sink applied", func(t *testing.T) {
		t.Parallel()
		sink, st := h.New(t)
		applyOK(t, sink, []*change.Envelope{
			Live("a", "1-a", V(1, 1)),
			Live("b", "1-b", V(1, 2)),
			Live("c", "1-c", V(1, 3)),
			Live("d", "1-d", V(1, 4)),
			Live("with/slash ünï", "1-s", V(1, 5)),
		}, "batch 0")
		applyOK(t, sink, []*change.Envelope{
			Deleted("b", "2-b", V(1, 6)),
			Live("c", "2-c", V(2, 1)),
			Removed("d", "1-d", V(2, 2)),
		}, "batch 1")
		// A stale redelivery changes nothing.
		applyOK(t, sink, []*change.Envelope{Live("c", "1-c", V(1, 3))}, "batch 2")

		want := map[string]deliver.Stored{
			"a":              {ID: "a", Version: V(1, 1), Rev: "1-a", Held: true},
			"c":              {ID: "c", Version: V(2, 1), Rev: "2-c", Held: true},
			"with/slash ünï": {ID: "with/slash ünï", Version: V(1, 5), Rev: "1-s", Held: true},
		}
		scanned := ScanAll(t, st)
		ignoreDigest := cmpopts.IgnoreFields(deliver.Stored{}, "Digest")
		if diff := cmp.Diff(want, scanned, ignoreDigest); diff != "" {
			t.Errorf("Scan (-want +got):\n%s", diff)
		}
		got, err := st.Lookup(t.Context(), []string{"a", "b", "c", "d", "with/slash ünï", "never-written"})
		if err != nil {
			t.Fatalf("Lookup: %v", err)
		}
		if diff := cmp.Diff(scanned, got); diff != "" {
			t.Errorf("Lookup differs from Scan (-scan +lookup):\n%s", diff)
		}
		if h.Digests {
			for id, d := range scanned {
				if d.Digest == "" {
					t.Errorf("document %q: no digest", id)
				}
			}
			if scanned["a"].Digest == scanned["c"].Digest {
				t.Errorf("documents a and c have different bodies but the same digest %q", scanned["a"].Digest)
			}
		}
	})

	if h.Digests {
		t.Run("digest follows the content", func(t *testing.T) {
			t.Parallel()
			sink, st := h.New(t)
			applyOK(t, sink, []*change.Envelope{Live("a", "1-a", V(1, 1))}, "first")
			first := lookupOne(t, st, "a")
			applyOK(t, sink, []*change.Envelope{Live("a", "1-a", V(1, 1))}, "redelivery")
			if again := lookupOne(t, st, "a"); again.Digest != first.Digest {
				t.Errorf("digest after a redelivery = %q, want %q unchanged", again.Digest, first.Digest)
			}
			applyOK(t, sink, []*change.Envelope{Live("a", "2-a", V(1, 2))}, "update")
			if next := lookupOne(t, st, "a"); next.Digest == first.Digest {
				t.Errorf("digest after an update with another body = %q, unchanged", next.Digest)
			}
		})
	}

	t.Run("content compares with the source body", func(t *testing.T) {
		t.Parallel()
		sink, st := h.New(t)
		applyOK(t, sink, []*change.Envelope{Live("a", "1-a", V(1, 1)), Live("b", "1-b", V(1, 2)), Live("c", "1-c", V(1, 3))}, "batch")
		if got, err := st.CompareContent(t.Context(), nil); err != nil || len(got) != 0 {
			t.Errorf("CompareContent of no document = %v, %v", got, err)
		}
		other := Live("b", "1-b", V(1, 2))
		other.Doc = json.RawMessage(`{"_id":"b","_rev":"1-b","observed":"something else"}`)
		docs := []deliver.SourceDoc{
			{ID: "a", Rev: "1-a", Body: Live("a", "1-a", V(1, 1)).Doc},
			{ID: "b", Rev: "1-b", Body: other.Doc},
			// The applied body with its members in another order and
			// other white space: the same content.
			{ID: "c", Rev: "1-c", Body: json.RawMessage(` { "observed" : "1.3", "_rev":"1-c",  "_id": "c"}`)},
			{ID: "never", Rev: "1-n", Body: Live("never", "1-n", V(1, 4)).Doc},
		}
		got, err := st.CompareContent(t.Context(), docs)
		if err != nil {
			t.Fatalf("CompareContent: %v", err)
		}
		if diff := cmp.Diff([]string{"b", "never"}, slices.Sorted(maps.Keys(got))); diff != "" {
			t.Errorf("CompareContent reports (-want +got):\n%s\n%v", diff, got)
		}
		for id, why := range got {
			if why == "" || strings.Contains(why, "something else") {
				t.Errorf("document %q: reason %q should say what differs, without the values", id, why)
			}
		}
	})

	t.Run("an empty output holds nothing", func(t *testing.T) {
		t.Parallel()
		_, st := h.New(t)
		if got := ScanAll(t, st); len(got) != 0 {
			t.Errorf("Scan of an empty output: %v", got)
		}
		got, err := st.Lookup(t.Context(), []string{"a"})
		if err != nil || len(got) != 0 {
			t.Errorf("Lookup of an empty output = %v, %v", got, err)
		}
	})

	t.Run("an error from fn stops the scan", func(t *testing.T) {
		t.Parallel()
		sink, st := h.New(t)
		applyOK(t, sink, []*change.Envelope{Live("a", "1-a", V(1, 1)), Live("b", "1-b", V(1, 2)), Live("c", "1-c", V(1, 3))}, "batch")
		stop := errors.New("stop")
		calls := 0
		err := st.Scan(t.Context(), func(deliver.Stored) error {
			calls++
			return stop
		})
		if !errors.Is(err, stop) || calls != 1 {
			t.Errorf("Scan = %v after %d calls, want the error of fn after 1 call", err, calls)
		}
	})

	t.Run("a cancelled context fails", func(t *testing.T) {
		t.Parallel()
		sink, st := h.New(t)
		applyOK(t, sink, []*change.Envelope{Live("a", "1-a", V(1, 1))}, "batch")
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := st.Scan(ctx, func(deliver.Stored) error { return nil }); !errors.Is(err, context.Canceled) {
			t.Errorf("Scan with a cancelled context = %v, want context.Canceled", err)
		}
		if _, err := st.Lookup(ctx, []string{"a"}); !errors.Is(err, context.Canceled) {
			t.Errorf("Lookup with a cancelled context = %v, want context.Canceled", err)
		}
	})
}

// ScanAll returns what st.Scan lists, by document id, failing the test on an
// error or a document listed twice.
func ScanAll(t *testing.T, st StateReader) map[string]deliver.Stored {
	t.Helper()
	got := map[string]deliver.Stored{}
	err := st.Scan(t.Context(), func(d deliver.Stored) error {
		if _, dup := got[d.ID]; dup {
			t.Errorf("Scan listed %q twice", d.ID)
		}
		got[d.ID] = d
		return nil
	})
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return got
}

func lookupOne(t *testing.T, st StateReader, id string) deliver.Stored {
	t.Helper()
	got, err := st.Lookup(t.Context(), []string{id})
	if err != nil {
		t.Fatalf("Lookup %q: %v", id, err)
	}
	d, ok := got[id]
	if !ok {
		t.Fatalf("Lookup %q: not found among %v", id, slices.Sorted(maps.Keys(got)))
	}
	return d
}

// CheckContent runs st.CompareContent on docs and fails the test unless it
// reports exactly want: the reason by document id of each document whose
// stored content differs from its source body.
func CheckContent(t *testing.T, st StateReader, docs []deliver.SourceDoc, want map[string]string) {
	t.Helper()
	got, err := st.CompareContent(t.Context(), docs)
	if err != nil {
		t.Fatalf("CompareContent: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("CompareContent (-want +got):\n%s", diff)
	}
}
