package feed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/changes-worker/changes-worker/shared/config"
)

// bulkGetMax bounds the documents of one _bulk_get request.
const bulkGetMax = 500

// bulkGetFirst is how many documents a _bulk_get asks for before the client
// has seen any body. Too many costs the source work, never memory: the
// answer is read no further than its limit (and a page's budget), and what
// came whole is used.
const bulkGetFirst = 100

// FetchDocs fills Doc for every row that is neither deleted nor removed and
// has no body yet (so with include_docs it only fills the gaps):
//
//   - Edge Server, which has no _bulk_get: GET {url}/{id}?rev=REV per row,
//     at most Options.Concurrency at a time;
//   - every other source: POST {url}/_bulk_get?revs=false, answered as JSON
//     (CouchDB) or multipart/mixed (Sync Gateway family), read as the answer
//     arrives. Requests are split by bytes: before any body is seen a request
//     asks for 100 documents, then for as many as the average body
//     seen puts at a quarter of Options.MaxAnswerBytes (at most 500). An
//     answer cut at MaxAnswerBytes keeps the bodies that came whole and the
//     rest is asked again; a single body over the limit is a *LimitError.
//
// A row without a revision (Rev "", see Changes) gets the document's current
// winner. A revision the source still holds comes back as it was, even when
// a newer one has been written since (the feed reports that one at a later
// seq). When the requested revision is gone (compacted away, or unknown to
// this source), the document's current winner is fetched instead and Rev and
// Doc are set to it; when there is no winner (deleted, 404) the row is marked
// Deleted. A revision the reader can no longer see (Sync Gateway "_removed",
// or 403 on the fallback GET from a Sync Gateway family source) marks the row
// Removed. Tombstones and removals keep Doc nil.
//
// FetchDocs changes rows in place and either fills every row or returns an
// error; on error some rows may be filled, and calling it again is safe. It
// does not retry. Errors name the operation and, for one document, its id;
// see Transient. Concurrent calls must not share rows.
func (c *Client) FetchDocs(ctx context.Context, rows []Row) error {
	_, _, err := c.fetch(ctx, rows, 0)
	return err
}

// FetchBatch fills the bodies of a batch's rows as FetchDocs does, within
// the page's budget (Options.PageBytes): once the bodies the batch holds
// reach it, fetching stops and the batch is cut before the first row still
// without its body (see Batch.CutBefore), so the next page starts there. The
// first body a batch needs is always fetched, whatever its size (up to
// MaxAnswerBytes), and a batch is only cut after a row that has a seq. A cut
// makes the client ask for as many rows next time; with bulk_get or Edge
// Server a full page that used at most half the budget doubles it again, up
// to Options.Limit (include_docs pages adapt in Changes). Errors are
// FetchDocs's.
func (c *Client) FetchBatch(ctx context.Context, b *Batch) error {
	n, used, err := c.fetch(ctx, b.Rows, c.o.PageBytes)
	if err != nil {
		return err
	}
	if n < len(b.Rows) {
		b.CutBefore(n, nil, fmt.Sprintf("page_bytes: the bodies fetched reached %d bytes", c.o.PageBytes))
		c.pages.cut(n)
		return nil
	}
	if c.o.Fetch != config.FetchIncludeDocs {
		c.pages.done(b.Full, used, c.o.PageBytes)
	}
	return nil
}

