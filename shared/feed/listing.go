package feed

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// List reads the whole _changes feed from the beginning, the way the
// pipeline reads it, and calls fn once per page with the page's rows: every
// document's winning revision and whether it is deleted or (Sync Gateway
// family) removed from the reader's channels. Pages come from
//
//	GET {url}/_changes?feed=normal&style=main_only&since=S&limit=N
//	    [&filter=sync_gateway/bychannel&channels=a,b]   Channels, Sync Gateway family
//
// with N pageSize (Options.Limit when pageSize <= 0), since starting empty
// and then the previous page's last_seq, until a page lists no row. Deleted
// and removed rows are listed whatever Options.ActiveOnly says; rows that
// name no document revision (Sync Gateway's "_user/" rows) are not. Rows
// carry no body.
//
// Unlike _all_docs, which not every source lists completely
// (pouchdb-server leaves out ids such as "注文-1"), the feed lists every
// document the pipeline can deliver. A document written during the listing
// can be listed twice: its later row is the newer one. A source written
// faster than it can be listed keeps the listing going.
//
// An error from fn stops the listing and is returned as it is. Errors are
// as for Changes; a page whose last_seq is empty or does not move past
// since is ErrMalformed (wrapped). List is safe for concurrent use.
func (c *Client) List(ctx context.Context, pageSize int, fn func([]Row) error) error {
	if pageSize <= 0 {
		pageSize = c.o.Limit
	}
	q := url.Values{"feed": {"normal"}, "style": {"main_only"}, "limit": {strconv.Itoa(pageSize)}}
	if syncGatewayFamily(c.o.SourceType) && len(c.o.Channels) > 0 {
		q.Set("filter", "sync_gateway/bychannel")
		q.Set("channels", strings.Join(c.o.Channels, ","))
	}
	var since json.RawMessage
	for {
		s, err := sinceParam(since)
		if err != nil {
			return malformed("changes", "last_seq: %v", err)
		}
		if s != "" {
			q.Set("since", s)
		}
		resp, err := c.roundTrip(ctx, "changes", http.MethodGet, c.endpoint("_changes", q), nil, c.o.RequestTimeout)
		if err != nil {
			return err
		}
		var page struct {
			Results []json.RawMessage `json:"results"`
		}
		if err := json.Unmarshal(resp.body, &page); err != nil {
			return malformed("changes", "%v", err)
		}
		if page.Results == nil {
			return malformed("changes", "no results")
		}
		if len(page.Results) == 0 {
			return nil
		}
		b, err := parseChanges(resp.body, false)
		if err != nil {
			return err
		}
		next, err := sinceParam(b.LastSeq)
		switch {
		case err != nil:
			return malformed("changes", "last_seq: %v", err)
		case next == "":
			return malformed("changes", "last_seq is empty after %d rows", len(page.Results))
		case next == s:
			return malformed("changes", "last_seq %s does not move past since after %d rows", b.LastSeq, len(page.Results))
		}
		if len(b.Rows) > 0 {
			if err := fn(b.Rows); err != nil {
				return err
			}
		}
		since = b.LastSeq
	}
}
