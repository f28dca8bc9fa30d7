// Package attach copies the attachments of fetched documents to S3 and
// rewrites each document's _attachments entries into references, between
// fetching bodies and queueing them.
//
// Objects are content-addressed: the key holds the attachment's digest, so an
// attachment that did not change (a new revision of its document, or the same
// content in another document) is found by a HEAD and neither fetched from
// the source nor uploaded again. Only bytes checked against the digest are
// written under it (an md5 or sha1 digest, of the content or of the
// compressed form the source stores), so a key never holds two contents and
// whichever document writes a digest first writes the right bytes. The
// pipeline never deletes these objects (docs/outputs.md says why).
package attach

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// Source opens one attachment of one revision, asking for the form the
// source stores (encoding: the answer's Content-Encoding, "" or "gzip"); a
// missing one is an error matching feed.ErrNotFound. *feed.Client
// satisfies it.
type Source interface {
	Attachment(ctx context.Context, id, rev, name string) (body io.ReadCloser, encoding string, err error)
}

var _ Source = (*feed.Client)(nil)

// Skip reasons written to an entry as "s3_skipped". The last four are
// failures of the copy: the document is delivered without it and the
// attachment is recorded in the job's quarantine, with the reason.
const (
	SkippedTooLarge = "too_large"
	SkippedMissing  = "missing"
	// SkippedMismatch: the source's content does not match the entry
	// (length or digest).
	SkippedMismatch = "mismatch"
	// SkippedInvalid: the entry cannot be copied as it is (not an
	// object, a field of the wrong type, data that is not base64, a
	// digest that is not an md5 or sha1 digest).
	SkippedInvalid = "invalid"
	// SkippedRefused: S3 refuses the object (its key is too long, or a
	// 4xx about the object itself).
	SkippedRefused = "refused"
	// SkippedFailed: the transfer from the source failed
	// config.Attachments.Attempts times (stalled, too slow, cut off, an
	// error answer from the source).
	SkippedFailed = "failed"
)

// ErrContent is wrapped by the error of an attachment whose content does not
// match its entry (length or digest); retrying does not help.
var ErrContent = errors.New("content does not match the attachment's entry")

// ErrRefused is wrapped by the error of an attachment whose object S3
// refuses; retrying sends the same request.
var ErrRefused = errors.New("S3 refuses the attachment's object")

// Quarantine records the attachments delivered without their copy
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

// MaxKeyBytes is the longest object key S3 accepts.
const MaxKeyBytes = 1024

// Stage copies attachments. Its exported fields are set once; Process is
// safe for concurrent use on distinct rows. A Stage counts the failed
// transfers of each attachment across calls, so it lives as long as its
// poller.
type Stage struct {
	// Config is the job's setting, with its defaults (config.Parse).
	Config *config.Attachments
	Source Source
	S3     S3
	Log    *slog.Logger
	// Job names the job in quarantine entries.
	Job string
	// Quarantine records the attachments delivered without their copy.
	// Nil: they are only logged.
	Quarantine Quarantine
	// IDs is how the quarantine records show document ids (the logs show
	// them as Log does). Zero: as they are.
	IDs docid.Exposure
	// Concurrency bounds the attachments fetched and uploaded at a time.
	// Default DefaultConcurrency.
	Concurrency int
	// PartSize is the multipart part size (at least 5 MiB on AWS). Default
	// DefaultPartSize.
	PartSize int64

	mu       sync.Mutex
	failures map[string]failures // failed transfers by object key, until copied or given up
}

// failures are the counted failed transfers of one attachment.
type failures struct {
	n    int
	last time.Time // when the last one counted
}

// Stats counts what one Process call did.
type Stats struct {
	Attachments int           // entries rewritten (referenced or skipped)
	Uploaded    int           // objects written
	Present     int           // objects found already in S3 (not fetched)
	Skipped     int           // entries marked s3_skipped
	Quarantined int           // attachments (or _attachments) recorded in the quarantine
	Bytes       int64         // bytes uploaded
	Elapsed     time.Duration // wall time of the call
}

