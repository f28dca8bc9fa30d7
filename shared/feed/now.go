package feed

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// Now returns the source's current position in its _changes feed, exactly as
// the source writes sequences, so that it can be stored as a checkpoint (a
// poller starting from it reads only later changes) or recorded as the feed
// position at which a document was observed.
//
//   - Apache CouchDB: GET {url}/_changes?feed=normal&since=now, which lists
//     nothing and answers the current last_seq (of every shard, on a
//     cluster), in the form _changes returns it.
//   - Sync Gateway family: GET {db}/, whose update_seq is the newest sequence
//     of the database. Sync Gateway numbers changes across the whole
//     database, so for a keyspace URL (db.scope.collection) the database's
//     own position is the right one. update_seq is a JSON number but
//     _changes writes every last_seq as a JSON string ("19"), so Now
//     returns the string: a checkpoint holds one form whoever wrote it.
//
// An empty database answers its initial sequence (0 on most sources). Errors
// are as for Changes; see Transient. Now is safe for concurrent use.
func (c *Client) Now(ctx context.Context) (json.RawMessage, error) {
	if syncGatewayFamily(c.o.SourceType) {
		return c.updateSeq(ctx)
	}
	q := url.Values{"feed": {"normal"}, "since": {"now"}}
	resp, err := c.roundTrip(ctx, "changes", http.MethodGet, c.endpoint("_changes", q), nil, c.o.RequestTimeout)
	if err != nil {
		return nil, err
	}
	var a struct {
		LastSeq json.RawMessage `json:"last_seq"`
	}
	if err := json.Unmarshal(resp.body, &a); err != nil {
		return nil, malformed("changes", "%v", err)
	}
	if isNull(a.LastSeq) {
		return nil, malformed("changes", "no last_seq")
	}
	return a.LastSeq, nil
}

// updateSeq reads update_seq from the database information of a Sync
// Gateway family source.
func (c *Client) updateSeq(ctx context.Context) (json.RawMessage, error) {
	u, err := url.Parse(c.base)
	if err != nil {
		return nil, malformed("db_info", "url: %v", err)
	}
	// The last path segment is the keyspace: db, or db.scope.collection.
	segs := strings.Split(strings.Trim(u.Path, "/"), "/")
	last := len(segs) - 1
	segs[last], _, _ = strings.Cut(segs[last], ".")
	u.Path = "/" + strings.Join(segs, "/") + "/"
	resp, err := c.roundTrip(ctx, "db_info", http.MethodGet, u.String(), nil, c.o.RequestTimeout)
	if err != nil {
		return nil, err
	}
	var info struct {
		UpdateSeq json.RawMessage `json:"update_seq"`
	}
	if err := json.Unmarshal(resp.body, &info); err != nil {
		return nil, malformed("db_info", "%v", err)
	}
	if isNull(info.UpdateSeq) {
		return nil, malformed("db_info", "no update_seq")
	}
	seq := bytes.TrimSpace(info.UpdateSeq)
	if seq[0] == '"' {
		return seq, nil
	}
	var n json.Number
	if err := json.Unmarshal(seq, &n); err != nil {
		return nil, malformed("db_info", "update_seq %s is neither a number nor a string", seq)
	}
	s, err := json.Marshal(n.String())
	if err != nil {
		return nil, fmt.Errorf("db_info: encode update_seq: %w", err)
	}
	return s, nil
}
