package feed

// Integration tests against the real CouchDB-compatible source
// (pouchdb-server, started by `make up`).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// Revisions of a conflict built with new_edits:false: two branches of one
// root. Of two leaves of the same generation the higher revision id wins, so
// branch F wins until it is deleted.
const (
	revRoot = "1-00000000000000000000000000000000"
	revA    = "2-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	revF    = "2-ffffffffffffffffffffffffffffffff"
)

// awkwardIDs need escaping in a URL path.
var awkwardIDs = []string{"a/b", "ünïcødé", "with space", "q?x#y%z", "emoji 🚀/x", "+plus", "_design/app"}

// docState is what a document's last change should say.
type docState struct {
	Rev     string
	Deleted bool
	V       string // the body's "v"; "" for tombstones
}

// bulkDocs writes docs with _bulk_docs and returns the new revisions.
func bulkDocs(t *testing.T, db string, newEdits bool, docs ...map[string]any) []string {
	t.Helper()
	body, err := json.Marshal(map[string]any{"docs": docs, "new_edits": newEdits})
	if err != nil {
		t.Fatalf("encode docs: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, db+"/_bulk_docs", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("bulk docs: %v", err)
	}
	defer resp.Body.Close()
	var res []struct{ ID, Rev, Error, Reason string }
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("bulk docs: status %d, decode: %v", resp.StatusCode, err)
	}
	if !newEdits {
		return nil
	}
	// Match answers by id: pouchdb-server answers design documents first,
	// not in request order.
	byID := map[string]string{}
	for _, r := range res {
		if r.Error != "" {
			t.Fatalf("bulk docs: %s: %s: %s", r.ID, r.Error, r.Reason)
		}
		byID[r.ID] = r.Rev
	}
	revs := make([]string, len(docs))
	for i, d := range docs {
		if revs[i] = byID[d["_id"].(string)]; revs[i] == "" {
			t.Fatalf("bulk docs: no answer for %q", d["_id"])
		}
	}
	return revs
}

// fixture writes documents with awkward ids, updates, deletes and a
// re-creation, and returns what the feed must end up saying about each.
func fixture(t *testing.T, db string) map[string]docState {
	t.Helper()
	want := map[string]docState{}
	var docs []map[string]any
	ids := slices.Clone(awkwardIDs)
	for i := range 10 {
		ids = append(ids, fmt.Sprintf("doc-%02d", i))
	}
	for _, id := range ids {
		docs = append(docs, map[string]any{"_id": id, "v": "1"})
	}
	for i, rev := range bulkDocs(t, db, true, docs...) {
		want[ids[i]] = docState{Rev: rev, V: "1"}
	}
	update := func(id, v string) {
		rev := bulkDocs(t, db, true, map[string]any{"_id": id, "_rev": want[id].Rev, "v": v})[0]
		want[id] = docState{Rev: rev, V: v}
	}
	remove := func(id string) {
		rev := bulkDocs(t, db, true, map[string]any{"_id": id, "_rev": want[id].Rev, "_deleted": true})[0]
		want[id] = docState{Rev: rev, Deleted: true}
	}
	update("a/b", "2")
	update("doc-03", "2")
	update("a/b", "3")
	update("ünïcødé", "2")
	remove("with space")
	remove("doc-05")
	remove("doc-07")
	// Re-create a deleted document: a new revision on the tombstone's branch.
	rev := bulkDocs(t, db, true, map[string]any{"_id": "doc-07", "v": "again"})[0]
	want["doc-07"] = docState{Rev: rev, V: "again"}
	return want
}

