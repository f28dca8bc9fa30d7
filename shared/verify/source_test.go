package verify

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// countingTransport counts the requests sent to the source, by method and
// the path below the database ("GET doc", "POST _bulk_get", "GET _changes").
type countingTransport struct {
	db string // the database's path
	mu sync.Mutex
	n  map[string]int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	what, _ := strings.CutPrefix(r.URL.EscapedPath(), c.db+"/")
	if !strings.HasPrefix(what, "_") {
		what = "doc"
	}
	c.mu.Lock()
	c.n[r.Method+" "+what]++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

func (c *countingTransport) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.n {
		if v > 0 {
			out[k] = v
		}
	}
	clear(c.n)
	return out
}

// couchSource is a fresh pouchdb-server database read through a feed client
// whose requests are counted.
type couchSource struct {
	t      *testing.T
	db     string
	client *feed.Client
	reqs   *countingTransport
}

func newCouchSource(t *testing.T) *couchSource {
	t.Helper()
	db := testenv.CouchDB(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	reqs := &countingTransport{db: u.EscapedPath(), n: map[string]int{}}
	client, err := feed.New(feed.Options{SourceType: config.SourceCouchDB, URL: db, Limit: 100,
		HTTPClient: &http.Client{Transport: reqs}})
	if err != nil {
		t.Fatal(err)
	}
	return &couchSource{t: t, db: db, client: client, reqs: reqs}
}

// put writes documents (id → body) in one _bulk_docs request and returns
// their revisions.
func (s *couchSource) put(docs map[string]map[string]any) map[string]string {
	s.t.Helper()
	var req struct {
		Docs []map[string]any `json:"docs"`
	}
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range docs {
			if !yield(id) {
				return
			}
		}
	}) {
		d := map[string]any{"_id": id}
		for k, v := range docs[id] {
			d[k] = v
		}
		req.Docs = append(req.Docs, d)
	}
	var answer []struct {
		ID, Rev, Error string
	}
	s.post("/_bulk_docs", req, &answer)
	revs := map[string]string{}
	for _, a := range answer {
		if a.Error != "" || a.Rev == "" {
			s.t.Fatalf("bulk_docs %s: %q", a.ID, a.Error)
		}
		revs[a.ID] = a.Rev
	}
	return revs
}

// del deletes documents (id → rev).
func (s *couchSource) del(revs map[string]string) {
	s.t.Helper()
	var req struct {
		Docs []map[string]any `json:"docs"`
	}
	for id, rev := range revs {
		req.Docs = append(req.Docs, map[string]any{"_id": id, "_rev": rev, "_deleted": true})
	}
	var answer []struct{ ID, Error string }
	s.post("/_bulk_docs", req, &answer)
	for _, a := range answer {
		if a.Error != "" {
			s.t.Fatalf("delete %s: %s", a.ID, a.Error)
		}
	}
}