// fetch fills the rows' bodies; with a budget it stops once they hold that
// many bytes (0: no budget). It returns how many leading rows are complete
// (len(rows) unless the budget stopped it) and the bytes of bodies they hold.
func (c *Client) fetch(ctx context.Context, rows []Row, budget int64) (int, int64, error) {
	var used int64
	var want, winners []int
	for i := range rows {
		switch {
		case !rows[i].needsBody():
			used += int64(len(rows[i].Doc))
		case rows[i].Rev == "":
			winners = append(winners, i) // no revision to ask for: the winner
		default:
			want = append(want, i)
		}
	}
	if c.o.SourceType == config.SourceEdgeServer {
		want = append(want, winners...)
		slices.Sort(want)
		return c.fetchEach(ctx, rows, want, budget, used)
	}
	n := len(rows)
	queue := want
	force1 := false // the last request had nothing whole under the limit
	for len(queue) > 0 {
		if budget > 0 && used >= budget && resumable(rows, queue[0]) {
			n = queue[0]
			break
		}
		count := c.bulkCount(len(queue), budget, used)
		if force1 {
			count = 1
		}
		chunk := queue[:count]
		res, err := c.bulkGet(ctx, rows, chunk, func(got int64, firstDone bool) bool {
			return budget > 0 && firstDone && used+got >= budget
		})
		if err != nil {
			return 0, 0, err
		}
		if len(res.answered) == 0 {
			// The answer stopped before answering any row asked for.
			first := &rows[chunk[0]]
			switch {
			case !res.over:
				return 0, 0, malformed("bulk_get", "the answer broke before answering %q rev %s: %v", first.ID, first.Rev, res.broke)
			case len(chunk) == 1:
				return 0, 0, &LimitError{Op: "bulk_get", Bound: BoundAnswerBytes, Limit: c.o.MaxAnswerBytes,
					Where: fmt.Sprintf("document %q", first.ID)}
			}
		}
		force1 = len(res.answered) == 0 // over the limit: one document at a time
		used += res.bytes
		c.pages.observe(res.bodies, res.bytes)
		winners = append(winners, res.gone...)
		queue = slices.DeleteFunc(slices.Clone(queue), func(i int) bool { return res.answered[i] })
	}
	winners = slices.DeleteFunc(winners, func(i int) bool { return i >= n })
	if err := c.each(ctx, rows, winners, c.fetchWinner); err != nil {
		return 0, 0, err
	}
	for _, i := range winners {
		used += int64(len(rows[i].Doc))
	}
	return n, used, nil
}

// resumable reports whether a batch can end before rows[i]: some row
// before it has a seq to resume from.
func resumable(rows []Row, i int) bool {
	for k := i - 1; k >= 0; k-- {
		if rows[k].Seq != nil {
			return true
		}
	}
	return false
}

// bulkCount is how many documents the next _bulk_get asks for (see
// FetchDocs), within what is left of the budget when there is one.
func (c *Client) bulkCount(queued int, budget, used int64) int {
	avg := c.pages.average()
	if avg <= 0 {
		return min(queued, bulkGetFirst)
	}
	target := c.o.MaxAnswerBytes / 4
	if budget > 0 {
		target = min(target, budget-used)
	}
	return min(queued, bulkGetMax, max(int(target/avg), 1))
}

// fetchEach fetches with one GET per row (Edge Server), up to
// Options.Concurrency at a time; with a budget, a round asks for no more
// bodies than the average size seen says are left in it, and fetching stops
// once it is reached.
func (c *Client) fetchEach(ctx context.Context, rows []Row, want []int, budget, used int64) (int, int64, error) {
	for start := 0; start < len(want); {
		if budget > 0 && used >= budget && resumable(rows, want[start]) {
			return want[start], used, nil
		}
		n := c.o.Concurrency
		if avg := c.pages.average(); budget > 0 && avg > 0 {
			n = min(n, max(int((budget-used)/avg), 1))
		}
		round := want[start:min(start+n, len(want))]
		if err := c.each(ctx, rows, round, c.fetchRev); err != nil {
			return 0, 0, err
		}
		var got int64
		for _, i := range round {
			got += int64(len(rows[i].Doc))
		}
		used += got
		c.pages.observe(len(round), got)
		start += len(round)
	}
	return len(rows), used, nil
}

// Get returns a document's current winning body and revision. A missing or
// deleted document is an error matching ErrNotFound. A document the reader
// may not see is a *StatusError with status 403 (Sync Gateway family);
// because Sync Gateway also answers 403 for a deleted document whose
// tombstone left the reader's channels, Get then asks for the document's
// leaf revisions (see leafState) and reports a deletion as not found. Get
// is safe for concurrent use.
func (c *Client) Get(ctx context.Context, id string) (json.RawMessage, string, error) {
	body, err := c.getDoc(ctx, id, "")
	if forbidden(err) && syncGatewayFamily(c.o.SourceType) {
		st, _, lerr := c.leafState(ctx, id)
		switch {
		case lerr != nil:
			return nil, "", lerr
		case st == leafDeleted:
			return nil, "", &StatusError{Op: "get", Status: http.StatusNotFound, Reason: "deleted"}
		}
		return nil, "", err
	}
	if err != nil {
		return nil, "", err
	}
	m, err := meta(body)
	if err != nil {
		return nil, "", malformed("get", "document %q: %v", id, err)
	}
	switch {
	case m.Deleted:
		return nil, "", &StatusError{Op: "get", Status: http.StatusNotFound, Reason: "deleted"}
	case m.Removed:
		return nil, "", &StatusError{Op: "get", Status: http.StatusForbidden, Reason: "removed"}
	}
	return body, m.Rev, nil
}

