// Package verify proves that an output holds what the source holds: every
// live document of the source at its winning revision and with the content
// its sink stores for that revision, and nothing else. It lists the source
// through its _changes feed, as the pipeline reads it, compares that with
// the output's own record of what it applied, as the state reader of the
// output's sink reports it (the sink alone knows its storage layout), and
// reports four kinds of drift:
//
//   - missing: live in the source, not held by the output;
//   - stale: held at another revision than the source's winner (or held
//     inconsistently, e.g. a data row whose versions row disagrees);
//   - content: held at the source's winning revision, with other content
//     than the sink stores for that revision's body (Options.Content);
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
	"fmt"
	"maps"
	"slices"

	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/feed"
)

// Source is the part of the feed client verify reads.
type Source interface {
	// List calls fn with every document of the feed, from its beginning, in
	// pages of about pageSize: its winning revision, and whether it is
	// deleted or removed. A document listed twice was changed during the
	// listing; its later row is the newer.
	List(ctx context.Context, pageSize int, fn func([]feed.Row) error) error
	// Current reads each document's current state, one row per id in the
	// order of ids: the winner's Rev and Doc, or Deleted, or Removed.
	Current(ctx context.Context, ids []string) ([]feed.Row, error)
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
	// CompareContent compares what the output stores for each document
	// with what its sink stores for the document's source body, and says,
	// for each one that differs, what differs.
	CompareContent(ctx context.Context, docs []deliver.SourceDoc) (map[string]string, error)
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
	Content    Kind = "content"
	Unexpected Kind = "unexpected"
)

// Kinds lists the kinds in report order.
var Kinds = []Kind{Missing, Stale, Content, Unexpected}

// Drift is one document that differs.
type Drift struct {
	Kind      Kind   `json:"kind"`
	DocID     string `json:"doc_id"`
	SourceRev string `json:"source_rev,omitempty"`
	OutputRev string `json:"output_rev,omitempty"`
	// Problem says what is inconsistent inside the output, or, for
	// content drift, what differs (never the values).
	Problem string `json:"problem,omitempty"`
}

// Report is the outcome of a comparison.
type Report struct {
	SourceDocs int `json:"source_docs"`
	OutputDocs int `json:"output_docs"` // documents the output holds
	// ContentChecked counts the documents whose content was compared (held
	// at the source's winning revision, or recorded as filtered at it).
	ContentChecked int `json:"content_checked"`
	// Drift lists every drifted document, by kind, then document id.
	Drift   []Drift      `json:"-"`
	Counts  map[Kind]int `json:"counts"`
	Kept    int          `json:"kept_deleted,omitempty"` // deleted or removed in the source, kept on purpose (KeepDeleted, KeepRemoved)
	Recheck RecheckStats `json:"recheck"`
}

// RecheckStats says what the second look did.
type RecheckStats struct {
	Candidates int `json:"candidates"` // drifted on the first pass
	Settled    int `json:"settled"`    // in sync on the second look
}

// Clean reports whether no drift was found. It reads the counts too, which
// a report decoded from JSON carries in place of the drift list.
func (r *Report) Clean() bool {
	for _, n := range r.Counts {
		if n > 0 {
			return false
		}
	}
	return len(r.Drift) == 0
}

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

// DefaultPageSize is Options.PageSize when it is not set.
const DefaultPageSize = 500

// maxBodyPage bounds the documents whose bodies are read at once (content
// comparison, recheck), so that a page of large bodies stays small.
const maxBodyPage = 100

// Options tune Compare.
type Options struct {
	// PageSize is the number of documents per _changes page of the
	// listing, and per source read of the bodies (content comparison,
	// recheck), at most 100 for those. Default DefaultPageSize.
	PageSize int
	// Content compares the content of every document held at the source's
	// winning revision: its source body is read (one request per page) and
	// compared with what the output stores for it (see the state reader's
	// CompareContent). Without it, only revisions are compared.
	Content bool
	// Recheck looks at every drifted document a second time (source and
	// output), and keeps only those that still differ.
	Recheck bool
	// KeepDeleted says the job never deletes from its outputs (ignore_delete,
	// or active_only): documents deleted in the source are expected there.
	KeepDeleted bool
	// KeepRemoved says the job keeps documents removed from the reader's
	// channels (ignore_remove; Sync Gateway family): they are expected in
	// the output.
	KeepRemoved bool
	// Progress, when set, is called as documents are read, with the phase
	// ("source", "output", "content", "recheck"), the count so far and the
	// total (0 when unknown).
	Progress func(phase string, done, total int)
}