// Process rewrites the _attachments of every row that has a body: each
// entry loses data, stub, follows, encoding and encoded_length, keeps the
// rest (content_type, digest, length, revpos) and gains s3_bucket and
// s3_key, once the object is in S3, or s3_skipped. Rows are changed only
// when the call succeeds, so a failed call can be repeated.
//
// What is wrong with one attachment fails no call: content that does not
// match its entry (at most the entry's length, or max_bytes, and one byte
// more is read), an entry that cannot be copied, an object S3 refuses, and
// a transfer that failed config.Attachments.Attempts times each mark the
// entry (SkippedMismatch, SkippedInvalid, SkippedRefused, SkippedFailed)
// and are recorded in the quarantine, and the document goes on. A failed
// transfer before that, an error from S3 or the source's transport, or a
// quarantine record that could not be written is transient
// (feed.Transient); a missing attachment with on_missing "fail" is not.
func (s *Stage) Process(ctx context.Context, rows []feed.Row) (Stats, error) {
	start := time.Now()
	var st Stats
	var docs []*docAtts
	objects := map[string]*object{}
	for i := range rows {
		d := s.read(i, &rows[i])
		if d == nil {
			continue
		}
		for name, ref := range d.refs {
			if ref.key == "" {
				continue
			}
			if o, ok := objects[ref.key]; ok {
				d.refs[name] = o
				continue
			}
			objects[ref.key] = ref
		}
		docs = append(docs, d)
	}
	if len(docs) == 0 {
		return st, nil
	}

	if err := s.copyAll(ctx, objects, &st); err != nil {
		return st, err
	}
	n, err := s.quarantine(ctx, rows, docs)
	if err != nil {
		return st, err
	}
	st.Quarantined = n

	for _, d := range docs {
		if d.entries == nil {
			continue // _attachments is not an object: left as it is
		}
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
				if o.err == nil { // the others were logged by quarantine
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

// read reads the attachments of row i: nil when it has none to rewrite or
// record. Each entry gets an object to copy, or one already decided
// (skipped, with the error to record when the entry cannot be copied). A
// body that is not a JSON object is left to the outputs: it names no
// attachment.
func (s *Stage) read(i int, r *feed.Row) *docAtts {
	if r.Deleted || r.Removed || len(r.Doc) == 0 {
		return nil
	}
	var doc map[string]json.RawMessage
	if json.Unmarshal(r.Doc, &doc) != nil {
		return nil
	}
	raw, ok := doc["_attachments"]
	if !ok || string(raw) == "null" {
		return nil
	}
	d := &docAtts{row: i, doc: doc, refs: map[string]*object{}}
	if err := json.Unmarshal(raw, &d.raw); err != nil {
		d.invalid = fmt.Errorf("attachments of %q rev %s: _attachments is not an object", r.ID, r.Rev)
		return d
	}
	if len(d.raw) == 0 {
		return nil
	}
	d.entries = make(map[string]map[string]json.RawMessage, len(d.raw))
	for name, e := range d.raw {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(e, &fields); err != nil || fields == nil {
			d.entries[name] = map[string]json.RawMessage{}
			d.refs[name] = &object{skipped: SkippedInvalid, err: fmt.Errorf("attachment %q of %q rev %s: the entry is not an object", name, r.ID, r.Rev)}
			continue
		}
		d.entries[name] = fields
		a, err := parseEntry(r.ID, r.Rev, name, fields)
		switch {
		case err != nil:
			d.refs[name] = &object{skipped: SkippedInvalid, err: err}
		case a.length > s.Config.MaxBytes:
			d.refs[name] = &object{skipped: SkippedTooLarge}
		default:
			key := s.key(a)
			if len(key) > MaxKeyBytes {
				d.refs[name] = &object{skipped: SkippedRefused, err: fmt.Errorf("attachment %q of %q rev %s: %w: its key is %d bytes, S3 takes at most %d",
					name, r.ID, r.Rev, ErrRefused, len(key), MaxKeyBytes)}
				continue
			}
			d.refs[name] = &object{key: key, att: a}
		}
	}
	return d
}

// copyAll copies the objects, Concurrency at a time. A copy that fails does
// not stop the others, so that what could be copied is in S3 when the call
// is repeated; the first error that fails the call is returned once all are
// done.
func (s *Stage) copyAll(ctx context.Context, objects map[string]*object, st *Stats) error {
	limit := s.Concurrency
	if limit <= 0 {
		limit = DefaultConcurrency
	}
	var g errgroup.Group
	g.SetLimit(limit)
	var mu sync.Mutex
	for _, o := range objects {
		g.Go(func() error {
			if err := s.settle(o, s.copy(ctx, o)); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case o.uploaded:
				st.Uploaded++
				st.Bytes += o.bytes
			case o.skipped == "":
				st.Present++
			}
			return nil
		})
	}
	return g.Wait()
}

// settle decides on the outcome of one copy: content that does not match
// and an object S3 refuses mark it at once; a failed transfer counts
// against the attachment and marks it once it has failed Attempts times
// (it is a transient error until then); anything else is returned as is.
// A copy made forgets the count.
func (s *Stage) settle(o *object, err error) error {
	var fail *transferError
	switch {
	case err == nil:
		s.forget(o.key)
		return nil
	case errors.Is(err, ErrContent):
		s.forget(o.key)
		o.skipped, o.err = SkippedMismatch, err
		return nil
	case errors.Is(err, ErrRefused):
		s.forget(o.key)
		o.skipped, o.err = SkippedRefused, err
		return nil
	case errors.As(err, &fail):
		n, limit := s.failed(o.key), s.attempts()
		if n >= limit {
			s.forget(o.key)
			o.skipped, o.attempts = SkippedFailed, n
			o.err = fmt.Errorf("%s: the transfer failed %d times, the last: %w", fail.what, n, fail.err)
			return nil
		}
		s.logger().Warn("attachment transfer failed; the page is read again", "doc_id", o.att.docID, "rev", o.att.rev, "name", o.att.name,
			"attempt", n, "attempts", limit, "error", fail.err)
		return feed.MarkTransient(fmt.Errorf("%s: transfer %d of at most %d failed: %w", fail.what, n, limit, fail.err))
	}
	return err
}

func (s *Stage) stallTimeout() time.Duration {
	if d := s.Config.StallTimeout.D(); d > 0 {
		return d
	}
	return config.DefaultAttachmentStallTimeout
}

func (s *Stage) attempts() int {
	if n := s.Config.Attempts; n > 0 {
		return n
	}
	return config.DefaultAttachmentAttempts
}

// failed counts one more failed transfer of the object, unless the last
// one counted is less than a stall timeout ago, and returns the count. The
// spacing keeps a short hiccup of the source (a restart, a load balancer
// cutting connections for a few seconds), met by the poller's quick
// retries, from giving up a copy: it is given up after failing for at
// least (Attempts - 1) stall timeouts.
func (s *Stage) failed(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failures == nil || len(s.failures) >= maxCounted {
		s.failures = map[string]failures{}
	}
	f, now := s.failures[key], time.Now()
	if f.n == 0 || now.Sub(f.last) >= s.stallTimeout() {
		f.n, f.last = f.n+1, now
		s.failures[key] = f
	}
	return f.n
}

func (s *Stage) forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.failures, key)
}