// readAll follows the feed from since to its end, fetching bodies, and
// returns the last state of every document and the final last_seq.
func readAll(t *testing.T, c *Client, since json.RawMessage) (map[string]docState, json.RawMessage, int) {
	t.Helper()
	got := map[string]docState{}
	var prev float64 = -1
	requests := 0
	for {
		b, err := c.Changes(t.Context(), since, 200*time.Millisecond)
		if err != nil {
			t.Fatalf("Changes(since=%s): %v", since, err)
		}
		requests++
		if len(b.Rows) == 0 {
			if !bytes.Equal(b.LastSeq, since) {
				t.Fatalf("empty batch moved last_seq from %s to %s", since, b.LastSeq)
			}
			return got, since, requests
		}
		if len(b.Rows) > c.o.Limit {
			t.Errorf("batch has %d rows, limit is %d", len(b.Rows), c.o.Limit)
		}
		if err := c.FetchDocs(t.Context(), b.Rows); err != nil {
			t.Fatalf("FetchDocs: %v", err)
		}
		for _, r := range b.Rows {
			var seq float64
			if err := json.Unmarshal(r.Seq, &seq); err != nil || seq <= prev {
				t.Errorf("row %s seq %s: not a number above %v (%v)", r.ID, r.Seq, prev, err)
			}
			prev = seq
			s := docState{Rev: r.Rev, Deleted: r.Deleted}
			if !r.Deleted {
				var body struct {
					ID  string `json:"_id"`
					Rev string `json:"_rev"`
					V   string `json:"v"`
				}
				if err := json.Unmarshal(r.Doc, &body); err != nil {
					t.Fatalf("row %s: body %s: %v", r.ID, r.Doc, err)
				}
				if body.ID != r.ID || body.Rev != r.Rev {
					t.Errorf("row %s rev %s carries the body of %s rev %s", r.ID, r.Rev, body.ID, body.Rev)
				}
				s.V = body.V
			}
			got[r.ID] = s
		}
		// With ActiveOnly the client may have dropped rows after the last one kept.
		if want := b.Rows[len(b.Rows)-1].Seq; !c.o.ActiveOnly && !bytes.Equal(b.LastSeq, want) {
			t.Errorf("last_seq %s, want the last row's seq %s", b.LastSeq, want)
		}
		since = b.LastSeq
	}
}

// newCouchClient returns a client on db; edit adjusts the options.
func newCouchClient(t *testing.T, db string, edit func(*Options)) *Client {
	t.Helper()
	return mustNew(t, Options{SourceType: config.SourceCouchDB, URL: db, Slack: 300 * time.Millisecond, RequestTimeout: 10 * time.Second}, edit)
}

func TestCouchFeedReadsWinners(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		edit func(*Options)
	}{
		{name: "include_docs", edit: func(o *Options) { o.Fetch, o.Limit = config.FetchIncludeDocs, 4 }},
		{name: "bulk_get", edit: func(o *Options) { o.Fetch, o.Limit = config.FetchBulkGet, 4 }},
		{name: "per-document get", edit: func(o *Options) {
			// Edge Server has no _bulk_get; the per-document path works on any source.
			o.SourceType, o.Fetch, o.Limit = config.SourceEdgeServer, config.FetchBulkGet, 5
		}},
		{name: "include_docs one row a page", edit: func(o *Options) { o.Fetch, o.Limit = config.FetchIncludeDocs, 1 }},
		{name: "active_only", edit: func(o *Options) { o.Fetch, o.Limit, o.ActiveOnly = config.FetchBulkGet, 3, true }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := testenv.CouchDB(t)
			want := fixture(t, db)
			c := newCouchClient(t, db, tt.edit)
			if c.o.ActiveOnly {
				for id, s := range want {
					if s.Deleted {
						delete(want, id)
					}
				}
			}
			got, _, requests := readAll(t, c, nil)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("documents (-want +got):\n%s", diff)
			}
			if min := len(want)/c.o.Limit + 1; requests < min {
				t.Errorf("read the feed in %d requests, want at least %d with limit %d", requests, min, c.o.Limit)
			}
		})
	}
}

