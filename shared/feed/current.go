package feed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/changes-worker/changes-worker/shared/config"
)

// Current reads the current state of each document in ids and returns one
// row per id, in the order of ids: the winning revision with its body in Rev
// and Doc, or Deleted when the document is deleted or was never written, or
// Removed when a Sync Gateway family source no longer lets the reader see it
// (403). Seq is not set.
//
//   - Edge Server, which has no _bulk_get: GET {url}/{id} per document, at
//     most Options.Concurrency at a time;
//   - every other source: POST {url}/_bulk_get?revs=false naming ids
//     without revisions (so the source answers each winner), at most 500
//     documents per request. A document the answer does not settle is read
//     with its own GET: pouchdb-server answers a deleted or never written
//     document with an empty object, which says neither.
//
// So reading N documents costs about N/500 requests, plus one per document
// deleted on pouchdb-server. Current does not retry; errors name the
// operation and, for one document, its id; see Transient. It is safe for
// concurrent use.
func (c *Client) Current(ctx context.Context, ids []string) ([]Row, error) {
	rows := make([]Row, len(ids))
	for i, id := range ids {
		rows[i].ID = id
	}
	all := make([]int, len(rows))
	for i := range all {
		all[i] = i
	}
	if c.o.SourceType == config.SourceEdgeServer {
		return rows, c.each(ctx, rows, all, c.fetchWinner)
	}
	var unsettled []int
	for chunk := range slices.Chunk(all, bulkGetMax) {
		u, err := c.bulkGetWinners(ctx, rows, chunk)
		if err != nil {
			return nil, err
		}
		unsettled = append(unsettled, u...)
	}
	if err := c.each(ctx, rows, unsettled, c.fetchWinner); err != nil {
		return nil, err
	}
	return rows, nil
}

// bulkGetWinners fills rows[i] for i in idx with the winners one _bulk_get
// answers, and returns the indexes the answer did not settle.
func (c *Client) bulkGetWinners(ctx context.Context, rows []Row, idx []int) ([]int, error) {
	type docReq struct {
		ID string `json:"id"`
	}
	var req struct {
		Docs []docReq `json:"docs"`
	}
	asked := map[string]bool{}
	for _, i := range idx {
		if id := rows[i].ID; !asked[id] {
			asked[id] = true
			req.Docs = append(req.Docs, docReq{ID: id})
		}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("bulk_get: encode request: %w", err)
	}
	resp, err := c.roundTrip(ctx, "bulk_get", http.MethodPost,
		c.endpoint("_bulk_get", url.Values{"revs": {"false"}}), body, c.o.RequestTimeout)
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
	byID := make(map[string]bulkAnswer, len(answers))
	for _, a := range answers {
		if !asked[a.id] {
			return nil, malformed("bulk_get", "answer for %q, which was not asked for", a.id)
		}
		if prev, dup := byID[a.id]; dup && (prev.rev != a.rev || prev.gone != a.gone || (prev.err == nil) != (a.err == nil)) {
			return nil, malformed("bulk_get", "two different answers for %q", a.id)
		}
		byID[a.id] = a
	}
	var unsettled []int
	for _, i := range idx {
		r := &rows[i]
		a, ok := byID[r.ID]
		var se *StatusError
		switch {
		case !ok:
			unsettled = append(unsettled, i)
		case a.gone:
			r.Deleted = true
		case errors.As(a.err, &se) && se.Status == http.StatusForbidden && syncGatewayFamily(c.o.SourceType):
			r.Removed = true
		case a.err != nil:
			return nil, fmt.Errorf("fetch doc %q winner: %w", r.ID, a.err)
		default:
			if err := apply(r, a.body); err != nil {
				return nil, malformed("bulk_get", "document %q: %v", r.ID, err)
			}
		}
	}
	return unsettled, nil
}
