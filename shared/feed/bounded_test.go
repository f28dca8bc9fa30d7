package feed

import (
	"encoding/json"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
)

// heldMax is what a test accepts a page to hold in bodies with the default
// options: far below the poller's 256 MB.
const heldMax = 32 << 20

// TestChangesPageOfLargeDocsIsBounded reads a feed whose first page (the
// default limit of 500) would be 200 MB of 400 KB documents. The page comes
// back short, holding at most heldMax of bodies, every row whole; the source
// is not read to its end; the next page resumes right after the last row
// kept, with a limit the client shrank to what fitted; and reading on
// delivers every document exactly once.
func TestChangesPageOfLargeDocsIsBounded(t *testing.T) {
	t.Parallel()
	src := newBigSource(t, 500, 400<<10)
	c := mustNew(t, Options{SourceType: config.SourceCouchDB, URL: src.db(), RequestTimeout: 30 * time.Second}, smallReceiveBuffer)
	b, err := c.Changes(t.Context(), nil, time.Second)
	if err != nil {
		t.Fatalf("Changes: %v", err)
	}
	kept := len(b.Rows)
	if kept == 0 || kept >= 500 {
		t.Fatalf("first page holds %d rows, want a bounded part of the 500", kept)
	}
	if n := docBytes(b.Rows); n > heldMax {
		t.Errorf("first page holds %d bytes of bodies, want at most %d", n, heldMax)
	}
	src.checkBodies(t, b.Rows)
	if want := b.Rows[kept-1].Seq; string(b.LastSeq) != string(want) || !b.Full || b.CaughtUp() {
		t.Errorf("LastSeq %s Full %t CaughtUp %t, want the last row's seq %s, full, not caught up", b.LastSeq, b.Full, b.CaughtUp(), want)
	}
	first := src.requests()[0]
	if first.Whole || first.Written > 2*heldMax {
		t.Errorf("the source wrote %d bytes (whole answer: %t), want the client to stop reading after the page", first.Written, first.Whole)
	}

	seen := map[string]int{}
	for _, r := range b.Rows {
		seen[r.ID]++
	}
	src.readToEnd(t, c, b.LastSeq, 100, false, seen, func(page int, b *Batch) {
		if n := docBytes(b.Rows); n > heldMax {
			t.Errorf("page %d holds %d bytes of bodies, want at most %d", page, n, heldMax)
		}
	})
	reqs := src.requests()
	if got := reqs[1].Limit; got > kept {
		t.Errorf("second request's limit = %d, want at most the %d rows the first page kept", got, kept)
	}
}

// TestChangesPageGrowsBack shrinks the page on large documents, then reads
// small ones: the limit grows back to the configured one.
func TestChangesPageGrowsBack(t *testing.T) {
	t.Parallel()
	large := newBigSource(t, 200, 400<<10)
	small := newBigSource(t, 5000, 100)
	c := mustNew(t, Options{SourceType: config.SourceCouchDB, URL: large.db(), Limit: 400, RequestTimeout: 30 * time.Second})
	if _, err := c.Changes(t.Context(), nil, time.Second); err != nil {
		t.Fatalf("Changes: %v", err)
	}
	// The same client reads the small documents (the source's documents
	// got smaller): the client's base URL is swapped for the test.
	c.base = small.db()
	since := json.RawMessage(nil)
	for range 12 {
		b, err := c.Changes(t.Context(), since, time.Second)
		if err != nil {
			t.Fatalf("Changes: %v", err)
		}
		since = b.LastSeq
	}
	var limits []int
	for _, r := range small.requests() {
		limits = append(limits, r.Limit)
	}
	if limits[0] >= 400 {
		t.Fatalf("limits %v: the large page did not shrink the next one", limits)
	}
	if last := limits[len(limits)-1]; last != 400 {
		t.Errorf("limits %v, want them back at 400", limits)
	}
	for i := 1; i < len(limits); i++ {
		if limits[i] < limits[i-1] {
			t.Errorf("limits %v shrink on small documents", limits)
		}
	}
}

