// Package attach copies the attachments of fetched documents to S3 and
// rewrites each document's _attachments entries into references, between
// fetching bodies and queueing them.
//
// Objects are content-addressed: the key holds the attachment's digest, so an
// attachment that did not change (a new revision of its document, or the same
// content in another document) is found by a HEAD and neither fetched from
// the source nor uploaded again, and a key never holds two contents. The
// pipeline never deletes these objects (docs/outputs.md says why).
package attach

import (
	"context"
	"crypto/md5"
	"crypto/sha1"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/docid"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/statetable/quarantine"
)

// Source opens one attachment of one revision; a missing one is an error
// matching feed.ErrNotFound. *feed.Client satisfies it.
type Source interface {
	Attachment(ctx context.Context, id, rev, name string) (io.ReadCloser, error)
}

var _ Source = (*feed.Client)(nil)

// Skip reasons written to an entry as "s3_skipped".
const (
	SkippedTooLarge = "too_large"
	SkippedMissing  = "missing"
	// SkippedMismatch: the source's content does not match the entry
	// (length or digest). The document is delivered without the copy and
	// the attachment is recorded in the job's quarantine.
	SkippedMismatch = "mismatch"
)

// ErrContent is wrapped by the error of an attachment whose content does not
// match its entry (length or digest); retrying does not help.
var ErrContent = errors.New("content does not match the attachment's entry")

// Quarantine records an attachment whose content does not match its entry
// (*quarantine.Store).
type Quarantine interface {
	Record(ctx context.Context, e quarantine.Entry) error
}

var _ Quarantine = (*quarantine.Store)(nil)

// DefaultPartSize is the multipart part size, and the most one upload holds
// in memory.
const DefaultPartSize = 8 << 20

// DefaultConcurrency bounds the attachments copied at a time.
const DefaultConcurrency = 4

// DefaultTimeout bounds the transfer of one attachment from the source.
const DefaultTimeout = time.Minute

// Stage copies attachments. Its fields are set once; Process is safe for
// concurrent use on distinct rows.
type Stage struct {
	Config *config.Attachments
	Source Source
	S3     S3
	Log    *slog.Logger
	// Job names the job in quarantine entries.
	Job string
	// Quarantine records the attachments whose content does not match
	// their entry. Nil: they are only logged.
	Quarantine Quarantine
	// Timeout bounds the transfer of one attachment from the source, from
	// the request to the last byte (its upload to S3 runs meanwhile).
	// Default DefaultTimeout.
	Timeout time.Duration
	// Concurrency bounds the attachments fetched and uploaded at a time.
	// Default DefaultConcurrency.
	Concurrency int
	// PartSize is the multipart part size (at least 5 MiB on AWS). Default
	// DefaultPartSize.
	PartSize int64
}

// Stats counts what one Process call did.
type Stats struct {
	Attachments int           // entries rewritten (referenced or skipped)
	Uploaded    int           // objects written
	Present     int           // objects found already in S3 (not fetched)
	Skipped     int           // entries marked s3_skipped
	Bytes       int64         // bytes uploaded
	Elapsed     time.Duration // wall time of the call
}

