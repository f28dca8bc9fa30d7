package feed

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
)

// Changes issues one _changes request from since and returns what the source
// answered:
//
//	GET {url}/_changes?feed=longpoll&since=S&limit=L&timeout=MS
//	    [&include_docs=true]                                  Fetch is include_docs
//	    [&revocations=true]                                   Sync Gateway, App Services
//	    [&active_only=true]                                   ActiveOnly, Sync Gateway family
//	    [&filter=sync_gateway/bychannel&channels=a,b]         Channels, Sync Gateway family
//
// revocations=true makes Sync Gateway (3.0 and later) report the documents a
// user lost access to when a channel was revoked; without it they are never
// mentioned again and the outputs keep them.
//
// since is the opaque sequence exactly as the source sent it: a JSON string
// is sent as its content, any other value as its JSON text; nil (or JSON
// null) starts from the beginning. A timeout of zero or less asks for
// feed=normal, which answers at once. The request is abandoned, with a
// transient error, when ctx ends or timeout+Options.Slack has passed.
//
// A source that ignores the long-poll timeout (pouchdb-server) is cut off at
// timeout+Slack; if it had sent no row by then, the answer is an empty batch
// whose LastSeq is since (nil when since was nil): nothing new was seen.
//
// Each row is live, Deleted or Removed, never both (see Row). With
// ActiveOnly, deleted and removed rows are dropped from Rows (the Sync
// Gateway family drops them at the source); LastSeq still covers them. Rows
// that name no document revision (Sync Gateway's "_user/" rows) are dropped
// the same way; Batch.Full still counts them, so a page of only such rows
// is not mistaken for the end of the feed (see Batch.CaughtUp). Doc is set
// only for live rows when the source included it.
//
// A Sync Gateway family answer never goes back: when one holds rows at or
// before since (Sync Gateway 3.1.0 restarts a revocation paged by a small
// limit), the request is made again with limit 10000 and the rows at or
// before since, which were read before, are dropped; a full page of nothing
// else is ErrMalformed. A last_seq before since is reported as since.
//
// Errors are *StatusError, ErrMalformed (wrapped) or transport errors; see
// Transient. Changes is safe for concurrent use and has no side effects.
func (c *Client) Changes(ctx context.Context, since json.RawMessage, timeout time.Duration) (*Batch, error) {
	b, err := c.changes(ctx, since, timeout, c.o.Limit)
	if err != nil || !syncGatewayFamily(c.o.SourceType) {
		return b, err
	}
	from, ok := parseSGSeq(since)
	if !ok {
		return b, nil
	}
	if b.rowsBehind(from) && c.o.Limit < revocationPage {
		// Sync Gateway 3.1 pages a revocation wrongly: the page after the
		// last revoked row can start the revocation over, and a small limit
		// then cycles through it forever. The whole revocation in one page
		// ends it; the rows up to since were read before.
		if b, err = c.changes(ctx, since, timeout, revocationPage); err != nil {
			return nil, err
		}
	}
	if b.rowsBehind(from) {
		b.dropUpTo(from)
		if len(b.Rows) == 0 && b.Full {
			return nil, malformed("changes", "every row of a full page is at or before since %s", since)
		}
	}
	if last, ok := parseSGSeq(b.LastSeq); ok && last.before(from) {
		b.LastSeq = slices.Clone(since)
	}
	return b, nil
}

// revocationPage is the limit of the request that reads a whole revocation.
const revocationPage = 10000

// rowsBehind reports whether a Sync Gateway answer holds a row that is not
// after from.
func (b *Batch) rowsBehind(from sgSeq) bool {
	for _, r := range b.Rows {
		if s, ok := parseSGSeq(r.Seq); ok && !from.before(s) {
			return true
		}
	}
	return false
}

// dropUpTo removes the rows that are not after from.
func (b *Batch) dropUpTo(from sgSeq) {
	b.Rows = slices.DeleteFunc(b.Rows, func(r Row) bool {
		s, ok := parseSGSeq(r.Seq)
		return ok && !from.before(s)
	})
}

func (c *Client) changes(ctx context.Context, since json.RawMessage, timeout time.Duration, limit int) (*Batch, error) {
	q, err := c.feedQuery(since)
	if err != nil {
		return nil, err
	}
	if timeout > 0 {
		q.Set("feed", "longpoll")
		q.Set("timeout", strconv.FormatInt(max(timeout.Milliseconds(), 1), 10))
	} else {
		q.Set("feed", "normal")
		timeout = 0
	}
	q.Set("limit", strconv.Itoa(limit))
	resp, err := c.roundTrip(ctx, "changes", http.MethodGet, c.endpoint("_changes", q), nil, timeout+c.o.Slack)
	if timeout > 0 && idle(err) {
		return &Batch{Rows: []Row{}, LastSeq: slices.Clone(since), Pending: -1}, nil
	}
	if err != nil {
		return nil, err
	}
	return parseChanges(resp.body, c.o.ActiveOnly, limit)
}

// feedQuery returns the query parameters every mode of the feed shares:
// since, include_docs, revocations, active_only and the channel filter.
func (c *Client) feedQuery(since json.RawMessage) (url.Values, error) {
	q := url.Values{}
	s, err := sinceParam(since)
	if err != nil {
		return nil, fmt.Errorf("changes: %w", err)
	}
	if s != "" {
		q.Set("since", s)
	}
	if c.o.Fetch == config.FetchIncludeDocs {
		q.Set("include_docs", "true")
	}
	if revocations(c.o.SourceType) {
		q.Set("revocations", "true")
	}
	if syncGatewayFamily(c.o.SourceType) {
		if c.o.ActiveOnly {
			q.Set("active_only", "true")
		}
		if len(c.o.Channels) > 0 {
			q.Set("filter", "sync_gateway/bychannel")
			q.Set("channels", strings.Join(c.o.Channels, ","))
		}
	}
	return q, nil
}