// TestChangesRowOverAnswerLimit: a document bigger than the answer limit is
// an error that names the limit, not an attempt to hold it.
func TestChangesRowOverAnswerLimit(t *testing.T) {
	t.Parallel()
	src := newBigSource(t, 3, 40<<20)
	c := mustNew(t, Options{SourceType: config.SourceCouchDB, URL: src.db(), RequestTimeout: 30 * time.Second}, smallReceiveBuffer)
	b, err := c.Changes(t.Context(), nil, time.Second)
	if err == nil {
		t.Fatalf("Changes = %d rows, want an error", len(b.Rows))
	}
	if !strings.Contains(err.Error(), "max_answer_bytes") || !strings.Contains(err.Error(), strconv.Itoa(32<<20)) {
		t.Errorf("error %q does not name the limit (max_answer_bytes %d)", err, 32<<20)
	}
	if Transient(err) {
		t.Errorf("Transient(%v) = true: the same request gets the same answer", err)
	}
	// What the source wrote includes what the sockets buffered (see
	// smallReceiveBuffer).
	if r := src.requests()[0]; r.Whole || r.Written > 64<<20 {
		t.Errorf("the source wrote %d bytes (whole answer: %t) before the client stopped, want about the limit", r.Written, r.Whole)
	}
}

// TestFetchDocsSplitsBulkGetByBytes fetches 150 bodies of 400 KB (60 MB)
// with _bulk_get: no answer may exceed the answer limit, so the requests
// are split by bytes learnt from the answers, and every body arrives.
func TestFetchDocsSplitsBulkGetByBytes(t *testing.T) {
	t.Parallel()
	for _, source := range []string{config.SourceCouchDB, config.SourceSyncGateway} {
		t.Run(source, func(t *testing.T) {
			t.Parallel()
			src := newBigSource(t, 150, 400<<10)
			c := mustNew(t, Options{SourceType: source, URL: src.db(), Fetch: config.FetchBulkGet, RequestTimeout: 30 * time.Second})
			rows := src.rowsFrom(0, 150)
			if err := c.FetchDocs(t.Context(), rows); err != nil {
				t.Fatalf("FetchDocs: %v", err)
			}
			src.checkBodies(t, rows)
			var asked []int
			for _, r := range src.requests() {
				if r.Path != "/db/_bulk_get" {
					t.Errorf("unexpected request %s", r.Path)
					continue
				}
				asked = append(asked, r.Asked)
				if r.Whole && r.Written > heldMax {
					t.Errorf("a _bulk_get answer of %d documents was %d bytes, want at most %d", r.Asked, r.Written, heldMax)
				}
			}
			if len(asked) < 2 {
				t.Errorf("_bulk_get sizes %v, want the 60 MB split", asked)
			}
		})
	}
}

// TestChangesStreamsTheAnswer reads a 100 MiB page of 1 MiB documents and
// counts what the client allocated: the answer is decoded as it arrives and
// read no further than the page's budget, so the allocations are a small
// multiple of the budget, not of the answer. Not parallel: it reads the
// process's allocation counter.
func TestChangesStreamsTheAnswer(t *testing.T) {
	src := newBigSource(t, 100, 1<<20)
	for i := range 100 {
		src.doc(i) // built before counting
	}
	c := mustNew(t, Options{SourceType: config.SourceCouchDB, URL: src.db(), RequestTimeout: 30 * time.Second})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b, err := c.Changes(t.Context(), nil, time.Second)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatalf("Changes: %v", err)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d rows, %d bytes of bodies, %d bytes allocated", len(b.Rows), docBytes(b.Rows), alloc)
	if alloc > 4*heldMax {
		t.Errorf("reading the page allocated %d bytes, want at most %d", alloc, 4*heldMax)
	}
}

