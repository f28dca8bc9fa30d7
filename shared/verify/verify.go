// Package verify proves that an output holds what the source holds: every
// live document of the source at its winning revision, and nothing else. It
// compares the source's winners (_all_docs) with the output's own record of
// what it applied, as the state reader of the output's sink reports it (the
// sink alone knows its storage layout), and reports three kinds of drift:
//
//   - missing: live in the source, not held by the output;
//   - stale: held at another revision than the source's winner (or held
//     inconsistently, e.g. a data row whose versions row disagrees);
//   - unexpected: held by the output, deleted or absent in the source.
//
// Repairer re-enqueues the drifted documents (see its doc comment for why
// the repair can never regress an output nor outrank a later change).
//
// A running pipeline is a moving target: a change between the two readings
// shows up as drift. Compare therefore looks at every drifted document a
// second time (Options.Recheck) and keeps only what still differs; what
// remains while the pipeline is not idle can still be changes in flight.
package verify

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/feed"
)

// Source is the part of the feed client verify reads.
type Source interface {
	// Winners lists every live document with its winning revision.
	Winners(ctx context.Context, pageSize int, fn func([]feed.DocRev) error) error
	// Get returns a document's winning body and revision; a deleted or
	// missing document is an error matching feed.ErrNotFound.
	Get(ctx context.Context, id string) (json.RawMessage, string, error)
}

// Output reads what an output holds: the state reader of its sink
// (pgsink.State, s3sink.State). Implementations are safe for concurrent use.
type Output interface {
	// Scan calls fn for every document the output holds, and for every one
	// it records inconsistently or as filtered; fn's error stops the scan
	// and is returned.
	Scan(ctx context.Context, fn func(Doc) error) error
	// Lookup reads the given documents again; a document Scan would not
	// list is absent from the result.
	Lookup(ctx context.Context, ids []string) (map[string]Doc, error)
}

// Doc is what an output holds for one document. Compare reads its ID, Rev,
// Held, Filtered (in sync when Rev is the source's winner) and Problem (an
// inconsistency inside the output, which counts as drift).
type Doc = deliver.Stored

// Kind is a kind of drift.
type Kind string

// Kinds of drift.
const (
	Missing    Kind = "missing"
	Stale      Kind = "stale"
	Unexpected Kind = "unexpected"
)

// Kinds lists the kinds in report order.
var Kinds = []Kind{Missing, Stale, Unexpected}

// Drift is one document that differs.
type Drift struct {
	Kind      Kind   `json:"kind"`
	DocID     string `json:"doc_id"`
	SourceRev string `json:"source_rev,omitempty"`
	OutputRev string `json:"output_rev,omitempty"`
	Problem   string `json:"problem,omitempty"`
}

// Report is the outcome of a comparison.
type Report struct {
	SourceDocs int `json:"source_docs"`
	OutputDocs int `json:"output_docs"` // documents the output holds
	// Drift lists every drifted document, by kind, then document id.
	Drift   []Drift      `json:"-"`
	Counts  map[Kind]int `json:"counts"`
	Kept    int          `json:"kept_deleted,omitempty"` // deleted in the source, kept on purpose (KeepDeleted)
	Recheck RecheckStats `json:"recheck"`
}

// RecheckStats says what the second look did.
type RecheckStats struct {
	Candidates int `json:"candidates"` // drifted on the first pass
	Settled    int `json:"settled"`    // in sync on the second look
}

// Clean reports whether no drift was found.
func (r *Report) Clean() bool { return len(r.Drift) == 0 }

// Samples returns up to n drifted documents of kind k.
func (r *Report) Samples(k Kind, n int) []Drift {
	var out []Drift
	for _, d := range r.Drift {
		if d.Kind == k && len(out) < n {
			out = append(out, d)
		}
	}
	return out
}

// IDs returns the document ids of every drifted document.
func (r *Report) IDs() []string {
	ids := make([]string, len(r.Drift))
	for i, d := range r.Drift {
		ids[i] = d.DocID
	}
	return ids
}

// Options tune Compare.
type Options struct {
	// PageSize is the number of documents per _all_docs page; 0 means the
	// source client's limit.
	PageSize int
	// Recheck looks at every drifted document a second time (source and
	// output), and keeps only those that still differ.
	Recheck bool
	// KeepDeleted says the job never deletes from its outputs (ignore_delete,
	// or active_only): documents deleted in the source are expected there.
	// (Compare cannot tell a deleted document from one the reader lost
	// access to; both are absent from _all_docs.)
	KeepDeleted bool
	// Concurrency bounds the source reads of the recheck. Default 8.
	Concurrency int
	// Progress, when set, is called as documents are read, with the phase
	// ("source", "output", "recheck"), the count so far and the total (0
	// when unknown).
	Progress func(phase string, done, total int)
}