func TestCouchLongPoll(t *testing.T) {
	t.Parallel()
	db := testenv.CouchDB(t)
	bulkDocs(t, db, true, map[string]any{"_id": "a", "v": "1"}, map[string]any{"_id": "b/c", "v": "1"})
	c := newCouchClient(t, db, func(o *Options) { o.Slack = 500 * time.Millisecond })
	_, last, _ := readAll(t, c, nil)

	t.Run("nothing new", func(t *testing.T) {
		const timeout = time.Second
		start := time.Now()
		b, err := c.Changes(t.Context(), last, timeout)
		checkBatch(t, b, err, &Batch{Rows: []Row{}, LastSeq: last, Pending: -1})
		if d := time.Since(start); d < timeout || d > timeout+c.o.Slack+time.Second {
			t.Errorf("long-poll returned after %s, want about %s (timeout %s + slack %s)", d, timeout+c.o.Slack, timeout, c.o.Slack)
		}
	})

	t.Run("a change wakes it", func(t *testing.T) {
		// The feed may answer before the write's own answer arrives: the
		// test waits for that too, so that the write ends within it.
		wrote := make(chan struct{})
		time.AfterFunc(300*time.Millisecond, func() {
			defer close(wrote)
			bulkDocs(t, db, true, map[string]any{"_id": "new one", "v": "1"})
		})
		defer func() { <-wrote }()
		start := time.Now()
		b, err := c.Changes(t.Context(), last, 20*time.Second)
		if err != nil {
			t.Fatalf("Changes: %v", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("long-poll returned after %s, want soon after the write", d)
		}
		if len(b.Rows) != 1 || b.Rows[0].ID != "new one" || len(b.Rows[0].Doc) == 0 {
			t.Fatalf("rows = %+v, want the new document with its body", b.Rows)
		}
		if bytes.Equal(b.LastSeq, last) {
			t.Errorf("last_seq stayed %s after a change", last)
		}
	})
}

// TestCouchConflictWinnerDeleted deletes the winning branch of a conflict:
// the feed must then report the other branch's revision as the winner, live.
func TestCouchConflictWinnerDeleted(t *testing.T) {
	t.Parallel()
	for _, fetch := range []string{config.FetchIncludeDocs, config.FetchBulkGet} {
		t.Run(fetch, func(t *testing.T) {
			t.Parallel()
			db := testenv.CouchDB(t)
			c := newCouchClient(t, db, func(o *Options) { o.Fetch = fetch })
			branch := func(rev, name string) map[string]any {
				return map[string]any{"_id": "k/1", "_rev": rev, "branch": name, "_revisions": map[string]any{
					"start": 2, "ids": []string{strings.TrimPrefix(rev, "2-"), strings.TrimPrefix(revRoot, "1-")},
				}}
			}
			bulkDocs(t, db, false, branch(revA, "A"), branch(revF, "F"))

			got, last, _ := readAll(t, c, nil)
			if diff := cmp.Diff(map[string]docState{"k/1": {Rev: revF}}, got); diff != "" {
				t.Errorf("before the delete (-want +got):\n%s", diff)
			}

			bulkDocs(t, db, true, map[string]any{"_id": "k/1", "_rev": revF, "_deleted": true})
			b, err := c.Changes(t.Context(), last, time.Second)
			if err != nil {
				t.Fatalf("Changes: %v", err)
			}
			if err := c.FetchDocs(t.Context(), b.Rows); err != nil {
				t.Fatalf("FetchDocs: %v", err)
			}
			if len(b.Rows) != 1 {
				t.Fatalf("rows = %+v, want one for k/1", b.Rows)
			}
			r := b.Rows[0]
			if r.ID != "k/1" || r.Rev != revA || r.Deleted {
				t.Errorf("row = %s rev %s deleted %t, want k/1 rev %s live", r.ID, r.Rev, r.Deleted, revA)
			}
			var body struct{ Branch string }
			if err := json.Unmarshal(r.Doc, &body); err != nil || body.Branch != "A" {
				t.Errorf("body = %s (%v), want branch A", r.Doc, err)
			}

			doc, rev, err := c.Get(t.Context(), "k/1")
			if err != nil || rev != revA || !strings.Contains(string(doc), `"branch":"A"`) {
				t.Errorf("Get = %s, %q, %v; want branch A at %s", doc, rev, err, revA)
			}
			var winners []DocRev
			if err := c.Winners(t.Context(), 10, func(p []DocRev) error { winners = append(winners, p...); return nil }); err != nil {
				t.Fatalf("Winners: %v", err)
			}
			if diff := cmp.Diff([]DocRev{{ID: "k/1", Rev: revA}}, winners); diff != "" {
				t.Errorf("winners (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCouchFetchGoneRevision asks for revisions the source no longer has.
func TestCouchFetchGoneRevision(t *testing.T) {
	t.Parallel()
	for _, source := range []string{config.SourceCouchDB, config.SourceEdgeServer} {
		t.Run(source, func(t *testing.T) {
			t.Parallel()
			db := testenv.CouchDB(t)
			revs := bulkDocs(t, db, true, map[string]any{"_id": "live/1", "v": "1"}, map[string]any{"_id": "gone one", "v": "1"})
			revs = append(revs, bulkDocs(t, db, true, map[string]any{"_id": "live/1", "_rev": revs[0], "v": "2"})...)
			bulkDocs(t, db, true, map[string]any{"_id": "gone one", "_rev": revs[1], "_deleted": true})
			c := newCouchClient(t, db, func(o *Options) { o.SourceType, o.Fetch = source, config.FetchBulkGet })

			rows := []Row{
				{Seq: raw(`1`), ID: "live/1", Rev: "7-0123456789abcdef0123456789abcdef"},      // never existed
				{Seq: raw(`2`), ID: "gone one", Rev: "5-0123456789abcdef0123456789abcdef"},    // never existed, doc deleted
				{Seq: raw(`3`), ID: "never there", Rev: "1-0123456789abcdef0123456789abcdef"}, // no such doc
				{Seq: raw(`4`), ID: "live/1", Rev: revs[0]},                                   // superseded, not compacted
			}
			if err := c.FetchDocs(t.Context(), rows); err != nil {
				t.Fatalf("FetchDocs: %v", err)
			}
			want := []Row{
				{Seq: raw(`1`), ID: "live/1", Rev: revs[2]},
				{Seq: raw(`2`), ID: "gone one", Rev: "5-0123456789abcdef0123456789abcdef", Deleted: true},
				{Seq: raw(`3`), ID: "never there", Rev: "1-0123456789abcdef0123456789abcdef", Deleted: true},
				// An old revision the source still has comes back as it was;
				// the feed reports the newer one at a later seq.
				{Seq: raw(`4`), ID: "live/1", Rev: revs[0]},
			}
			if diff := cmp.Diff(want, rows, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Doc" }, cmp.Ignore())); diff != "" {
				t.Errorf("rows (-want +got):\n%s", diff)
			}
			if !strings.Contains(string(rows[0].Doc), `"v":"2"`) || rows[1].Doc != nil || rows[2].Doc != nil ||
				!strings.Contains(string(rows[3].Doc), `"v":"1"`) {
				t.Errorf("bodies = %s, %s, %s, %s; want the winner's, none, none, the old one's",
					rows[0].Doc, rows[1].Doc, rows[2].Doc, rows[3].Doc)
			}
		})
	}
}

func TestCouchWinners(t *testing.T) {
	t.Parallel()
	db := testenv.CouchDB(t)
	states := fixture(t, db)
	var want []DocRev
	for id, s := range states {
		if !s.Deleted {
			want = append(want, DocRev{ID: id, Rev: s.Rev})
		}
	}
	c := newCouchClient(t, db, nil)
	var got []DocRev
	pages := 0
	err := c.Winners(t.Context(), 3, func(p []DocRev) error {
		pages++
		if len(p) > 3 {
			t.Errorf("page of %d, want at most 3", len(p))
		}
		got = append(got, p...)
		return nil
	})
	if err != nil {
		t.Fatalf("Winners: %v", err)
	}
	byID := func(a, b DocRev) int { return strings.Compare(a.ID, b.ID) }
	slices.SortFunc(got, byID)
	slices.SortFunc(want, byID)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("winners (-want +got):\n%s", diff)
	}
	if wantPages := (len(want) + 2) / 3; pages != wantPages {
		t.Errorf("%d pages, want %d", pages, wantPages)
	}

	stop := errors.New("stop")
	if err := c.Winners(t.Context(), 3, func([]DocRev) error { return stop }); err != stop {
		t.Errorf("Winners with a failing callback = %v, want its error as is", err)
	}
}

func TestCouchErrors(t *testing.T) {
	t.Parallel()
	db := testenv.CouchDB(t)
	c := newCouchClient(t, db, nil)
	if _, _, err := c.Get(t.Context(), "no/such doc"); !errors.Is(err, ErrNotFound) || Transient(err) {
		t.Errorf("Get(missing) = %v, want a permanent ErrNotFound", err)
	}

	missing := newCouchClient(t, db+"-missing", nil)
	_, err := missing.Changes(t.Context(), nil, time.Second)
	var se *StatusError
	if !errors.As(err, &se) || se.Status != http.StatusNotFound || se.Op != "changes" || Transient(err) {
		t.Errorf("Changes on a missing database = %v, want a permanent 404 from changes", err)
	}

	refused := newCouchClient(t, "http://127.0.0.1:1/nothing", nil)
	if _, err := refused.Changes(t.Context(), nil, time.Second); err == nil || !Transient(err) {
		t.Errorf("Changes on a closed port = %v, want a transient error", err)
	}
}