// forbidden reports whether err is a 403 answer.
func forbidden(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Status == http.StatusForbidden
}

// leaf states of a document the reader may not read (see leafState).
const (
	leafDeleted = iota + 1 // every leaf revision is a tombstone
	leafRemoved            // a leaf is live but hidden from the reader
)

// leafState tells a deleted document from one the reader may no longer see,
// for the Sync Gateway family, where a GET of either answers 403. It reads
// GET {url}/{id}?open_revs=all, which lists the body of every leaf revision:
// a tombstone as {"_deleted":true,...} even when it left the reader's
// channels, a live revision the reader may not see as {"_removed":true,...}.
// The document is deleted when every leaf is a tombstone (the winner is live
// whenever any leaf is); rev is then the winning tombstone. A document
// unknown to the source (404) counts as deleted.
func (c *Client) leafState(ctx context.Context, id string) (int, string, error) {
	resp, err := c.roundTrip(ctx, "get", http.MethodGet, c.endpoint(docPath(id), url.Values{"open_revs": {"all"}}), nil, c.o.RequestTimeout)
	if errors.Is(err, ErrNotFound) {
		return leafDeleted, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("read leaf revisions of %q: %w", id, err)
	}
	var leaves []struct {
		OK      json.RawMessage `json:"ok"`
		Missing string          `json:"missing"`
	}
	if err := json.Unmarshal(resp.body, &leaves); err != nil {
		return 0, "", malformed("get", "leaf revisions of %q: %v", id, err)
	}
	var tombstones []string
	for _, l := range leaves {
		if isNull(l.OK) {
			continue // a leaf whose body is gone says nothing
		}
		m, err := meta(l.OK)
		if err != nil {
			return 0, "", malformed("get", "leaf revision of %q: %v", id, err)
		}
		if !m.Deleted {
			return leafRemoved, "", nil
		}
		tombstones = append(tombstones, m.Rev)
	}
	if len(tombstones) == 0 {
		return leafRemoved, "", nil
	}
	return leafDeleted, winningRev(tombstones), nil
}

// winningRev picks CouchDB's winner among revisions of equal standing: the
// highest generation, then the greatest revision id.
func winningRev(revs []string) string {
	best := ""
	for _, r := range revs {
		if best == "" || revLess(best, r) {
			best = r
		}
	}
	return best
}

// revLess orders "N-hash" revisions by generation, then by the whole string.
func revLess(a, b string) bool {
	ga, _ := strconv.Atoi(strings.SplitN(a, "-", 2)[0])
	gb, _ := strconv.Atoi(strings.SplitN(b, "-", 2)[0])
	if ga != gb {
		return ga < gb
	}
	return a < b
}

// getDoc fetches a document body, at rev when rev is set.
func (c *Client) getDoc(ctx context.Context, id, rev string) (json.RawMessage, error) {
	var q url.Values
	if rev != "" {
		q = url.Values{"rev": {rev}}
	}
	resp, err := c.roundTrip(ctx, "get", http.MethodGet, c.endpoint(docPath(id), q), nil, c.o.RequestTimeout)
	if err != nil {
		return nil, err
	}
	if !json.Valid(resp.body) {
		return nil, malformed("get", "document %q is not JSON", id)
	}
	return resp.body, nil
}

// fetchRev fills one row with its revision, falling back to the winner.
func (c *Client) fetchRev(ctx context.Context, r *Row) error {
	body, err := c.getDoc(ctx, r.ID, r.Rev)
	if errors.Is(err, ErrNotFound) {
		return c.fetchWinner(ctx, r)
	}
	if err != nil {
		return fmt.Errorf("fetch doc %q rev %s: %w", r.ID, r.Rev, err)
	}
	if err := apply(r, body); err != nil {
		return malformed("get", "document %q: %v", r.ID, err)
	}
	return nil
}

// fetchWinner fills one row whose revision is gone with the current winner.
// For the Sync Gateway family a 403 is told apart with leafState: a deleted
// document is Deleted (at its winning tombstone), any other is Removed.
func (c *Client) fetchWinner(ctx context.Context, r *Row) error {
	body, err := c.getDoc(ctx, r.ID, "")
	switch {
	case errors.Is(err, ErrNotFound):
		r.Deleted, r.Removed, r.Doc = true, false, nil
		return nil
	case forbidden(err) && syncGatewayFamily(c.o.SourceType):
		st, rev, err := c.leafState(ctx, r.ID)
		if err != nil {
			return fmt.Errorf("fetch doc %q winner: %w", r.ID, err)
		}
		if st == leafDeleted {
			r.Deleted, r.Removed = true, false
			if rev != "" {
				r.Rev = rev
			}
		} else {
			r.Removed = true
		}
		r.Doc = nil
		return nil
	case err != nil:
		return fmt.Errorf("fetch doc %q winner: %w", r.ID, err)
	}
	if err := apply(r, body); err != nil {
		return malformed("get", "document %q: %v", r.ID, err)
	}
	return nil
}