// Process rewrites the _attachments of every row that has a body: each
// entry loses data, stub, follows, encoding and encoded_length, keeps the
// rest (content_type, digest, length, revpos) and gains s3_bucket and
// s3_key, once the object is in S3, or s3_skipped. Rows are changed only
// when every attachment of the call succeeded, so a failed call can be
// repeated. An error from S3 or the source's transport, or a quarantine
// record that could not be written, is transient (feed.Transient); a
// missing attachment with on_missing "fail" is not. Content that does not
// match its entry's length or digest fails no call: at most the entry's
// length (or max_bytes) and one byte more is read, the entry is marked
// SkippedMismatch and recorded in the quarantine, and the document goes on.
func (s *Stage) Process(ctx context.Context, rows []feed.Row) (Stats, error) {
	start := time.Now()
	var st Stats
	var docs []*docAtts
	objects := map[string]*object{}
	for i := range rows {
		r := &rows[i]
		if r.Deleted || r.Removed || len(r.Doc) == 0 {
			continue
		}
		var doc map[string]json.RawMessage
		if err := json.Unmarshal(r.Doc, &doc); err != nil {
			return st, fmt.Errorf("read attachments of %q: %w", r.ID, err)
		}
		raw, ok := doc["_attachments"]
		if !ok || string(raw) == "null" {
			continue
		}
		var rawEntries map[string]json.RawMessage
		if err := json.Unmarshal(raw, &rawEntries); err != nil {
			return st, fmt.Errorf("read attachments of %q: _attachments: %w", r.ID, err)
		}
		if len(rawEntries) == 0 {
			continue
		}
		entries := make(map[string]map[string]json.RawMessage, len(rawEntries))
		for name, e := range rawEntries {
			var fields map[string]json.RawMessage
			if err := json.Unmarshal(e, &fields); err != nil {
				return st, fmt.Errorf("read attachments of %q: _attachments: %q: %w", r.ID, name, err)
			}
			if fields == nil {
				fields = map[string]json.RawMessage{}
			}
			entries[name] = fields
		}
		d := &docAtts{row: i, doc: doc, raw: rawEntries, entries: entries, refs: map[string]*object{}}
		for name, e := range entries {
			a, err := parseEntry(r.ID, r.Rev, name, e)
			if err != nil {
				return st, err
			}
			if a.length > s.Config.MaxBytes {
				d.refs[name] = &object{skipped: SkippedTooLarge}
				continue
			}
			key := s.key(a)
			o, ok := objects[key]
			if !ok {
				o = &object{key: key, att: a}
				objects[key] = o
			}
			d.refs[name] = o
		}
		docs = append(docs, d)
	}
	if len(objects) == 0 && len(docs) == 0 {
		return st, nil
	}

	g, gctx := errgroup.WithContext(ctx)
	limit := s.Concurrency
	if limit <= 0 {
		limit = DefaultConcurrency
	}
	g.SetLimit(limit)
	var mu sync.Mutex
	for _, o := range objects {
		g.Go(func() error {
			err := s.copy(gctx, o)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, ErrContent):
				o.skipped, o.err = SkippedMismatch, err
			case err != nil:
				return err
			case o.uploaded:
				st.Uploaded++
				st.Bytes += o.bytes
			case o.skipped == "":
				st.Present++
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return st, err
	}
	if err := s.quarantine(ctx, rows, docs); err != nil {
		return st, err
	}

	for _, d := range docs {
		r := &rows[d.row]
		for name, e := range d.entries {
			o := d.refs[name]
			for _, f := range []string{"data", "stub", "follows", "encoding", "encoded_length"} {
				delete(e, f)
			}
			st.Attachments++
			if o.skipped != "" {
				e["s3_skipped"], _ = json.Marshal(o.skipped)
				st.Skipped++
				if o.err == nil { // a mismatch was logged by quarantine
					s.logger().Warn("attachment not copied", "doc_id", r.ID, "rev", r.Rev, "name", name, "reason", o.skipped)
				}
				continue
			}
			e["s3_bucket"], _ = json.Marshal(s.Config.Bucket)
			e["s3_key"], _ = json.Marshal(o.key)
		}
		b, err := json.Marshal(d.entries)
		if err != nil {
			return st, fmt.Errorf("write attachments of %q: %w", r.ID, err)
		}
		d.doc["_attachments"] = b
		body, err := json.Marshal(d.doc)
		if err != nil {
			return st, fmt.Errorf("write document %q: %w", r.ID, err)
		}
		r.Doc = body
	}
	st.Elapsed = time.Since(start)
	return st, nil
}

// quarantine logs and records every attachment of docs whose content did
// not match its entry. It runs before any row is changed: an attachment that
// cannot be recorded fails the call (transiently), so that none is skipped
// unrecorded.
func (s *Stage) quarantine(ctx context.Context, rows []feed.Row, docs []*docAtts) error {
	for _, d := range docs {
		r := &rows[d.row]
		for name, o := range d.refs {
			if o.err == nil {
				continue
			}
			raw, _ := json.Marshal(map[string]json.RawMessage{name: d.raw[name]})
			e := quarantine.Entry{Job: s.Job, Kind: quarantine.Attachment, Seq: r.Seq, Reason: o.err.Error(), Raw: raw}
			s.logger().Error("attachment content does not match its entry; delivered without it",
				"doc_id", r.ID, "rev", r.Rev, "seq", string(r.Seq), "name", name, "error", o.err, "quarantine_key", e.Key())
			if s.Quarantine == nil {
				continue
			}
			if err := s.Quarantine.Record(ctx, e); err != nil {
				return feed.MarkTransient(fmt.Errorf("record attachment %q of %q: %w", name, r.ID, err))
			}
		}
	}
	return nil
}

func (s *Stage) logger() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.New(slog.DiscardHandler)
}

// docAtts is a row's document with its _attachments entries.
type docAtts struct {
	row     int
	doc     map[string]json.RawMessage
	raw     map[string]json.RawMessage // the entries as the source sent them
	entries map[string]map[string]json.RawMessage
	refs    map[string]*object
}

// attachment is one _attachments entry of one revision.
type attachment struct {
	docID, rev, name string
	contentType      string
	digest           string // as the source gave it, e.g. "md5-<base64>"
	keyDigest        string // "<algorithm>-<hex>"
	length           int64  // -1 when the entry has none
	data             []byte // inline content, when the source sent it
	encoded          bool   // stored compressed at the source
	newHash          func() hash.Hash
	sum              []byte
}

// object is one S3 object to make sure of.
type object struct {
	key      string
	att      *attachment
	skipped  string
	err      error // the content did not match (SkippedMismatch)
	uploaded bool
	bytes    int64
}

