package feed

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

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
//     without revisions (so the source answers each winner), split by bytes
//     as FetchDocs splits its requests (at most 500 documents each) and read
//     as the answer arrives. A document a whole answer does not settle is
//     read with its own GET: pouchdb-server answers a deleted or never
//     written document with an empty object, which says neither.
//
// So reading N documents costs about N/500 requests for small documents,
// plus one per document deleted on pouchdb-server. Current does not retry; errors name the
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
	queue := all
	force1 := false
	for len(queue) > 0 {
		count := c.bulkCount(len(queue), 0, 0)
		if force1 {
			count = 1
		}
		chunk := queue[:count]
		answered, u, end, err := c.bulkGetWinners(ctx, rows, chunk)
		if err != nil {
			return nil, err
		}
		if len(answered) == 0 && !end.whole {
			// The answer stopped before settling any document asked for.
			id := rows[chunk[0]].ID
			switch {
			case !end.over:
				return nil, malformed("bulk_get", "the answer broke before answering %q: %v", id, end.broke)
			case len(chunk) == 1:
				return nil, &LimitError{Op: "bulk_get", Bound: BoundAnswerBytes, Limit: c.o.MaxAnswerBytes, Where: fmt.Sprintf("document %q", id)}
			}
		}
		force1 = len(answered) == 0 && !end.whole // over the limit: one document at a time
		unsettled = append(unsettled, u...)
		queue = slices.DeleteFunc(slices.Clone(queue), func(i int) bool { return answered[i] || slices.Contains(u, i) })
	}
	if err := c.each(ctx, rows, unsettled, c.fetchWinner); err != nil {
		return nil, err
	}
	return rows, nil
}

// bulkGetWinners fills rows[i] for i in idx with the winners one _bulk_get
// answers, read as it arrives (see bulkRead). It returns the indexes it
// settled, and, when the answer was read whole, those it did not settle
// (nil otherwise: they are asked again), and how the reading ended.
func (c *Client) bulkGetWinners(ctx context.Context, rows []Row, idx []int) (map[int]bool, []int, bulkEnd, error) {
	var docs []docReq
	asked := map[string][]int{}
	for _, i := range idx {
		id := rows[i].ID
		if asked[id] == nil {
			docs = append(docs, docReq{ID: id})
		}
		asked[id] = append(asked[id], i)
	}
	byID := map[string]bulkAnswer{}
	settled := map[int]bool{}
	var bodies int
	var bytes int64
	end, err := c.bulkRead(ctx, docs, rows[idx[0]].ID, func(a bulkAnswer) error {
		if asked[a.id] == nil {
			return malformed("bulk_get", "answer for %q, which was not asked for", a.id)
		}
		if prev, dup := byID[a.id]; dup && (prev.rev != a.rev || prev.gone != a.gone || (prev.err == nil) != (a.err == nil)) {
			return malformed("bulk_get", "two different answers for %q", a.id)
		}
		byID[a.id] = a
		if a.body != nil {
			bodies++
			bytes += int64(len(a.body))
		}
		for _, i := range asked[a.id] {
			r := &rows[i]
			var se *StatusError
			switch {
			case a.gone:
				r.Deleted = true
			case errors.As(a.err, &se) && se.Status == http.StatusForbidden && syncGatewayFamily(c.o.SourceType):
				r.Removed = true
			case a.err != nil:
				return fmt.Errorf("fetch doc %q winner: %w", r.ID, a.err)
			default:
				if err := apply(r, a.body); err != nil {
					return malformed("bulk_get", "document %q: %v", r.ID, err)
				}
			}
			settled[i] = true
		}
		return nil
	})
	if err != nil {
		return nil, nil, end, err
	}
	c.pages.observe(bodies, bytes)
	if !end.whole {
		return settled, nil, end, nil
	}
	unsettled := []int{}
	for _, i := range idx {
		if !settled[i] {
			unsettled = append(unsettled, i)
		}
	}
	return settled, unsettled, end, nil
}