// docMeta is the part of a body that says which revision it is.
type docMeta struct {
	ID      string `json:"_id"`
	Rev     string `json:"_rev"`
	Deleted bool   `json:"_deleted"`
	Removed bool   `json:"_removed"`
}

// meta reads a body's docMeta as json.Unmarshal does, errors included: a
// valid body that quickMeta reads whole is not decoded again.
func meta(body []byte) (docMeta, error) {
	if json.Valid(body) {
		if m, ok := quickMeta(body); ok {
			return m, nil
		}
	}
	var m docMeta
	if err := json.Unmarshal(body, &m); err != nil {
		return m, err
	}
	return m, nil
}

// apply sets a row from a fetched body.
func apply(r *Row, body []byte) error {
	m, err := meta(body)
	if err != nil {
		return err
	}
	if m.Rev != "" {
		r.Rev = m.Rev
	}
	switch {
	case m.Removed:
		r.Removed, r.Doc = true, nil
	case m.Deleted:
		r.Deleted, r.Doc = true, nil
	default:
		r.Doc = json.RawMessage(body)
	}
	return nil
}

// each runs fn on rows[i] for every i in idx, at most Options.Concurrency at
// a time, and returns the first error; the others are cancelled.
func (c *Client) each(ctx context.Context, rows []Row, idx []int, fn func(context.Context, *Row) error) error {
	if len(idx) == 0 {
		return nil
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(c.o.Concurrency)
	for _, i := range idx {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error { return fn(gctx, &rows[i]) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fetch docs: %w", err)
	}
	return nil
}

// bulkResult is what one _bulk_get brought.
type bulkResult struct {
	answered map[int]bool // row indexes filled, or in gone
	gone     []int        // rows whose revision is gone (or, Sync Gateway, forbidden)
	bodies   int
	bytes    int64 // of the bodies
	bulkEnd
}

// bulkEnd says how reading a _bulk_get answer ended.
type bulkEnd struct {
	whole bool  // read to its end
	over  bool  // cut at MaxAnswerBytes
	broke error // what broke it, when it was neither whole nor stopped on purpose
}

// errEnough stops reading an answer once enough was read.
var errEnough = errors.New("enough read")

// docReq names one document of a _bulk_get request: a revision, or (Rev
// empty) the current winner.
type docReq struct {
	ID  string `json:"id"`
	Rev string `json:"rev,omitempty"`
}

// bulkRead sends one _bulk_get for docs and passes each answer to take as
// it arrives; first names the document reported when nothing came whole.
// The answer is not read whole when take returns errEnough, or when it goes
// past MaxAnswerBytes (over) or breaks after take had been called (broke);
// the documents not answered are then to be asked again. With nothing
// answered, the error says what broke; an error of take other than
// errEnough is returned as it is.
func (c *Client) bulkRead(ctx context.Context, docs []docReq, first string, take func(bulkAnswer) error) (bulkEnd, error) {
	body, err := json.Marshal(struct {
		Docs []docReq `json:"docs"`
	}{docs})
	if err != nil {
		return bulkEnd{}, fmt.Errorf("bulk_get: encode request: %w", err)
	}
	// The Sync Gateway family answers only in multipart; CouchDB answers
	// JSON, which says more (its multipart form nests per-document parts).
	accept := acceptJSON
	if syncGatewayFamily(c.o.SourceType) {
		accept = acceptMultipart
	}
	st, err := c.open(ctx, "bulk_get", http.MethodPost,
		c.endpoint("_bulk_get", url.Values{"revs": {"false"}}), accept, body, c.o.RequestTimeout)
	if err != nil {
		return bulkEnd{}, err
	}
	defer st.close()
	answered := 0
	var takeErr error
	count := func(a bulkAnswer) error {
		answered++
		if err := take(a); err != nil {
			takeErr = err
			return err
		}
		return nil
	}
	if mt, params, _ := mime.ParseMediaType(st.contentType); strings.HasPrefix(mt, "multipart/") {
		err = readBulkMultipart(st.body, params["boundary"], count)
	} else {
		err = readBulkJSON(st.body, count)
	}
	var le *LimitError
	switch {
	case errors.Is(takeErr, errEnough):
		return bulkEnd{}, nil
	case takeErr != nil:
		return bulkEnd{}, takeErr
	case err == nil:
		return bulkEnd{whole: true}, nil
	case answered > 0:
		// What came whole is used; the rest is asked again.
		return bulkEnd{over: st.body.over, broke: err}, nil
	case st.body.over:
		return bulkEnd{}, st.fail(err, fmt.Sprintf("document %q", first))
	case errors.As(err, &le):
		return bulkEnd{}, le
	}
	if ferr := st.fail(err, ""); ferr != err {
		return bulkEnd{}, ferr
	}
	return bulkEnd{}, malformed("bulk_get", "%v", err)
}

// bulkGet asks one _bulk_get for rows[i], i in idx, and fills the rows as
// the answers arrive. Answers are matched to rows by document id and
// revision, not by position: pouchdb-server groups the answers of one
// document together instead of keeping request order. Reading stops early
// when enough(bytes of bodies so far, whether rows[idx[0]] is answered)
// says so, and as bulkRead says; the rows not answered then stay as they
// were. A whole answer must answer every row.
func (c *Client) bulkGet(ctx context.Context, rows []Row, idx []int, enough func(int64, bool) bool) (*bulkResult, error) {
	var docs []docReq
	byReq := map[docReq][]int{}
	for _, i := range idx {
		d := docReq{ID: rows[i].ID, Rev: rows[i].Rev}
		if byReq[d] == nil {
			docs = append(docs, d)
		}
		byReq[d] = append(byReq[d], i)
	}
	res := &bulkResult{answered: map[int]bool{}}
	end, err := c.bulkRead(ctx, docs, rows[idx[0]].ID, func(a bulkAnswer) error {
		for _, i := range byReq[docReq{ID: a.id, Rev: a.rev}] {
			r := &rows[i]
			switch {
			case res.answered[i]:
				continue
			case a.gone, forbidden(a.err) && syncGatewayFamily(c.o.SourceType):
				// Gone, or (Sync Gateway) forbidden: the winner says which.
				res.gone = append(res.gone, i)
			case a.err != nil:
				return fmt.Errorf("fetch doc %q rev %s: %w", r.ID, r.Rev, a.err)
			default:
				if err := apply(r, a.body); err != nil {
					return malformed("bulk_get", "document %q: %v", r.ID, err)
				}
			}
			res.answered[i] = true
		}
		if a.body != nil {
			res.bodies++
			res.bytes += int64(len(a.body))
		}
		if len(res.answered) < len(idx) && enough(res.bytes, res.answered[idx[0]]) {
			return errEnough
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.bulkEnd = end
	if end.whole {
		for _, i := range idx {
			if !res.answered[i] {
				return nil, malformed("bulk_get", "no answer for %q rev %s", rows[i].ID, rows[i].Rev)
			}
		}
	}
	return res, nil
}

// bulkAnswer is the source's answer for one revision of one document: a
// body, a revision that is gone, or another error.
type bulkAnswer struct {
	id, rev string
	body    json.RawMessage
	gone    bool
	err     error
}

// bulkError is a per-document error of _bulk_get.
type bulkError struct {
	ID     string `json:"id"`
	Rev    string `json:"rev"`
	Error  string `json:"error"`
	Reason string `json:"reason"`
	Status int    `json:"status"`
}

func (e *bulkError) answer() bulkAnswer {
	status := statusFor(e.Error, e.Status)
	if status == http.StatusNotFound {
		return bulkAnswer{id: e.ID, rev: e.Rev, gone: true}
	}
	return bulkAnswer{id: e.ID, rev: e.Rev, err: &StatusError{Op: "bulk_get", Status: status, Reason: reason(status, e.Error, e.Reason)}}
}

// bodyAnswer is the answer carrying a document body.
func bodyAnswer(body json.RawMessage) (bulkAnswer, error) {
	m, err := meta(body)
	if err != nil {
		return bulkAnswer{}, err
	}
	if m.ID == "" || m.Rev == "" {
		return bulkAnswer{}, errors.New("document without _id or _rev")
	}
	return bulkAnswer{id: m.ID, rev: m.Rev, body: body}, nil
}

// readBulkJSON reads CouchDB's answer as it arrives, passing each
// document's answer to take and stopping at take's first error:
//
//	{"results":[{"id":..,"docs":[{"ok":{..}} | {"error":{..}}]}]}
//
// pouchdb-server answers a missing revision with {"missing":"REV"} instead of
// an error, and an invalid one with {}, which matches no request.
func readBulkJSON(r io.Reader, take func(bulkAnswer) error) error {
	dec := json.NewDecoder(r)
	if err := delim(dec, '{'); err != nil {
		return err
	}
	results := false
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return err
		}
		if key != "results" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return err
			}
			continue
		}
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if tok == nil {
			continue // "results":null
		}
		if tok != json.Delim('[') {
			return fmt.Errorf("results is %v, not a list", tok)
		}
		results = true
		for k := 0; dec.More(); k++ {
			var res struct {
				ID   string `json:"id"`
				Docs []struct {
					OK      json.RawMessage `json:"ok"`
					Error   *bulkError      `json:"error"`
					Missing string          `json:"missing"`
				} `json:"docs"`
			}
			if err := dec.Decode(&res); err != nil {
				return fmt.Errorf("result %d: %w", k, err)
			}
			for _, d := range res.Docs {
				var ans bulkAnswer
				switch {
				case !isNull(d.OK):
					if ans, err = bodyAnswer(d.OK); err != nil {
						return fmt.Errorf("result %d (%q): %w", k, res.ID, err)
					}
				case d.Error != nil:
					if d.Error.ID == "" {
						d.Error.ID = res.ID
					}
					ans = d.Error.answer()
				case d.Missing != "":
					ans = bulkAnswer{id: res.ID, rev: d.Missing, gone: true}
				default:
					continue
				}
				if err := take(ans); err != nil {
					return err
				}
			}
		}
		if err := delim(dec, ']'); err != nil {
			return err
		}
	}
	if err := delim(dec, '}'); err != nil {
		return err
	}
	if !results {
		return errors.New("no results")
	}
	return nil
}

// readBulkMultipart reads the Sync Gateway family's answer as it arrives:
// one part per requested revision, each the document's JSON (or a nested
// multipart/related whose first part is) or an error object
// {"id","rev","error","reason","status"}. It passes each answer to take and
// stops at take's first error.
func readBulkMultipart(r io.Reader, boundary string, take func(bulkAnswer) error) error {
	if boundary == "" {
		return errors.New("multipart answer without a boundary")
	}
	mr := multipart.NewReader(r, boundary)
	for k := 0; ; k++ {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("part %d: %w", k, err)
		}
		b, err := partJSON(p)
		var le *LimitError
		if errors.As(err, &le) {
			le.Where = fmt.Sprintf("part %d", k)
			return le
		}
		if err != nil {
			return fmt.Errorf("part %d: %w", k, err)
		}
		ans, err := bodyAnswer(b)
		if err != nil {
			var e bulkError
			if err := json.Unmarshal(b, &e); err != nil || e.Error == "" {
				return fmt.Errorf("part %d is neither a document nor an error", k)
			}
			ans = e.answer()
		}
		if err := take(ans); err != nil {
			return err
		}
	}
}