// revocations reports whether a source reports lost channel access when
// asked: Sync Gateway and App Services. Edge Server has no channels to revoke.
func revocations(sourceType string) bool {
	return sourceType == config.SourceSyncGateway || sourceType == config.SourceAppServices
}

// idle reports whether a long-poll ended by our deadline had begun a 200
// answer and sent no row: nothing, or `{"results":[` and heartbeat newlines.
// That is a source with nothing new that ignores the timeout parameter
// (pouchdb-server holds a long-poll open until the next change), so the
// answer is an empty batch at the same position, not an error. Nothing is
// lost either way: the position does not move. (Nothing at all arrives when
// the source compresses the answer and does not flush the opening.)
func idle(err error) bool {
	var te *transportError
	if !errors.As(err, &te) || !te.deadline || te.status != http.StatusOK {
		return false
	}
	switch string(bytes.Join(bytes.Fields(te.partial), nil)) {
	case "", `{"results":[`:
		return true
	}
	return false
}

// sinceParam turns an opaque sequence into the since query value.
func sinceParam(seq json.RawMessage) (string, error) {
	t := bytes.TrimSpace(seq)
	if len(t) == 0 || string(t) == "null" {
		return "", nil
	}
	if !json.Valid(t) {
		return "", errors.New("since is not a JSON value")
	}
	if t[0] == '"' {
		var s string
		if err := json.Unmarshal(t, &s); err != nil {
			return "", fmt.Errorf("decode since: %w", err)
		}
		return s, nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, t); err != nil {
		return "", fmt.Errorf("compact since: %w", err)
	}
	return b.String(), nil
}

type changesAnswer struct {
	Results []changeRow     `json:"results"`
	LastSeq json.RawMessage `json:"last_seq"`
	Pending *int64          `json:"pending"`
}

type changeRow struct {
	Seq     json.RawMessage `json:"seq"`
	ID      string          `json:"id"`
	Changes []struct {
		Rev string `json:"rev"`
	} `json:"changes"`
	Deleted bool            `json:"deleted"`
	Removed json.RawMessage `json:"removed"`
	Revoked bool            `json:"revoked"`
	Doc     json.RawMessage `json:"doc"`
}

func parseChanges(body []byte, activeOnly bool, limit int) (*Batch, error) {
	var a changesAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, malformed("changes", "%v", err)
	}
	if a.Results == nil {
		return nil, malformed("changes", "no results")
	}
	if isNull(a.LastSeq) {
		return nil, malformed("changes", "no last_seq")
	}
	b := &Batch{Rows: make([]Row, 0, len(a.Results)), LastSeq: a.LastSeq, Pending: -1, Full: len(a.Results) >= limit}
	if a.Pending != nil {
		b.Pending = *a.Pending
	}
	for i, r := range a.Results {
		row, keep, err := r.row(i, activeOnly)
		if err != nil {
			return nil, err
		}
		if keep {
			b.Rows = append(b.Rows, row)
		}
	}
	return b, nil
}

// row converts the i-th row of an answer; keep is false for a row the
// client drops (a Sync Gateway "_user/" row, or a deleted or removed row
// under activeOnly).
func (r *changeRow) row(i int, activeOnly bool) (Row, bool, error) {
	if isNull(r.Seq) {
		return Row{}, false, malformed("changes", "row %d has no seq", i)
	}
	if r.ID == "" {
		return Row{}, false, malformed("changes", "row %d (seq %s) has no id", i, r.Seq)
	}
	if len(r.Changes) == 0 || r.Changes[0].Rev == "" {
		if strings.HasPrefix(r.ID, "_user/") {
			return Row{}, false, nil // a Sync Gateway principal change, not a document
		}
		return Row{}, false, malformed("changes", "row %d (seq %s) has no rev", i, r.Seq)
	}
	row := Row{Seq: r.Seq, ID: r.ID, Rev: r.Changes[0].Rev, Deleted: r.Deleted,
		Removed: present(r.Removed) || r.Revoked, Revoked: r.Revoked}
	if !isNull(r.Doc) {
		// A row's doc can be a stub that says more than the row's flags:
		// Sync Gateway's {"_removed":true} on a revoked row.
		m, err := meta(r.Doc)
		if err != nil {
			return Row{}, false, malformed("changes", "row %d (seq %s) doc: %v", i, r.Seq, err)
		}
		row.Deleted = row.Deleted || m.Deleted
		row.Removed = row.Removed || m.Removed
		if !row.Deleted && !row.Removed {
			row.Doc = r.Doc
		}
	}
	// A deletion seen by a channel-restricted reader also lists the channels
	// it left (the tombstone has none): it is a deletion.
	if row.Deleted {
		row.Removed, row.Revoked = false, false
	}
	if activeOnly && (row.Deleted || row.Removed) {
		return Row{}, false, nil
	}
	return row, true, nil
}

// isNull reports whether a raw value is absent or JSON null.
func isNull(v json.RawMessage) bool {
	t := bytes.TrimSpace(v)
	return len(t) == 0 || string(t) == "null"
}

// present reports whether a raw list is there and not empty.
func present(v json.RawMessage) bool {
	if isNull(v) {
		return false
	}
	var list []json.RawMessage
	if err := json.Unmarshal(v, &list); err == nil {
		return len(list) > 0
	}
	return true // not a list, but something: treat as set
}