// Compare reads every live document of the source and everything the output
// holds, and reports the difference. It holds the source's ids and
// revisions in memory (about 100 bytes per document).
func Compare(ctx context.Context, src Source, out Output, opts Options) (*Report, error) {
	progress := opts.Progress
	if progress == nil {
		progress = func(string, int, int) {}
	}
	source := map[string]string{}
	err := src.Winners(ctx, opts.PageSize, func(page []feed.DocRev) error {
		for _, d := range page {
			source[d.ID] = d.Rev
		}
		progress("source", len(source), 0)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read source documents: %w", err)
	}
	rep := &Report{SourceDocs: len(source), Counts: map[Kind]int{}}
	seen := make(map[string]bool, len(source))
	var drift []Drift
	scanned := 0
	err = out.Scan(ctx, func(d Doc) error {
		scanned++
		if scanned%500 == 0 {
			progress("output", scanned, len(source))
		}
		seen[d.ID] = true
		if d.Held {
			rep.OutputDocs++
		}
		rev, live := source[d.ID]
		if x, ok := classify(d.ID, rev, live, d, true, opts.KeepDeleted); ok {
			drift = append(drift, x)
		} else if !live && d.Held && opts.KeepDeleted {
			rep.Kept++
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read output state: %w", err)
	}
	progress("output", scanned, len(source))
	for _, id := range slices.Sorted(maps.Keys(source)) {
		if !seen[id] {
			drift = append(drift, Drift{Kind: Missing, DocID: id, SourceRev: source[id]})
		}
	}
	if opts.Recheck && len(drift) > 0 {
		rep.Recheck.Candidates = len(drift)
		if drift, err = recheck(ctx, src, out, drift, opts, progress); err != nil {
			return nil, err
		}
		rep.Recheck.Settled = rep.Recheck.Candidates - len(drift)
	}
	slices.SortFunc(drift, func(a, b Drift) int {
		if c := cmp.Compare(slices.Index(Kinds, a.Kind), slices.Index(Kinds, b.Kind)); c != 0 {
			return c
		}
		return cmp.Compare(a.DocID, b.DocID)
	})
	rep.Drift = drift
	for _, d := range drift {
		rep.Counts[d.Kind]++
	}
	return rep, nil
}

// classify compares one document: the source's winner (rev, when live) and
// the output's state d (known reports whether the output knows the
// document at all). It returns the drift, if any.
func classify(id, rev string, live bool, d Doc, known, keepDeleted bool) (Drift, bool) {
	switch {
	case live && known && d.Held && (d.Rev != rev || d.Problem != ""):
		return Drift{Kind: Stale, DocID: id, SourceRev: rev, OutputRev: d.Rev, Problem: d.Problem}, true
	case live && known && d.Held:
		return Drift{}, false
	case live && known && d.Filtered && d.Rev == rev:
		return Drift{}, false
	case live:
		return Drift{Kind: Missing, DocID: id, SourceRev: rev, OutputRev: d.Rev, Problem: d.Problem}, true
	case known && d.Held && !keepDeleted:
		return Drift{Kind: Unexpected, DocID: id, OutputRev: d.Rev, Problem: d.Problem}, true
	}
	return Drift{}, false
}

// recheck reads every candidate again, output first, then source, and keeps
// those that still differ.
func recheck(ctx context.Context, src Source, out Output, drift []Drift, opts Options, progress func(string, int, int)) ([]Drift, error) {
	ids := make([]string, len(drift))
	for i, d := range drift {
		ids[i] = d.DocID
	}
	held := map[string]Doc{}
	for chunk := range slices.Chunk(ids, 500) {
		got, err := out.Lookup(ctx, chunk)
		if err != nil {
			return nil, fmt.Errorf("recheck output state: %w", err)
		}
		maps.Copy(held, got)
	}
	type srcDoc struct {
		rev  string
		live bool
	}
	revs := make([]srcDoc, len(ids))
	workers := opts.Concurrency
	if workers <= 0 {
		workers = 8
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	var mu sync.Mutex
	done := 0
	for i, id := range ids {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			_, rev, err := src.Get(gctx, id)
			var se *feed.StatusError
			switch {
			case err == nil:
				revs[i] = srcDoc{rev: rev, live: true}
			case errors.Is(err, feed.ErrNotFound):
			case errors.As(err, &se) && se.Status == http.StatusForbidden:
				// The reader may not see it (Sync Gateway: removed from
				// its channels), just as _all_docs did not list it.
			default:
				return fmt.Errorf("recheck source document %q: %w", id, err)
			}
			mu.Lock()
			defer mu.Unlock()
			done++
			progress("recheck", done, len(ids))
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var still []Drift
	for i, id := range ids {
		d, known := held[id]
		if x, ok := classify(id, revs[i].rev, revs[i].live, d, known, opts.KeepDeleted); ok {
			still = append(still, x)
		}
	}
	return still, nil
}