func (s *couchSource) post(path string, body, answer any) {
	s.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := http.Post(s.db+path, "application/json", bytes.NewReader(b))
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		s.t.Fatalf("post %s: status %d", path, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(answer); err != nil {
		s.t.Fatalf("post %s: %v", path, err)
	}
}

// pagedDocID returns the id of the i-th document of the paging tests: every
// fiftieth one, from the seventh, has a non-ASCII id, which _all_docs leaves
// out.
func pagedDocID(i int) string {
	if i%50 == 7 {
		return fmt.Sprintf("注文-%03d", i)
	}
	return fmt.Sprintf("doc-%03d", i)
}

// pagedDocs writes 250 documents named by pagedDocID, with the bodies body
// makes, then deletes doc-010 and 注文-057. It returns the revisions written
// and those of the deleted documents, and sets the request counts to zero.
func (s *couchSource) pagedDocs(body func(i int, id string) map[string]any) (revs, gone map[string]string) {
	s.t.Helper()
	docs := map[string]map[string]any{}
	for i := range 250 {
		id := pagedDocID(i)
		docs[id] = body(i, id)
	}
	revs = s.put(docs)
	gone = map[string]string{"doc-010": revs["doc-010"], "注文-057": revs["注文-057"]}
	s.del(gone)
	s.reqs.counts()
	return revs, gone
}

// TestRepairReadsInPages repairs 250 documents of pouchdb-server, some
// deleted, some never written, and counts the requests: the bodies come in
// _bulk_get pages of repairBatch documents, not one GET per document.
func TestRepairReadsInPages(t *testing.T) {
	t.Parallel()
	src := newCouchSource(t)
	revs, gone := src.pagedDocs(func(i int, id string) map[string]any { return map[string]any{"n": i, "name": "ü " + id} })
	ids := append(slices.Collect(maps.Keys(revs)), "never-written")

	snd := &fakeSender{}
	r := &Repairer{Source: src.client, Leases: &fakeLeases{st: lease.State{Exists: true, Generation: 4, Released: true}},
		Sender: snd, Job: &config.Job{ID: "orders", Lease: config.Lease{TTL: config.Duration(time.Minute)}},
		Target: fanout.Target{Output: "pg"}, Owner: "verify"}
	res, err := r.Repair(t.Context(), ids)
	if err != nil {
		t.Fatalf("Repair: %v", err)
	}
	if res.Live != 248 || res.Tombstones != 3 {
		t.Errorf("repair enqueued %d live documents and %d tombstones, want 248 and 3", res.Live, res.Tombstones)
	}
	for _, e := range snd.sent {
		_, deleted := gone[e.DocID]
		if e.DocID == "never-written" {
			deleted = true
		}
		if e.Deleted != deleted {
			t.Errorf("%s: deleted %t, want %t", e.DocID, e.Deleted, deleted)
			continue
		}
		if deleted {
			continue
		}
		var body map[string]any
		if err := json.Unmarshal(e.Doc, &body); err != nil {
			t.Fatalf("%s: body %v", e.DocID, err)
		}
		if e.Rev != revs[e.DocID] || body["_rev"] != revs[e.DocID] || body["name"] != "ü "+e.DocID {
			t.Errorf("%s: rev %s, body %s; want rev %s", e.DocID, e.Rev, e.Doc, revs[e.DocID])
		}
	}
	// 251 documents in pages of 100: three _bulk_get requests, one request
	// for the feed position, and one GET for each document the answer does
	// not settle (pouchdb-server answers {} for a deleted document).
	want := map[string]int{"POST _bulk_get": 3, "GET _changes": 1, "GET doc": 3}
	got := src.reqs.counts()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("requests to the source: %v, want %v", got, want)
	}
}

// TestCompareListsTheFeed compares a pouchdb-server database with an output
// that lacks a document whose id _all_docs leaves out, holds one with other
// content and one deleted in the source, and counts the requests: the
// listing reads _changes pages, the content comparison and the recheck read
// bodies with _bulk_get pages.
func TestCompareListsTheFeed(t *testing.T) {
	t.Parallel()
	src := newCouchSource(t)
	revs, _ := src.pagedDocs(func(i int, _ string) map[string]any { return map[string]any{"n": i} })
	out := &fakeOutput{docs: map[string]Doc{}, tampered: map[string]bool{"doc-020": true}}
	for id, rev := range revs {
		if id != "注文-107" && id != "注文-057" {
			out.docs[id] = held(rev)
		}
	}

	rep, err := Compare(t.Context(), src.client, out, Options{PageSize: 100, Content: true, Recheck: true})
	if err != nil {
		t.Fatalf("Compare: %v", err)
	}
	want := []Drift{
		{Kind: Missing, DocID: "注文-107", SourceRev: revs["注文-107"]},
		{Kind: Content, DocID: "doc-020", SourceRev: revs["doc-020"], OutputRev: revs["doc-020"], Problem: "tampered"},
		{Kind: Unexpected, DocID: "doc-010", OutputRev: revs["doc-010"]},
	}
	if fmt.Sprint(want) != fmt.Sprint(rep.Drift) {
		t.Errorf("drift:\n got %v\nwant %v", rep.Drift, want)
	}
	if rep.SourceDocs != 248 || rep.ContentChecked != 247 {
		t.Errorf("source documents %d, content compared for %d; want 248 and 247", rep.SourceDocs, rep.ContentChecked)
	}
	// 250 feed rows in pages of 100 and an empty page; 247 bodies in pages
	// of 100; one page for the recheck of the three, and one GET for the
	// deleted one, which pouchdb-server's _bulk_get answers with {}.
	wantReqs := map[string]int{"GET _changes": 4, "POST _bulk_get": 4, "GET doc": 1}
	if got := src.reqs.counts(); fmt.Sprint(got) != fmt.Sprint(wantReqs) {
		t.Errorf("requests to the source: %v, want %v", got, wantReqs)
	}
}
