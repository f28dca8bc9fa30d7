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
	"unicode/utf8"

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
// A page is bounded twice (see Options): reading stops after the row whose
// bytes reach PageBytes, and an answer past MaxAnswerBytes is cut there. A
// page cut either way, or cut short by a broken answer after whole rows,
// keeps those rows, with LastSeq the position after the last of them and
// Cut saying why; when no row was whole the error says what broke. After a
// cut with include_docs the client asks for as many rows as fitted, and
// doubles that after each full page that used at most half of PageBytes,
// back to Limit. A page that does not arrive (whole) within the deadline
// halves the next one: some sources build an answer whole before sending
// any of it, and a large page never arrives in time.
//
// A row that names a document but no usable revision is kept with Rev ""
// (FetchDocs fetches the current winner); one whose seq is missing or empty
// is kept with Seq nil. A row that names no document is not in Rows but in
// Batch.Malformed, for the caller to decide on.
//
// The position never goes back where the seq format tells (SeqBefore):
// LastSeq is never before the last row read, nor before since. The one
// exception is a CouchDB 2+ answer that comes with rows: its numeric prefix
// is a sum over shards, and a lower one is CouchDB reading again a shard
// range it could not resume, which holding since would repeat forever. An
// empty last_seq is never used: it would read the feed from its beginning.
// It is ErrMalformed when the answer has no row, and cuts the batch after
// its rows otherwise.
//
// A Sync Gateway family answer never goes back: when one holds rows at or
// before since (Sync Gateway 3.1.0 restarts a revocation paged by a small
// limit), the request is made again with limit 10000 and the rows at or
// before since, which were read before, are dropped; a full page of nothing
// else is ErrMalformed.
//
// Errors are *StatusError, *LimitError, ErrMalformed (wrapped) or transport
// errors; see Transient. Changes is safe for concurrent use; its only side
// effect is the page size the client learns.
func (c *Client) Changes(ctx context.Context, since json.RawMessage, timeout time.Duration) (*Batch, error) {
	limit := c.pages.size()
	b, st, err := c.changes(ctx, since, timeout, limit)
	var te *transportError
	if errors.As(err, &te) && te.deadline {
		// The page did not arrive within the deadline: some sources
		// (pouchdb-server) build an answer whole before sending it.
		c.pages.cut(limit / 2)
	}
	if err != nil {
		return nil, err
	}
	if c.o.Fetch == config.FetchIncludeDocs {
		if b.Cut != "" {
			c.pages.cut(st.rows)
		} else {
			c.pages.done(st.rows >= limit, st.bytes, c.o.PageBytes)
		}
	}
	if syncGatewayFamily(c.o.SourceType) {
		if b, err = c.forward(ctx, since, timeout, b); err != nil {
			return nil, err
		}
	}
	for i := range b.Malformed {
		if b.Malformed[i].After == nil {
			b.Malformed[i].After = slices.Clone(since)
		}
	}
	if before, ok := SeqBefore(b.LastSeq, since); ok && before && (len(b.Rows) == 0 || readSeq(b.LastSeq).kind != seqPrefixed) {
		b.LastSeq = slices.Clone(since)
	}
	return b, nil
}