// maxCounted bounds the attachments whose failed transfers are counted;
// past it the counts start again.
const maxCounted = 10000

// quarantine logs and records every attachment of docs delivered without
// its copy because the copy cannot be made, and every document whose
// _attachments is not an object, and returns how many it recorded. It runs
// before any row is changed: an attachment that cannot be recorded fails
// the call (transiently), so that none is skipped unrecorded.
func (s *Stage) quarantine(ctx context.Context, rows []feed.Row, docs []*docAtts) (int, error) {
	n := 0
	for _, d := range docs {
		r := &rows[d.row]
		var found []quarantine.Entry
		if d.invalid != nil {
			raw, _ := json.Marshal(map[string]json.RawMessage{"_attachments": d.doc["_attachments"]})
			found = append(found, quarantine.Entry{Job: s.Job, Kind: quarantine.Attachment, Seq: r.Seq, Reason: s.IDs.Scrub(d.invalid.Error(), r.ID), Raw: raw})
			s.logger().Error("attachments cannot be read; document delivered as it is",
				"doc_id", r.ID, "rev", r.Rev, "seq", string(r.Seq), "error", d.invalid, "quarantine_key", found[0].Key())
		}
		for name, o := range d.refs {
			if o.err == nil {
				continue
			}
			raw, _ := json.Marshal(map[string]json.RawMessage{name: d.raw[name]})
			e := quarantine.Entry{Job: s.Job, Kind: quarantine.Attachment, Seq: r.Seq, Reason: s.IDs.Scrub(o.err.Error(), r.ID), Raw: raw, Attempts: int64(o.attempts)}
			s.logger().Error("attachment not copied; delivered without it",
				"doc_id", r.ID, "rev", r.Rev, "seq", string(r.Seq), "name", name, "reason", o.skipped, "error", o.err, "quarantine_key", e.Key())
			found = append(found, e)
		}
		for _, e := range found {
			n++
			if s.Quarantine == nil {
				continue
			}
			if err := s.Quarantine.Record(ctx, e); err != nil {
				return n, feed.MarkTransient(fmt.Errorf("record attachments of %q: %w", r.ID, err))
			}
		}
	}
	return n, nil
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
	// invalid: _attachments is not an object (entries is nil).
	invalid error
}

