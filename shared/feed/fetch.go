package feed

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/changes-worker/changes-worker/shared/config"
)

// bulkGetMax bounds the documents of one _bulk_get request.
const bulkGetMax = 500

// FetchDocs fills Doc for every row that is neither deleted nor removed and
// has no body yet (so with include_docs it only fills the gaps):
//
//   - Edge Server, which has no _bulk_get: GET {url}/{id}?rev=REV per row,
//     at most Options.Concurrency at a time;
//   - every other source: POST {url}/_bulk_get?revs=false, answered as JSON
//     (CouchDB) or multipart/mixed (Sync Gateway family).
//
// A revision the source still holds comes back as it was, even when a newer
// one has been written since (the feed reports that one at a later seq).
// When the requested revision is gone (compacted away, or unknown to this
// source), the document's current winner is fetched instead and Rev and Doc
// are set to it; when there is no winner (deleted, 404) the row is marked
// Deleted. A revision the reader can no longer see (Sync Gateway "_removed",
// or 403 on the fallback GET from a Sync Gateway family source) marks the row
// Removed. Tombstones and removals keep Doc nil.
//
// FetchDocs changes rows in place and either fills every row or returns an
// error; on error some rows may be filled, and calling it again is safe. It
// does not retry. Errors name the operation and, for one document, its id;
// see Transient. Concurrent calls must not share rows.
func (c *Client) FetchDocs(ctx context.Context, rows []Row) error {
	var want []int
	for i := range rows {
		if rows[i].needsBody() {
			want = append(want, i)
		}
	}
	if len(want) == 0 {
		return nil
	}
	if c.o.SourceType == config.SourceEdgeServer {
		return c.each(ctx, rows, want, c.fetchRev)
	}
	var gone []int
	for chunk := range slices.Chunk(want, bulkGetMax) {
		g, err := c.bulkGet(ctx, rows, chunk)
		if err != nil {
			return err
		}
		gone = append(gone, g...)
	}
	return c.each(ctx, rows, gone, c.fetchWinner)
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

func meta(body []byte) (docMeta, error) {
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

// bulkGet fills rows[i] for i in idx with one _bulk_get and returns the
// indexes whose revision is gone. Answers are matched to rows by document id
// and revision, not by position: pouchdb-server groups the answers of one
// document together instead of keeping request order.
func (c *Client) bulkGet(ctx context.Context, rows []Row, idx []int) ([]int, error) {
	type docReq struct {
		ID  string `json:"id"`
		Rev string `json:"rev"`
	}
	var req struct {
		Docs []docReq `json:"docs"`
	}
	asked := map[docReq]bool{}
	for _, i := range idx {
		d := docReq{ID: rows[i].ID, Rev: rows[i].Rev}
		if !asked[d] {
			asked[d] = true
			req.Docs = append(req.Docs, d)
		}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("bulk_get: encode request: %w", err)
	}
	// The Sync Gateway family answers only in multipart; CouchDB answers
	// JSON, which says more (its multipart form nests per-document parts).
	accept := acceptJSON
	if syncGatewayFamily(c.o.SourceType) {
		accept = acceptMultipart
	}
	resp, err := c.roundTripAccept(ctx, "bulk_get", http.MethodPost,
		c.endpoint("_bulk_get", url.Values{"revs": {"false"}}), accept, body, c.o.RequestTimeout)
	if err != nil {
		return nil, err
	}
	var answers []bulkAnswer
	if mt, params, _ := mime.ParseMediaType(resp.contentType); strings.HasPrefix(mt, "multipart/") {
		answers, err = parseBulkMultipart(resp.body, params["boundary"])
	} else {
		answers, err = parseBulkJSON(resp.body)
	}
	if err != nil {
		return nil, err
	}
	byRev := make(map[docReq]bulkAnswer, len(answers))
	for _, a := range answers {
		byRev[docReq{ID: a.id, Rev: a.rev}] = a
	}
	var gone []int
	for _, i := range idx {
		r := &rows[i]
		a, ok := byRev[docReq{ID: r.ID, Rev: r.Rev}]
		switch {
		case !ok:
			return nil, malformed("bulk_get", "no answer for %q rev %s", r.ID, r.Rev)
		case a.gone, forbidden(a.err) && syncGatewayFamily(c.o.SourceType):
			// Gone, or (Sync Gateway) forbidden: the winner says which.
			gone = append(gone, i)
		case a.err != nil:
			return nil, fmt.Errorf("fetch doc %q rev %s: %w", r.ID, r.Rev, a.err)
		default:
			if err := apply(r, a.body); err != nil {
				return nil, malformed("bulk_get", "document %q: %v", r.ID, err)
			}
		}
	}
	return gone, nil
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

// parseBulkJSON reads CouchDB's answer:
//
//	{"results":[{"id":..,"docs":[{"ok":{..}} | {"error":{..}}]}]}
//
// pouchdb-server answers a missing revision with {"missing":"REV"} instead of
// an error, and an invalid one with {}, which matches no request.
func parseBulkJSON(body []byte) ([]bulkAnswer, error) {
	var a struct {
		Results []struct {
			ID   string `json:"id"`
			Docs []struct {
				OK      json.RawMessage `json:"ok"`
				Error   *bulkError      `json:"error"`
				Missing string          `json:"missing"`
			} `json:"docs"`
		} `json:"results"`
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, malformed("bulk_get", "%v", err)
	}
	if a.Results == nil {
		return nil, malformed("bulk_get", "no results")
	}
	var out []bulkAnswer
	for k, res := range a.Results {
		for _, d := range res.Docs {
			switch {
			case !isNull(d.OK):
				ans, err := bodyAnswer(d.OK)
				if err != nil {
					return nil, malformed("bulk_get", "result %d (%q): %v", k, res.ID, err)
				}
				out = append(out, ans)
			case d.Error != nil:
				if d.Error.ID == "" {
					d.Error.ID = res.ID
				}
				out = append(out, d.Error.answer())
			case d.Missing != "":
				out = append(out, bulkAnswer{id: res.ID, rev: d.Missing, gone: true})
			}
		}
	}
	return out, nil
}

// parseBulkMultipart reads the Sync Gateway family's answer: one part per
// requested revision, each the document's JSON (or a nested
// multipart/related whose first part is) or an error object
// {"id","rev","error","reason","status"}.
func parseBulkMultipart(body []byte, boundary string) ([]bulkAnswer, error) {
	if boundary == "" {
		return nil, malformed("bulk_get", "multipart answer without a boundary")
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	var out []bulkAnswer
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, malformed("bulk_get", "part %d: %v", len(out), err)
		}
		b, err := partJSON(p)
		if err != nil {
			return nil, malformed("bulk_get", "part %d: %v", len(out), err)
		}
		if ans, err := bodyAnswer(b); err == nil {
			out = append(out, ans)
			continue
		}
		var e bulkError
		if err := json.Unmarshal(b, &e); err != nil || e.Error == "" {
			return nil, malformed("bulk_get", "part %d is neither a document nor an error", len(out))
		}
		out = append(out, e.answer())
	}
}

// partJSON returns the JSON document of a part, descending into a nested
// multipart/related (a document with attachments) to its first part.
func partJSON(p *multipart.Part) ([]byte, error) {
	mt, params, err := mime.ParseMediaType(p.Header.Get("Content-Type"))
	if err == nil && strings.HasPrefix(mt, "multipart/") {
		inner, err := multipart.NewReader(p, params["boundary"]).NextPart()
		if err != nil {
			return nil, fmt.Errorf("nested part: %w", err)
		}
		return partJSON(inner)
	}
	b, err := io.ReadAll(p)
	if err != nil {
		return nil, err
	}
	if !json.Valid(b) {
		return nil, errors.New("not JSON")
	}
	return b, nil
}