// forward makes a Sync Gateway family answer start after since (see Changes).
func (c *Client) forward(ctx context.Context, since json.RawMessage, timeout time.Duration, b *Batch) (*Batch, error) {
	from, ok := parseSGSeq(since)
	if !ok {
		return b, nil
	}
	if b.rowsBehind(from) && c.o.Limit < revocationPage {
		// Sync Gateway 3.1 pages a revocation wrongly: the page after the
		// last revoked row can start the revocation over, and a small limit
		// then cycles through it forever. The whole revocation in one page
		// ends it; the rows up to since were read before.
		var err error
		if b, _, err = c.changes(ctx, since, timeout, revocationPage); err != nil {
			return nil, err
		}
	}
	if b.rowsBehind(from) {
		b.dropUpTo(from)
		if len(b.Rows) == 0 && b.Full && b.Cut == "" {
			return nil, malformed("changes", "every row of a full page is at or before since %s", since)
		}
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
	kept := make([]int, len(b.Rows)+1) // kept[i]: rows kept before index i
	rows := b.Rows[:0]
	for i, r := range b.Rows {
		kept[i] = len(rows)
		if s, ok := parseSGSeq(r.Seq); ok && !from.before(s) {
			continue
		}
		rows = append(rows, r)
	}
	kept[len(b.Rows)] = len(rows)
	for k := range b.Malformed {
		b.Malformed[k].Before = kept[b.Malformed[k].Before]
	}
	b.Rows = rows
}

// pageStats is what reading one page took.
type pageStats struct {
	rows  int   // rows read, kept or not
	bytes int64 // of the answer, as far as it was read
}

func (c *Client) changes(ctx context.Context, since json.RawMessage, timeout time.Duration, limit int) (*Batch, pageStats, error) {
	q, err := c.feedQuery(since)
	if err != nil {
		return nil, pageStats{}, err
	}
	if timeout > 0 {
		q.Set("feed", "longpoll")
		q.Set("timeout", strconv.FormatInt(max(timeout.Milliseconds(), 1), 10))
	} else {
		q.Set("feed", "normal")
		timeout = 0
	}
	q.Set("limit", strconv.Itoa(limit))
	st, err := c.open(ctx, "changes", http.MethodGet, c.endpoint("_changes", q), acceptJSON, nil, timeout+c.o.Slack)
	if err != nil {
		return nil, pageStats{}, err
	}
	defer st.close()
	p := &pageReader{activeOnly: c.o.ActiveOnly, limit: limit, budget: c.o.PageBytes}
	b, err := p.read(st)
	stats := pageStats{rows: p.seen, bytes: st.body.n}
	if timeout > 0 && idle(err) {
		return &Batch{Rows: []Row{}, LastSeq: slices.Clone(since), Pending: -1}, stats, nil
	}
	return b, stats, err
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

// pageReader decodes a _changes answer as it arrives, one row at a time:
// nothing holds the whole answer, and reading stops once the rows read hold
// budget bytes (include_docs), so a page of large documents costs its
// budget, not its size. Not safe for concurrent use.
type pageReader struct {
	activeOnly bool
	limit      int   // the request's limit
	budget     int64 // stop after the row that reaches this many bytes

	b       *Batch
	seen    int             // rows read, kept or not
	pos     json.RawMessage // the seq of the last row read that had one
	lastSeq json.RawMessage
	hasLast bool
	results bool
	badLast string // what is wrong with last_seq, when the rows read stand in for it
}

// errPageFull stops reading at the page's budget.
var errPageFull = errors.New("page budget reached")

// read decodes the answer. An answer that breaks after whole rows (cut
// short, over the answer limit, not JSON further on) yields those rows as a
// cut batch: each row's seq is a place to resume from. With no whole row,
// the error is the stream's (see stream.fail) or ErrMalformed.
func (p *pageReader) read(st *stream) (*Batch, error) {
	p.b = &Batch{Rows: []Row{}, Pending: -1}
	err := p.answer(&valueScanner{r: st.body})
	switch {
	case errors.Is(err, errPageFull):
		return p.cut(fmt.Sprintf("page_bytes: the rows read reached %d bytes", p.budget)), nil
	case err != nil && p.pos != nil:
		return p.cut(st.fail(err, "").Error()), nil
	case errors.Is(err, errOverLimit):
		return nil, st.fail(err, "its first row")
	case err != nil && st.body.err != nil && errors.Is(err, st.body.err):
		return nil, st.fail(err, "")
	case err != nil:
		// Not JSON, or not an answer, in the bytes read: what the reader
		// read beyond them, over the limit or not, does not matter.
		return nil, malformed("changes", "%v", err)
	}
	return p.whole()
}

// whole ends the batch of an answer read to its end.
func (p *pageReader) whole() (*Batch, error) {
	if !p.results {
		return nil, malformed("changes", "no results")
	}
	switch {
	case !p.hasLast || isNull(p.lastSeq):
		p.badLast = "no last_seq"
	case emptySeq(p.lastSeq):
		// An empty since would read the feed again from its beginning.
		p.badLast = `last_seq is empty ("")`
	}
	if p.badLast != "" {
		if p.pos != nil {
			return p.cut("the answer's " + p.badLast + ": the batch ends after its last row"), nil
		}
		return nil, malformed("changes", "%s", p.badLast)
	}
	// The answer's own position is never before the last row it holds.
	p.b.LastSeq = NotBefore(p.lastSeq, p.pos)
	p.b.Full = p.seen >= p.limit
	return p.b, nil
}

// cut ends the batch after the rows read.
func (p *pageReader) cut(why string) *Batch {
	p.b.LastSeq, p.b.Full, p.b.Pending, p.b.Cut = p.pos, true, -1, why
	return p.b
}

// answer reads the answer's object: results, last_seq and pending, in any
// order; other members are skipped. Nothing after the object is read.
func (p *pageReader) answer(s *valueScanner) error {
	c, err := s.peek()
	if err != nil {
		return err
	}
	if c != '{' {
		// An answer that is a string, number or literal is read whole
		// first, as json.Decoder reads it: one over the answer limit
		// then says so.
		if c != '[' {
			if _, err := s.value(); err != nil {
				return err
			}
		}
		return s.unexpected(c, "where the answer's { belongs")
	}
	s.pos++
	if c, err := s.peek(); err != nil {
		return err
	} else if c == '}' {
		return nil
	}
	for {
		if c, err := s.peek(); err != nil {
			return err
		} else if c != '"' {
			return s.unexpected(c, "where a member's name belongs")
		}
		raw, err := s.value()
		if err != nil {
			return err
		}
		var name string
		if err := json.Unmarshal(raw, &name); err != nil {
			return fmt.Errorf("a member's name is %.40s, not a string", raw)
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		switch name {
		case "results":
			if err := p.rows(s); err != nil {
				return err
			}
		case "last_seq":
			v, err := s.value()
			if err != nil {
				return err
			}
			p.hasLast, p.lastSeq = true, bytes.Clone(v)
		case "pending":
			v, err := s.value()
			if err != nil {
				return err
			}
			if n, err := strconv.ParseInt(string(v), 10, 64); err == nil && n >= 0 {
				p.b.Pending = n
			}
		default:
			if _, err := s.value(); err != nil {
				return err
			}
		}
		if more, err := s.separator('}', "after a member of the answer"); err != nil || !more {
			return err
		}
	}
}

// rows reads the results array row by row.
func (p *pageReader) rows(s *valueScanner) error {
	c, err := s.peek()
	if err != nil {
		return err
	}
	if c == '{' {
		return errors.New("results is an object, not a list")
	}
	if c != '[' {
		v, err := s.value()
		switch {
		case err != nil:
			return err
		case string(v) == "null":
			return nil // "results":null: no results
		}
		return fmt.Errorf("results is %.40s, not a list", v)
	}
	s.pos++
	p.results = true
	if c, err := s.peek(); err != nil {
		return err
	} else if c == ']' {
		s.pos++
		return nil
	}
	for {
		v, err := s.value()
		if err != nil {
			return err
		}
		p.row(bytes.Clone(v)) // each row's own bytes: its Row keeps parts of them
		end := s.offset()
		c, err := s.peek()
		if err != nil {
			return err
		}
		if p.budget > 0 && end >= p.budget && p.pos != nil && c != ']' && c != '}' {
			return errPageFull
		}
		if more, err := s.separator(']', "after a row"); err != nil || !more {
			return err
		}
	}
}

// rowFields are a row's members, read leniently: a member of an
// unexpected type makes that member unusable, not the row.
type rowFields struct {
	Seq     json.RawMessage `json:"seq"`
	ID      json.RawMessage `json:"id"`
	Changes json.RawMessage `json:"changes"`
	Deleted json.RawMessage `json:"deleted"`
	Removed json.RawMessage `json:"removed"`
	Revoked json.RawMessage `json:"revoked"`
	Doc     json.RawMessage `json:"doc"`
}

// row turns one row into a Row, a dropped row, or a Malformed one:
//
//   - a row whose id is a non-empty string is a change of that document.
//     Without a usable revision (no changes list, an empty one, no rev) its
//     revision comes from the included doc, or else FetchDocs fetches the
//     current winner (Rev ""). Without a usable seq, Seq is nil: the row is
//     read again from the position before it until a later row moves on;
//   - a row without a usable id is Malformed;
//   - Sync Gateway's principal rows ("_user/..." without a revision) are
//     dropped, as are deleted and removed rows under ActiveOnly.
//
// raw is one whole JSON value, checked by what read it: a page's
// row by the valueScanner (json.Valid), a stream's by emit. The row is read in one
// pass (scanRow) and gives what json.Unmarshal into rowFields, then meta of
// its doc, would give.
func (p *pageReader) row(raw json.RawMessage) {
	p.seen++
	f, ok := scanRow(raw)
	if !ok {
		f = scannedRow{}
		if err := json.Unmarshal(raw, &f.rowFields); err != nil {
			p.malformed(raw, nil, "the row is not a JSON object")
			return
		}
	}
	seq := usableSeq(f.Seq)
	id, ok := plainString(f.ID)
	if !ok {
		if err := json.Unmarshal(f.ID, &id); err != nil {
			id = ""
		}
	}
	if id == "" {
		why := "the row has no id"
		if !isNull(f.ID) {
			why = fmt.Sprintf("the row's id %s is not a non-empty string", truncateRaw(f.ID, 64))
		}
		p.malformed(raw, seq, why)
		return
	}
	row := Row{Seq: seq, ID: id, Rev: firstRev(f.Changes), Deleted: isTrue(f.Deleted),
		Removed: present(f.Removed) || isTrue(f.Revoked), Revoked: isTrue(f.Revoked)}
	if !isNull(f.Doc) {
		// A row's doc can be a stub that says more than the row's flags:
		// Sync Gateway's {"_removed":true} on a revoked row. A doc that is
		// not a document is left out: the body is fetched instead.
		var m docMeta
		var err error
		switch {
		case !f.docRead:
			m, err = meta(f.Doc)
		case row.Rev == "":
			m = f.doc.meta()
		default: // the doc's _id and _rev are not needed: no strings made
			m = docMeta{Deleted: f.doc.deleted, Removed: f.doc.removed}
		}
		if err == nil {
			row.Deleted = row.Deleted || m.Deleted
			row.Removed = row.Removed || m.Removed
			if row.Rev == "" && m.Rev != "" {
				row.Rev = m.Rev
			}
			if !row.Deleted && !row.Removed {
				row.Doc = f.Doc
			}
		}
	}
	if seq != nil {
		p.pos = seq
	}
	if row.Rev == "" && strings.HasPrefix(id, "_user/") {
		return // a Sync Gateway principal change, not a document
	}
	// A deletion seen by a channel-restricted reader also lists the
	// channels it left (the tombstone has none): it is a deletion.
	if row.Deleted {
		row.Removed, row.Revoked = false, false
	}
	if p.activeOnly && (row.Deleted || row.Removed) {
		return
	}
	p.b.Rows = append(p.b.Rows, row)
}

// malformed records a row that names no document.
func (p *pageReader) malformed(raw json.RawMessage, seq json.RawMessage, why string) {
	p.b.Malformed = append(p.b.Malformed, Malformed{
		Before: len(p.b.Rows), Seq: seq, After: p.pos,
		Raw: slices.Clone(raw[:min(len(raw), MalformedRawMax)]), Reason: why,
	})
}

// usableSeq returns a row's seq when it can be sent back as since: any JSON
// value but null and the empty string.
func usableSeq(v json.RawMessage) json.RawMessage {
	if isNull(v) || emptySeq(v) {
		return nil
	}
	return v
}

// emptySeq reports whether v is the JSON string "".
func emptySeq(v json.RawMessage) bool {
	return string(bytes.TrimSpace(v)) == `""`
}

// firstRev returns changes[0].rev, or "" when the list is not one.
// changes is absent or one whole JSON value.
func firstRev(changes json.RawMessage) string {
	d := changes
	i := skipSpace(d, 0)
	if i >= len(d) || d[i] != '[' {
		return "" // absent, null or not a list
	}
	i = skipSpace(d, i+1)
	if i >= len(d) || d[i] != '{' {
		return "" // empty, or its first entry is not an object
	}
	var rev json.RawMessage
	_, ok := walkObject(d, i, func(name []byte, v int) (int, bool) {
		end := valueEnd(d, v)
		if end <= v {
			return 0, false
		}
		if foldedIs(name, "rev") {
			rev = d[v:end]
		}
		return end, true
	})
	if !ok {
		return firstRevSlow(changes)
	}
	if s, ok := plainString(rev); ok {
		return s
	}
	var s string
	if err := json.Unmarshal(rev, &s); err != nil {
		return ""
	}
	return s
}

// firstRevSlow is firstRev through encoding/json, for the names the quick
// reading leaves to it.
func firstRevSlow(changes json.RawMessage) string {
	var list []json.RawMessage
	if err := json.Unmarshal(changes, &list); err != nil || len(list) == 0 {
		return ""
	}
	var c struct {
		Rev json.RawMessage `json:"rev"`
	}
	if err := json.Unmarshal(list[0], &c); err != nil {
		return ""
	}
	var rev string
	if err := json.Unmarshal(c.Rev, &rev); err != nil {
		return ""
	}
	return rev
}

// isTrue reports whether v is the JSON literal true.
func isTrue(v json.RawMessage) bool { return string(bytes.TrimSpace(v)) == "true" }

// truncateRaw shortens raw JSON for a message.
func truncateRaw(v json.RawMessage, n int) string {
	if len(v) <= n {
		return string(v)
	}
	return string(v[:n]) + "…"
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

// isNull reports whether a raw value is absent or JSON null.
func isNull(v json.RawMessage) bool {
	t := bytes.TrimSpace(v)
	return len(t) == 0 || string(t) == "null"
}

// present reports whether a raw list is there and not empty. v is absent or
// one whole JSON value; anything but a list counts as set.
func present(v json.RawMessage) bool {
	if isNull(v) {
		return false
	}
	i := skipSpace(v, 0)
	if i >= len(v) || v[i] != '[' {
		return true
	}
	i = skipSpace(v, i+1)
	return i < len(v) && v[i] != ']'
}

// scannedRow is a row's members and, when its doc member is an object, what
// meta says of that doc.
type scannedRow struct {
	rowFields
	doc     plainMeta
	docRead bool // doc holds what meta(Doc) reads
}

// scanRow reads a row's members in one pass over raw, one whole JSON value,
// as json.Unmarshal into rowFields reads them: a name matches a member
// whatever its letter case, and a repeated name's last value wins. It
// reports false, leaving the row to json.Unmarshal, when raw is not an
// object or a name is not plain ASCII (escapes, or letters that Unicode
// folds onto ASCII ones), or a doc member is an object quickMeta leaves to
// meta.
func scanRow(raw []byte) (scannedRow, bool) {
	var r scannedRow
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return r, false
	}
	_, ok := walkObject(raw, i, func(name []byte, v int) (int, bool) {
		if foldedIs(name, "doc") && raw[v] == '{' {
			m, end, ok := metaAt(raw, v)
			if !ok {
				return 0, false
			}
			r.Doc, r.doc, r.docRead = raw[v:end:end], m, true
			return end, true
		}
		end := valueEnd(raw, v)
		if end <= v {
			return 0, false
		}
		val := json.RawMessage(raw[v:end:end])
		switch {
		case foldedIs(name, "seq"):
			r.Seq = val
		case foldedIs(name, "id"):
			r.ID = val
		case foldedIs(name, "changes"):
			r.Changes = val
		case foldedIs(name, "deleted"):
			r.Deleted = val
		case foldedIs(name, "removed"):
			r.Removed = val
		case foldedIs(name, "revoked"):
			r.Revoked = val
		case foldedIs(name, "doc"):
			r.Doc, r.doc, r.docRead = val, plainMeta{}, false
		}
		return end, true
	})
	return r, ok
}

// quickMeta reads the members meta reads from body, one whole JSON value, in
// one pass that steps over nested values. It reports false when body is not
// an object, or a name is not plain ASCII, or a member meta reads holds a
// value of another type or a string with escapes or invalid UTF-8: meta
// leaves those to json.Unmarshal, which errs on a wrong type.
func quickMeta(body []byte) (docMeta, bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return docMeta{}, false
	}
	m, _, ok := metaAt(body, i)
	return m.meta(), ok
}

// plainMeta is a docMeta whose strings are still the bytes between their
// quotes (plain: no escapes, valid UTF-8).
type plainMeta struct {
	id, rev          []byte
	deleted, removed bool
}

func (m plainMeta) meta() docMeta {
	return docMeta{ID: string(m.id), Rev: string(m.rev), Deleted: m.deleted, Removed: m.removed}
}

// metaAt reads the docMeta members of the object at d[i] (see quickMeta) and
// returns the index after it.
func metaAt(d []byte, i int) (plainMeta, int, bool) {
	var m plainMeta
	str := func(dst *[]byte, v int) (int, bool) {
		switch d[v] {
		case 'n':
			return v + len("null"), true // null leaves the field as it was
		case '"':
			end := stringEnd(d, v)
			if end < 0 || !plain(d[v+1:end-1]) {
				return 0, false
			}
			*dst = d[v+1 : end-1]
			return end, true
		}
		return 0, false
	}
	flag := func(dst *bool, v int) (int, bool) {
		switch d[v] {
		case 'n':
			return v + len("null"), true
		case 't':
			*dst = true
			return v + len("true"), true
		case 'f':
			*dst = false
			return v + len("false"), true
		}
		return 0, false
	}
	end, ok := walkObject(d, i, func(name []byte, v int) (int, bool) {
		switch {
		case foldedIs(name, "_id"):
			return str(&m.id, v)
		case foldedIs(name, "_rev"):
			return str(&m.rev, v)
		case foldedIs(name, "_deleted"):
			return flag(&m.deleted, v)
		case foldedIs(name, "_removed"):
			return flag(&m.removed, v)
		}
		end := valueEnd(d, v)
		return end, end > v
	})
	return m, end, ok
}

// walkObject calls member for each member of the object whose '{' is at
// d[i], with the member's name (the bytes between its quotes) and the index
// where its value starts; member returns the index after the value, and
// false to stop. walkObject returns the index after the object. d must be
// valid JSON; false also says a name is not plain ASCII (an escape, or a
// byte past ASCII).
func walkObject(d []byte, i int, member func(name []byte, v int) (int, bool)) (int, bool) {
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		return i + 1, true
	}
	for {
		if i >= len(d) || d[i] != '"' {
			return 0, false
		}
		end := stringEnd(d, i)
		if end < 0 {
			return 0, false
		}
		name := d[i+1 : end-1]
		for _, c := range name {
			if c >= utf8.RuneSelf || c == '\\' {
				return 0, false
			}
		}
		i = skipSpace(d, end)
		if i >= len(d) || d[i] != ':' {
			return 0, false
		}
		i = skipSpace(d, i+1)
		if i >= len(d) {
			return 0, false
		}
		j, ok := member(name, i)
		if !ok || j <= i || j > len(d) {
			return 0, false
		}
		i = skipSpace(d, j)
		if i >= len(d) {
			return 0, false
		}
		switch d[i] {
		case ',':
			i = skipSpace(d, i+1)
		case '}':
			return i + 1, true
		default:
			return 0, false
		}
	}
}

// valueEnd returns the index after the JSON value that starts at d[i], or
// -1 when d ends first. d must be valid JSON.
func valueEnd(d []byte, i int) int {
	switch d[i] {
	case '"':
		return stringEnd(d, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(d); j++ {
			switch d[j] {
			case '"':
				end := stringEnd(d, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	for j := i; j < len(d); j++ {
		switch d[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return j
		}
	}
	return len(d)
}

// stringEnd returns the index after the JSON string whose opening quote is
// at d[i], or -1 when d ends first.
func stringEnd(d []byte, i int) int {
	for j := i + 1; j < len(d); j++ {
		k := bytes.IndexByte(d[j:], '"')
		if k < 0 {
			return -1
		}
		j += k
		escapes := 0
		for b := j - 1; b > i && d[b] == '\\'; b-- {
			escapes++
		}
		if escapes%2 == 0 {
			return j + 1
		}
	}
	return -1
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(d []byte, i int) int {
	for i < len(d) {
		switch d[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// foldedIs reports whether a plain ASCII name matches a lower-case field
// name the way encoding/json matches them: ASCII letters in either case.
func foldedIs(name []byte, field string) bool {
	if len(name) != len(field) {
		return false
	}
	for k, c := range name {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != field[k] {
			return false
		}
	}
	return true
}

// plainString returns the content of a JSON string that needs no decoding:
// no escapes and valid UTF-8. ok is false for anything else, which
// json.Unmarshal decodes.
func plainString(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	if s := v[1 : len(v)-1]; plain(s) {
		return string(s), true
	}
	return "", false
}

// plain reports whether the bytes between a JSON string's quotes are its
// content: no escapes, valid UTF-8.
func plain(s []byte) bool {
	return bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s)
}