// attachment is one _attachments entry of one revision.
type attachment struct {
	docID, rev, name string
	contentType      string // a valid media type, or ""
	digest           string // as the source gave it, e.g. "md5-<base64>"
	keyDigest        string // "<algorithm>-<hex>"
	length           int64  // -1 when the entry has none
	data             []byte // inline content, when the source sent it
	algo             string // "md5" or "sha1"
	sum              []byte
}

// object is one S3 object to make sure of, or an entry decided without one
// (key "").
type object struct {
	key      string
	att      *attachment
	skipped  string
	err      error // why the copy cannot be made, recorded in the quarantine
	attempts int   // failed transfers, when given up
	uploaded bool
	bytes    int64
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

// copy makes sure the object is in S3: HEAD, then fetch and upload. A
// failure that may be the attachment's own (see transfer) comes back as a
// *transferError.
func (s *Stage) copy(ctx context.Context, o *object) error {
	a := o.att
	what := fmt.Sprintf("copy attachment %q of %q rev %s", a.name, a.docID, a.rev)
	ok, err := exists(ctx, s.S3, s.Config.Bucket, o.key)
	if err != nil {
		return feed.MarkTransient(fmt.Errorf("%s: %w", what, err))
	}
	if ok {
		return nil
	}
	part := s.PartSize
	if part <= 0 {
		part = DefaultPartSize
	}
	if a.data != nil {
		c := newContent(a, "", s.Config.MaxBytes)
		r, err := c.reader(bytes.NewReader(a.data))
		if err == nil {
			o.bytes, err = upload(ctx, s.S3, s.Config.Bucket, o.key, a.contentType, r, part, nil, c.check)
		}
		switch {
		case err == nil:
			o.uploaded = true
			return nil
		case errors.Is(err, ErrContent):
			return fmt.Errorf("%s: %w", what, err)
		}
		return s3Failure(what, err)
	}
	return s.transfer(ctx, o, what, part)
}

// transfer streams the attachment from the source to S3 within its time:
// it fails when the source sends nothing for StallTimeout (S3 stalling is
// S3's failure), when it has not finished by StallTimeout plus its size at
// MinBytesPerSecond, or when the caller's deadline is near (an invocation's
// end: what is left of it, less a margin to wind down). Those, a body cut
// short and an error answer (see attemptedBy) are the attachment's failed
// transfers (*transferError): the source answered for it and then failed.
// A source that cannot be reached, or answers 503, 429 or 408, has not
// tried: those are transient and count nothing.
func (s *Stage) transfer(ctx context.Context, o *object, what string, part int64) error {
	a := o.att
	size := a.length
	if size < 0 {
		size = s.Config.MaxBytes
	}
	stall := s.stallTimeout()
	rate := s.Config.MinBytesPerSecond
	if rate <= 0 {
		rate = config.DefaultAttachmentMinRate
	}
	now := time.Now()
	deadline := now.Add(stall + time.Duration(float64(size)/float64(rate)*float64(time.Second)))
	ends := errTooSlow
	if d, ok := ctx.Deadline(); ok {
		if end := d.Add(-windDown(d.Sub(now))); end.Before(deadline) {
			deadline, ends = end, errInvocationEnds
		}
	}
	w := newWatch(ctx, stall, deadline, ends)
	defer w.stop()

	body, encoding, err := s.Source.Attachment(w.ctx, a.docID, a.rev, a.name)
	if errors.Is(err, feed.ErrNotFound) && s.Config.OnMissing == config.OnMissingSkip {
		o.skipped = SkippedMissing
		return nil
	}
	if err != nil {
		return w.classify(what, err, attemptedBy(err))
	}
	defer body.Close()
	w.progress() // the answer began
	c := newContent(a, encoding, s.Config.MaxBytes)
	r, err := c.reader(w.source(body))
	if err != nil {
		if errors.Is(err, ErrContent) {
			return fmt.Errorf("%s: %w", what, err)
		}
		return w.classify(what, err, true)
	}
	n, err := upload(w.ctx, s.S3, s.Config.Bucket, o.key, a.contentType, r, part, w.progress, c.check)
	var re *readError
	switch {
	case err == nil:
		o.uploaded, o.bytes = true, n
		return nil
	case errors.Is(err, ErrContent):
		return fmt.Errorf("%s: %w", what, err)
	case errors.As(err, &re):
		return w.classify(what, err, true)
	}
	if serr := w.stopped(what); serr != nil {
		return serr
	}
	return s3Failure(what, err)
}

// attemptedBy reports whether a failed request for an attachment is the
// source failing that attachment, rather than the source not being there
// or not letting us in: any answer but 401 and 403 (our credentials, the
// job's failure), 404 (on_missing decides), and 408, 429 and 503 (which ask
// to come back later).
func attemptedBy(err error) bool {
	var se *feed.StatusError
	if !errors.As(err, &se) {
		return false
	}
	switch se.Status {
	case 401, 403, 404, 408, 429, 503:
		return false
	}
	return true
}

// windDown is the time kept free before a deadline that is left after a
// transfer: a tenth of what is left, between 1 s and 5 s.
func windDown(left time.Duration) time.Duration {
	return min(max(left/10, time.Second), 5*time.Second)
}

// Why the source's part of a watched transfer was stopped (see watch).
var (
	errStalled        = errors.New("no progress from the source")
	errTooSlow        = errors.New("the transfer is slower than min_bytes_per_second")
	errInvocationEnds = errors.New("the invocation ends before the transfer does")
)

// transferError is a failed transfer of one attachment that counts against
// it (config.Attachments.Attempts).
type transferError struct {
	what string
	err  error
}

func (e *transferError) Error() string { return e.what + ": " + e.err.Error() }
func (e *transferError) Unwrap() error { return e.err }
