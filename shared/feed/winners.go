package feed

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
)

// Winners lists every live document with its winning revision, in the
// source's _all_docs order, calling fn once per page of at most pageSize
// (Options.Limit when pageSize <= 0). Pages come from
// GET {url}/_all_docs?limit=N+1[&startkey="<JSON id>"]: the extra row starts
// the next page, so no skip is needed. Deleted documents are not listed.
//
// An error from fn stops the listing and is returned as it is. Winners reads
// a source that may be changing: a document written during the listing may or
// may not appear. It is safe for concurrent use.
func (c *Client) Winners(ctx context.Context, pageSize int, fn func([]DocRev) error) error {
	if pageSize <= 0 {
		pageSize = c.o.Limit
	}
	var startKey string
	for {
		q := url.Values{"limit": {strconv.Itoa(pageSize + 1)}}
		if startKey != "" {
			q.Set("startkey", startKey)
		}
		resp, err := c.roundTrip(ctx, "all_docs", http.MethodGet, c.endpoint("_all_docs", q), nil, c.o.RequestTimeout)
		if err != nil {
			return err
		}
		page, next, err := parseAllDocs(resp.body, pageSize)
		if err != nil {
			return err
		}
		if len(page) > 0 {
			if err := fn(page); err != nil {
				return err
			}
		}
		if next == "" {
			return nil
		}
		k, err := json.Marshal(next)
		if err != nil {
			return fmt.Errorf("all_docs: encode startkey: %w", err)
		}
		startKey = string(k)
	}
}

// parseAllDocs returns the live documents of one page and the id that starts
// the next page ("" on the last page).
func parseAllDocs(body []byte, pageSize int) ([]DocRev, string, error) {
	var a struct {
		Rows []struct {
			ID    string `json:"id"`
			Error string `json:"error"`
			Value struct {
				Rev     string `json:"rev"`
				Deleted bool   `json:"deleted"`
			} `json:"value"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, "", malformed("all_docs", "%v", err)
	}
	if a.Rows == nil {
		return nil, "", malformed("all_docs", "no rows")
	}
	var next string
	rows := a.Rows
	if len(rows) > pageSize {
		next = rows[pageSize].ID
		if next == "" {
			return nil, "", malformed("all_docs", "row %d has no id", pageSize)
		}
		rows = rows[:pageSize]
	}
	page := make([]DocRev, 0, len(rows))
	for i, r := range rows {
		if r.Error != "" || r.Value.Deleted {
			continue
		}
		if r.ID == "" || r.Value.Rev == "" {
			return nil, "", malformed("all_docs", "row %d has no id or rev", i)
		}
		page = append(page, DocRev{ID: r.ID, Rev: r.Value.Rev})
	}
	return page, next, nil
}