// Compare lists the source, reads everything the output holds, compares
// their contents (Options.Content), and reports the difference. It holds
// the source's ids and revisions in memory, and the output's state of the
// documents whose content it compares (together about 200 bytes per
// document), and one page of bodies (at most 100) at a time.
func Compare(ctx context.Context, src Source, out Output, opts Options) (*Report, error) {
	if opts.PageSize <= 0 {
		opts.PageSize = DefaultPageSize
	}
	if opts.Progress == nil {
		opts.Progress = func(string, int, int) {}
	}
	c := &comparison{src: src, out: out, opts: opts}
	source, kept, err := c.listSource(ctx)
	if err != nil {
		return nil, err
	}
	rep := &Report{SourceDocs: len(source), Counts: map[Kind]int{}}
	drift, same, err := c.scanOutput(ctx, source, kept, rep)
	if err != nil {
		return nil, err
	}
	if opts.Content {
		rep.ContentChecked = len(same)
		d, err := c.check(ctx, same, "content")
		if err != nil {
			return nil, err
		}
		drift = append(drift, d...)
	}
	if opts.Recheck && len(drift) > 0 {
		rep.Recheck.Candidates = len(drift)
		if drift, err = c.recheck(ctx, drift); err != nil {
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

// comparison is one run of Compare.
type comparison struct {
	src  Source
	out  Output
	opts Options
}

// listSource returns the winning revision of every live document, and the
// documents whose last row is not live and which the output keeps, or
// not, otherwise than a document absent from the feed (see keep).
func (c *comparison) listSource(ctx context.Context) (source map[string]string, kept map[string]bool, err error) {
	source, kept = map[string]string{}, map[string]bool{}
	err = c.src.List(ctx, c.opts.PageSize, func(page []feed.Row) error {
		for _, r := range page {
			// A later row of a document is newer.
			delete(source, r.ID)
			delete(kept, r.ID)
			switch k := c.keep(r); {
			case !r.Deleted && !r.Removed:
				source[r.ID] = r.Rev
			case k != c.opts.KeepDeleted:
				kept[r.ID] = k
			}
		}
		c.opts.Progress("source", len(source), 0)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list source documents: %w", err)
	}
	return source, kept, nil
}

// keep reports whether the output keeps a document the source deleted or
// removed from the reader's channels (r), as the poller decides: it skips
// a deletion with KeepDeleted (ignore_delete) and a removal with
// KeepRemoved (ignore_remove). A document the feed does not list counts as
// deleted.
func (c *comparison) keep(r feed.Row) bool {
	return (r.Deleted && c.opts.KeepDeleted) || (r.Removed && c.opts.KeepRemoved)
}

// kept reports whether the output keeps the document id, not live in the
// source; exceptions are what listSource found.
func (c *comparison) kept(exceptions map[string]bool, id string) bool {
	if k, ok := exceptions[id]; ok {
		return k
	}
	return c.opts.KeepDeleted
}

// scanOutput compares every document the output lists with the source's
// winners, and returns the drift found (missing documents included) and the
// documents whose revision is in sync, whose content remains to compare.
func (c *comparison) scanOutput(ctx context.Context, source map[string]string, kept map[string]bool, rep *Report) ([]Drift, []Doc, error) {
	var drift []Drift
	var same []Doc
	seen := make(map[string]bool, len(source))
	scanned := 0
	err := c.out.Scan(ctx, func(d Doc) error {
		scanned++
		if scanned%500 == 0 {
			c.opts.Progress("output", scanned, len(source))
		}
		seen[d.ID] = true
		if d.Held {
			rep.OutputDocs++
		}
		rev, live := source[d.ID]
		switch x, ok := classify(d.ID, rev, live, d, c.kept(kept, d.ID)); {
		case ok:
			drift = append(drift, x)
		case !live:
			if d.Held {
				rep.Kept++
			}
		case c.opts.Content:
			d.Digest = "" // not needed: held only to compare content
			same = append(same, d)
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read output state: %w", err)
	}
	c.opts.Progress("output", scanned, len(source))
	for _, id := range slices.Sorted(maps.Keys(source)) {
		if !seen[id] {
			drift = append(drift, Drift{Kind: Missing, DocID: id, SourceRev: source[id]})
		}
	}
	return drift, same, nil
}

// classify compares one document: the source's winner (rev, when live) and
// the output's state d (a zero Doc when the output does not list it); keep
// says that the output keeps the document when the source no longer has it
// live. It returns the drift, if any.
func classify(id, rev string, live bool, d Doc, keep bool) (Drift, bool) {
	switch {
	case live && d.Held && (d.Rev != rev || d.Problem != ""):
		return Drift{Kind: Stale, DocID: id, SourceRev: rev, OutputRev: d.Rev, Problem: d.Problem}, true
	case live && d.Held:
		return Drift{}, false
	case live && d.Filtered && d.Rev == rev:
		return Drift{}, false
	case live:
		return Drift{Kind: Missing, DocID: id, SourceRev: rev, OutputRev: d.Rev, Problem: d.Problem}, true
	case d.Held && !keep:
		return Drift{Kind: Unexpected, DocID: id, OutputRev: d.Rev, Problem: d.Problem}, true
	}
	return Drift{}, false
}

// check reads the current source state of each document, a page at a time,
// compares it with the output's state docs[i] (a zero Doc with only its ID
// set: the output does not list it), content included (Options.Content),
// and returns the documents that differ.
func (c *comparison) check(ctx context.Context, docs []Doc, phase string) ([]Drift, error) {
	var drift []Drift
	done := 0
	for chunk := range slices.Chunk(docs, min(c.opts.PageSize, maxBodyPage)) {
		ids := docIDs(chunk)
		rows, err := c.src.Current(ctx, ids)
		if err != nil {
			return nil, fmt.Errorf("read source documents: %w", err)
		}
		if len(rows) != len(ids) {
			return nil, fmt.Errorf("read source documents: %d answers for %d documents", len(rows), len(ids))
		}
		var bodies []deliver.SourceDoc
		for i, r := range rows {
			d := chunk[i]
			if r.ID != d.ID {
				return nil, fmt.Errorf("read source documents: answer %d is for %q, not %q", i, r.ID, d.ID)
			}
			live := !r.Deleted && !r.Removed
			if x, ok := classify(d.ID, r.Rev, live, d, c.keep(r)); ok {
				drift = append(drift, x)
			} else if live && c.opts.Content {
				bodies = append(bodies, deliver.SourceDoc{ID: d.ID, Rev: r.Rev, Body: r.Doc})
			}
		}
		if len(bodies) > 0 {
			differs, err := c.out.CompareContent(ctx, bodies)
			if err != nil {
				return nil, fmt.Errorf("compare content: %w", err)
			}
			for _, b := range bodies {
				if why, ok := differs[b.ID]; ok {
					drift = append(drift, Drift{Kind: Content, DocID: b.ID, SourceRev: b.Rev, OutputRev: b.Rev, Problem: why})
				}
			}
		}
		done += len(chunk)
		c.opts.Progress(phase, done, len(docs))
	}
	return drift, nil
}

// docIDs returns the ids of docs, in order.
func docIDs(docs []Doc) []string {
	ids := make([]string, len(docs))
	for i, d := range docs {
		ids[i] = d.ID
	}
	return ids
}

// recheck reads every candidate again, output first, then source, and keeps
// those that still differ.
func (c *comparison) recheck(ctx context.Context, drift []Drift) ([]Drift, error) {
	docs := make([]Doc, len(drift))
	for i, d := range drift {
		docs[i] = Doc{ID: d.DocID}
	}
	for chunk := range slices.Chunk(docs, 500) {
		ids := docIDs(chunk)
		held, err := c.out.Lookup(ctx, ids)
		if err != nil {
			return nil, fmt.Errorf("recheck output state: %w", err)
		}
		for i := range chunk {
			if d, ok := held[chunk[i].ID]; ok {
				chunk[i] = d
			}
		}
	}
	still, err := c.check(ctx, docs, "recheck")
	if err != nil {
		return nil, fmt.Errorf("recheck: %w", err)
	}
	return still, nil
}