// TestFetchBatchWithinBudget reads a feed of 120 documents of 400 KB
// without bodies, page by page, and fetches each page's bodies with
// FetchBatch under a 4 MiB budget: every page is cut to what fits (each
// row kept whole, the first always), the next page starts right after it
// and asks for that many rows, and every document arrives once.
func TestFetchBatchWithinBudget(t *testing.T) {
	t.Parallel()
	for _, source := range []string{config.SourceCouchDB, config.SourceSyncGateway, config.SourceEdgeServer} {
		t.Run(source, func(t *testing.T) {
			t.Parallel()
			const budget = 4 << 20
			src := newBigSource(t, 120, 400<<10)
			c := mustNew(t, Options{SourceType: source, URL: src.db(), Fetch: config.FetchBulkGet, Limit: 50,
				PageBytes: budget, RequestTimeout: 30 * time.Second})
			var sizes []int
			src.readToEnd(t, c, nil, 61, true, map[string]int{}, func(_ int, b *Batch) {
				if len(b.Rows) == 0 && !b.CaughtUp() {
					t.Fatalf("an empty page that is not the end: %+v", b)
				}
				sizes = append(sizes, len(b.Rows))
				if n := docBytes(b.Rows); n > budget+400<<10 {
					t.Errorf("page holds %d bytes, want at most the budget and one body (%d)", n, budget+400<<10)
				}
				if len(b.Rows) > 0 && b.Cut != "" && string(b.LastSeq) != string(b.Rows[len(b.Rows)-1].Seq) {
					t.Errorf("cut page ends at %s, want its last row's seq", b.LastSeq)
				}
			})
			var limits []int
			for _, r := range src.requests() {
				if r.Path == "/db/_changes" {
					limits = append(limits, r.Limit)
				}
			}
			t.Logf("page sizes %v, _changes limits %v", sizes, limits)
			if limits[0] != 50 || limits[1] > sizes[0] {
				t.Errorf("limits %v after a first page of %d rows, want 50, then at most %d", limits, sizes[0], sizes[0])
			}
		})
	}
}

// TestFetchBatchGrowsBack: after pages of large bodies, pages of small ones
// double the page again up to the configured limit (bulk_get).
func TestFetchBatchGrowsBack(t *testing.T) {
	t.Parallel()
	large := newBigSource(t, 40, 400<<10)
	small := newBigSource(t, 3000, 100)
	c := mustNew(t, Options{SourceType: config.SourceCouchDB, URL: large.db(), Fetch: config.FetchBulkGet, Limit: 200,
		PageBytes: 2 << 20, RequestTimeout: 30 * time.Second})
	b, err := c.Changes(t.Context(), nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.FetchBatch(t.Context(), b); err != nil || b.Cut == "" {
		t.Fatalf("FetchBatch: %v, cut %q; want a cut page", err, b.Cut)
	}
	c.base = small.db()
	var since json.RawMessage
	for range 10 {
		b, err := c.Changes(t.Context(), since, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.FetchBatch(t.Context(), b); err != nil {
			t.Fatal(err)
		}
		since = b.LastSeq
	}
	var limits []int
	for _, r := range small.requests() {
		if r.Path == "/db/_changes" {
			limits = append(limits, r.Limit)
		}
	}
	if limits[0] >= 200 || limits[len(limits)-1] != 200 {
		t.Errorf("_changes limits %v, want a shrunk first one growing back to 200", limits)
	}
}

// TestChangesPageShrinksWhenItCannotArriveInTime: a source that takes
// longer than the request's deadline to answer a large page (pouchdb-server
// builds an include_docs answer whole before sending it) gets half the rows
// asked at each attempt, until a page arrives; each failed attempt is a
// transient error.
func TestChangesPageShrinksWhenItCannotArriveInTime(t *testing.T) {
	t.Parallel()
	f := newFakeSource(t, func(w http.ResponseWriter, r *http.Request) {
		if n, _ := strconv.Atoi(r.URL.Query().Get("limit")); n > 60 {
			select { // too slow for the deadline
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
			return
		}
		reply(http.StatusOK, `{"results":[{"seq":1,"id":"a","changes":[{"rev":"1-a"}],"doc":{"_id":"a","_rev":"1-a"}}],"last_seq":1}`)(w, r)
	})
	// A deadline of 1.1 s: the small page, answered at once, arrives within
	// it on a loaded machine too (a 200 ms one was missed in a make test).
	c := f.client(func(o *Options) { o.Limit, o.Slack = 400, time.Second })
	var errs int
	for range 6 {
		_, err := c.Changes(t.Context(), nil, 100*time.Millisecond)
		if err == nil {
			break
		}
		if !Transient(err) {
			t.Fatalf("Changes: %v, want a transient error", err)
		}
		errs++
	}
	var limits []string
	for _, r := range f.requests() {
		limits = append(limits, queryOf(t, r.RequestURI).Get("limit"))
	}
	if want := []string{"400", "200", "100", "50"}; !slices.Equal(limits, want) || errs != 3 {
		t.Errorf("limits asked %v with %d errors, want %v and 3", limits, errs, want)
	}
}