// partJSON returns the JSON document of a part. A document with attachments
// is a nested multipart/related whose first part is the document: that one
// level is read (the attachments are skipped, never held); a multipart
// nested in it is a *LimitError, so that no answer can make the reader
// descend level after level.
func partJSON(p *multipart.Part) ([]byte, error) {
	var r io.Reader = p
	if inner, ok, err := nested(p.Header); err != nil {
		return nil, err
	} else if ok {
		first, err := multipart.NewReader(p, inner).NextPart()
		if err != nil {
			return nil, fmt.Errorf("nested part: %w", err)
		}
		if _, deeper, _ := nested(first.Header); deeper {
			return nil, &LimitError{Op: "bulk_get", Bound: BoundMultipartDepth, Limit: 1}
		}
		r = first
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if !json.Valid(b) {
		return nil, errors.New("not JSON")
	}
	return b, nil
}

// nested reports whether a part is itself multipart, with its boundary.
func nested(h textproto.MIMEHeader) (string, bool, error) {
	mt, params, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil || !strings.HasPrefix(mt, "multipart/") {
		return "", false, nil
	}
	if params["boundary"] == "" {
		return "", false, errors.New("nested multipart without a boundary")
	}
	return params["boundary"], true, nil
}

// delim reads the next token, which must be d.
func delim(dec *json.Decoder, d json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != d {
		return fmt.Errorf("found %v where %v belongs", tok, d)
	}
	return nil
}