func parseEntry(id, rev, name string, e map[string]json.RawMessage) (*attachment, error) {
	a := &attachment{docID: id, rev: rev, name: name, length: -1}
	str := func(field string) (string, error) {
		raw, ok := e[field]
		if !ok {
			return "", nil
		}
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			return "", fmt.Errorf("attachment %q of %q: %s: %w", name, id, field, err)
		}
		return v, nil
	}
	var err error
	if a.contentType, err = str("content_type"); err != nil {
		return nil, err
	}
	if a.digest, err = str("digest"); err != nil {
		return nil, err
	}
	if raw, ok := e["length"]; ok {
		if err := json.Unmarshal(raw, &a.length); err != nil {
			return nil, fmt.Errorf("attachment %q of %q: length: %w", name, id, err)
		}
	}
	if data, err := str("data"); err != nil {
		return nil, err
	} else if data != "" {
		if a.data, err = base64.StdEncoding.DecodeString(data); err != nil {
			return nil, fmt.Errorf("attachment %q of %q: data: %w", name, id, err)
		}
		if a.length < 0 {
			a.length = int64(len(a.data))
		}
	}
	_, a.encoded = e["encoding"]
	algo, b64, ok := strings.Cut(a.digest, "-")
	if !ok || a.digest == "" {
		return nil, fmt.Errorf("attachment %q of %q: digest %q is not <algorithm>-<base64>", name, id, a.digest)
	}
	sum, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("attachment %q of %q: digest %q is not <algorithm>-<base64>", name, id, a.digest)
	}
	a.keyDigest = algo + "-" + hex.EncodeToString(sum)
	switch algo {
	case "md5":
		a.newHash, a.sum = md5.New, sum
	case "sha1":
		a.newHash, a.sum = sha1.New, sum
	}
	return a, nil
}

// key is the object key of an attachment.
func (s *Stage) key(a *attachment) string {
	k := strings.NewReplacer(
		"{digest}", a.keyDigest,
		"{doc_id}", docid.PathSegment(a.docID),
		"{name}", docid.PathSegment(a.name),
	).Replace(s.Config.KeyTemplate)
	return s.Config.Prefix + k
}

// copy makes sure the object is in S3: HEAD, then fetch and upload.
func (s *Stage) copy(ctx context.Context, o *object) error {
	a := o.att
	ok, err := exists(ctx, s.S3, s.Config.Bucket, o.key)
	if err != nil {
		return feed.MarkTransient(fmt.Errorf("copy attachment %q of %q: %w", a.name, a.docID, err))
	}
	if ok {
		return nil
	}
	var body io.ReadCloser
	if a.data != nil {
		body = io.NopCloser(strings.NewReader(string(a.data)))
	} else {
		timeout := s.Timeout
		if timeout <= 0 {
			timeout = DefaultTimeout
		}
		sctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		body, err = s.Source.Attachment(sctx, a.docID, a.rev, a.name)
		if errors.Is(err, feed.ErrNotFound) && s.Config.OnMissing == config.OnMissingSkip {
			o.skipped = SkippedMissing
			return nil
		}
		if err != nil {
			return fmt.Errorf("copy attachment %q of %q rev %s: %w", a.name, a.docID, a.rev, err)
		}
	}
	defer body.Close()
	limit := s.Config.MaxBytes
	// One byte past what the entry allows tells that the content is longer;
	// the rest is never read.
	bound := limit
	if a.length >= 0 {
		bound = a.length
	}
	var r io.Reader = io.LimitReader(body, bound+1)
	var h hash.Hash
	if a.newHash != nil && !a.encoded {
		h = a.newHash()
		r = io.TeeReader(r, h)
	}
	counted := &countingReader{r: r}
	check := func() error {
		if a.length >= 0 && counted.n != a.length {
			return fmt.Errorf("copy attachment %q of %q rev %s: %w: %d bytes read, the entry says %d", a.name, a.docID, a.rev, ErrContent, counted.n, a.length)
		}
		if a.length < 0 && counted.n > limit {
			return fmt.Errorf("copy attachment %q of %q rev %s: %w: more than max_bytes %d", a.name, a.docID, a.rev, ErrContent, limit)
		}
		if h != nil && string(h.Sum(nil)) != string(a.sum) {
			return fmt.Errorf("copy attachment %q of %q rev %s: %w: digest is not %s", a.name, a.docID, a.rev, ErrContent, a.digest)
		}
		return nil
	}
	part := s.PartSize
	if part <= 0 {
		part = DefaultPartSize
	}
	n, err := upload(ctx, s.S3, s.Config.Bucket, o.key, a.contentType, counted, part, check)
	if errors.Is(err, ErrContent) {
		return err
	}
	if err != nil {
		return feed.MarkTransient(fmt.Errorf("copy attachment %q of %q: %w", a.name, a.docID, err))
	}
	o.uploaded, o.bytes = true, n
	return nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
