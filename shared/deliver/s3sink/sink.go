// Package s3sink writes one JSON object per document to S3, applying changes
// monotonically by observation version.
//
// Layout, for an output with prefix P and key template T:
//
//	P + T(EscapeID(id))                the document JSON of a live document
//	P + "_tombstones/" + T(EscapeID(id))   a tombstone marker of a deleted one
//
// Both carry user metadata rev, seq, version ("generation.counter"), job and
// output. The version of what an output holds for a document is the higher of
// the object's and the marker's; a change is written only when it is newer.
// A tombstone writes the marker first, then deletes the object; a newer live
// change writes the object, then removes the marker. Markers stay after a
// deletion, so a change observed before it can never resurrect the document;
// they are small, one per deleted document. Because EscapeID never yields a
// '/', a marker key has one more '/' than any object key and the two can
// never collide, whatever the template.
//
// Writes are conditional (If-Match on the ETag read, If-None-Match: * when
// the key was absent), so concurrent writers of one document serialize: on
// 412 or 409 the sink reads again and decides again. One gap remains: S3's
// ETag is the MD5 of the body, so if between a writer's read and its write
// another writer replaced the object twice and the second body is byte for
// byte the first one, the stale write passes. That needs the same revision
// to win twice within one read-write window, with a stale change racing it.
package s3sink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
)

var _ deliver.Sink = (*Sink)(nil)

// S3API is the part of the S3 client the sink calls.
type S3API interface {
	HeadObject(ctx context.Context, in *s3.HeadObjectInput, optFns ...func(*s3.Options)) (*s3.HeadObjectOutput, error)
	PutObject(ctx context.Context, in *s3.PutObjectInput, optFns ...func(*s3.Options)) (*s3.PutObjectOutput, error)
	DeleteObject(ctx context.Context, in *s3.DeleteObjectInput, optFns ...func(*s3.Options)) (*s3.DeleteObjectOutput, error)
}

// Metadata keys written on objects and markers.
const (
	MetaRev     = "rev"
	MetaSeq     = "seq"
	MetaVersion = "version"
	MetaJob     = "job"
	MetaOutput  = "output"
	MetaDeleted = "deleted"
)

const (
	// TombstoneDir is the reserved area under the prefix holding markers.
	TombstoneDir = "_tombstones/"
	// DefaultKeyTemplate is used when the output sets none.
	DefaultKeyTemplate = "{doc_id}.json"
	// Parallelism is how many documents one Apply writes at once.
	Parallelism = 8
	// maxAttempts bounds read-decide-write rounds lost to concurrent writers
	// before the change fails transiently (and SQS retries it later).
	maxAttempts = 6
	// maxKeyBytes is S3's key length limit.
	maxKeyBytes = 1024
)

// Sink applies changes to one S3 output. It is safe for concurrent use, also
// by several processes writing the same bucket.
type Sink struct {
	client S3API
	place
}

// place is where an output's documents are: its bucket and the naming of
// its keys (the layout of the package comment).
type place struct {
	bucket string
	prefix string
	tmpl   string
}

// New returns a sink writing to out.Bucket through client. An empty
// KeyTemplate defaults to "{doc_id}.json". The prefix and template may not
// start with '/', contain ".." or "//", or have a "." segment, so no key can
// leave the prefix or name it twice.
func New(client S3API, out config.S3Output) (*Sink, error) {
	p, err := newPlace(out, client != nil)
	if err != nil {
		return nil, fmt.Errorf("new s3 sink: %w", err)
	}
	return &Sink{client: client, place: p}, nil
}

// newPlace resolves and checks the place of out, for a reader or writer
// that has a client or not, reporting every problem at once.
func newPlace(out config.S3Output, hasClient bool) (place, error) {
	s := place{bucket: out.Bucket, prefix: out.Prefix, tmpl: out.KeyTemplate}
	if s.tmpl == "" {
		s.tmpl = DefaultKeyTemplate
	}
	var errs []error
	if !hasClient {
		errs = append(errs, errors.New("client is nil"))
	}
	if s.bucket == "" {
		errs = append(errs, errors.New("bucket is empty"))
	}
	if !strings.Contains(s.tmpl, "{doc_id}") {
		errs = append(errs, fmt.Errorf("key template %q does not contain {doc_id}", s.tmpl))
	}
	whole := s.prefix + s.tmpl
	switch {
	case strings.HasPrefix(whole, "/"):
		errs = append(errs, fmt.Errorf("prefix and key template %q must not start with '/'", whole))
	case strings.Contains(whole, ".."), strings.Contains(whole, "//"):
		errs = append(errs, fmt.Errorf("prefix and key template %q must not contain \"..\" or \"//\"", whole))
	case slices.Contains(strings.Split(whole, "/"), "."):
		// S3 keeps it, but tools that map keys to paths resolve it.
		errs = append(errs, fmt.Errorf(`prefix and key template %q must not have a "." segment`, whole))
	case strings.ContainsFunc(whole, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		errs = append(errs, fmt.Errorf("prefix and key template %q must not contain control characters", whole))
	}
	return s, errors.Join(errs...)
}

// EscapeID returns the document id as a key component that holds no '/' and
// no '.', so it can neither add a level to the key nor form a "." or ".."
// segment: url.PathEscape (which escapes '/', '%', control characters,
// spaces and every non-ASCII byte) with each '.' written as %2E. Unescaping
// with url.PathUnescape returns the id, so distinct ids get distinct keys.
func EscapeID(id string) string {
	return strings.ReplaceAll(url.PathEscape(id), ".", "%2E")
}

// Key returns the object key of docID.
func (s place) Key(docID string) string {
	return s.prefix + strings.ReplaceAll(s.tmpl, "{doc_id}", EscapeID(docID))
}

// TombstoneKey returns the key of docID's tombstone marker.
func (s place) TombstoneKey(docID string) string {
	return s.prefix + TombstoneDir + strings.ReplaceAll(s.tmpl, "{doc_id}", EscapeID(docID))
}

// Apply writes each change whose version is newer than what the output
// holds for its document and returns one error per change: nil when written
// or not newer, a permanent *deliver.Error for an invalid change, a key over
// S3's limit or an S3 4xx (access denied, no such bucket), a transient one
// for connection errors, timeouts, 5xx and conflicts that outlast the
// retries. Documents are written in parallel, at most Parallelism at once;
// changes of one document one after another, oldest first.
//
// Apply is idempotent and safe for concurrent use.
func (s *Sink) Apply(ctx context.Context, changes []*change.Envelope) []error {
	return deliver.EachDocument(ctx, changes, Parallelism, s.check, s.apply)
}

func (s *Sink) check(c *change.Envelope) error {
	if err := deliver.CheckChange(c); err != nil {
		return err
	}
	switch {
	case len(s.TombstoneKey(c.DocID)) > maxKeyBytes:
		return deliver.PermanentError("key_too_long", fmt.Errorf("check change: key of a %d-byte document id exceeds %d bytes", len(c.DocID), maxKeyBytes))
	case !c.Tombstone() && !json.Valid(c.Doc):
		return deliver.PermanentError("invalid_body", fmt.Errorf("check change %s: body is not valid JSON", c.DocID))
	}
	return nil
}

// object is what one key held when read.
type object struct {
	exists  bool
	etag    string
	version change.Version
	rev     string
}

// state is what the output holds for one document.
type state struct {
	obj, mark object
}

// current returns the version the output holds: the higher of object and
// marker, zero when it holds neither.
func (st state) current() change.Version {
	if st.mark.version.Compare(st.obj.version) > 0 {
		return st.mark.version
	}
	return st.obj.version
}

// errConflict reports a conditional request that lost to another writer.
var errConflict = errors.New("conditional request conflict")

// apply runs read, decide, write rounds until one completes without losing a
// conditional request to another writer.
func (s *Sink) apply(ctx context.Context, c *change.Envelope) error {
	key, marker := s.Key(c.DocID), s.TombstoneKey(c.DocID)
	for range maxAttempts {
		st, err := s.read(ctx, key, marker)
		if err != nil {
			return classify(ctx, err)
		}
		if c.Version.Compare(st.current()) > 0 {
			if c.Tombstone() {
				st.mark, err = s.put(ctx, marker, st.mark, c, markerBody(c))
			} else {
				st.obj, err = s.put(ctx, key, st.obj, c, c.Doc)
			}
			if errors.Is(err, errConflict) {
				continue
			}
			if err != nil {
				return classify(ctx, err)
			}
			// Read the other key again, after our write: of two writers that
			// each wrote one of the keys, at least one then sees both and
			// settles them.
			if c.Tombstone() {
				st.obj, err = s.head(ctx, key)
			} else {
				st.mark, err = s.head(ctx, marker)
			}
			if err != nil {
				return classify(ctx, err)
			}
		}
		err = s.settle(ctx, key, marker, st)
		if errors.Is(err, errConflict) {
			continue
		}
		return classify(ctx, err)
	}
	return deliver.TransientError("conflict", fmt.Errorf("apply change %s: lost %d conditional writes in a row to concurrent writers", c.DocID, maxAttempts))
}

// read reads object and marker at once: which of the two answers first does
// not matter, the conditional write that follows refuses a key that changed
// since, and the other key is read again after it.
func (s *Sink) read(ctx context.Context, key, marker string) (state, error) {
	var st state
	var markErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		st.mark, markErr = s.head(ctx, marker)
	}()
	obj, objErr := s.head(ctx, key)
	<-done
	st.obj = obj
	if objErr != nil {
		return st, objErr
	}
	return st, markErr
}

// settle removes whichever of object and marker is older than the other: the
// object when a newer tombstone's delete did not happen yet, the marker once
// a newer live document is written.
func (s *Sink) settle(ctx context.Context, key, marker string, st state) error {
	if !st.obj.exists || !st.mark.exists {
		return nil
	}
	if st.mark.version.Compare(st.obj.version) > 0 {
		return s.delete(ctx, key, st.obj.etag)
	}
	return s.delete(ctx, marker, st.mark.etag)
}

// head reads key through the sink's client.
func (s *Sink) head(ctx context.Context, key string) (object, error) {
	return s.headObject(ctx, s.client, key)
}

// headObject reads the version stored on key. An object without a readable
// version (not written by this sink) counts as version zero, older than any
// change.
func (s place) headObject(ctx context.Context, client s3.HeadObjectAPIClient, key string) (object, error) {
	out, err := client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)})
	if err != nil {
		var nf *types.NotFound
		if errors.As(err, &nf) || httpStatus(err) == 404 {
			return object{}, nil
		}
		return object{}, fmt.Errorf("head object %s: %w", key, err)
	}
	o := object{exists: true, etag: aws.ToString(out.ETag), rev: out.Metadata[MetaRev]}
	o.version, _ = parseVersion(out.Metadata[MetaVersion])
	return o, nil
}

// put writes body to key on condition that key still holds prev.
func (s *Sink) put(ctx context.Context, key string, prev object, c *change.Envelope, body []byte) (object, error) {
	in := &s3.PutObjectInput{
		Bucket:      aws.String(s.bucket),
		Key:         aws.String(key),
		Body:        bytes.NewReader(body),
		ContentType: aws.String("application/json"),
		Metadata:    metadata(c),
	}
	if prev.exists {
		in.IfMatch = aws.String(prev.etag)
	} else {
		in.IfNoneMatch = aws.String("*")
	}
	out, err := s.client.PutObject(ctx, in)
	if err != nil {
		// If-Match on a key another writer deleted meanwhile: 404 NoSuchKey.
		if isConflict(err) || (prev.exists && errorCode(err) == "NoSuchKey") {
			return object{}, errConflict
		}
		return object{}, fmt.Errorf("put object %s: %w", key, err)
	}
	return object{exists: true, etag: aws.ToString(out.ETag), version: c.Version}, nil
}

// delete removes key on condition that it still has etag.
func (s *Sink) delete(ctx context.Context, key, etag string) error {
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key), IfMatch: aws.String(etag)})
	if err != nil {
		if isConflict(err) || errorCode(err) == "NoSuchKey" {
			// Changed or removed by another writer: read again.
			return errConflict
		}
		return fmt.Errorf("delete object %s: %w", key, err)
	}
	return nil
}

// markerBody is the content of a tombstone marker. It names the version, so
// every marker has its own ETag.
func markerBody(c *change.Envelope) []byte {
	b, err := json.Marshal(struct {
		DocID      string          `json:"doc_id"`
		Rev        string          `json:"rev"`
		Seq        json.RawMessage `json:"seq,omitempty"`
		Generation int64           `json:"generation"`
		Counter    int64           `json:"counter"`
		Deleted    bool            `json:"deleted"`
		Removed    bool            `json:"removed,omitempty"`
	}{c.DocID, c.Rev, validOrNil(c.Seq), c.Generation, c.Counter, c.Deleted, c.Removed})
	if err != nil {
		// Only strings, numbers and valid JSON go in; this cannot happen.
		return []byte(fmt.Sprintf(`{"generation":%d,"counter":%d}`, c.Generation, c.Counter))
	}
	return b
}

func validOrNil(raw json.RawMessage) json.RawMessage {
	if json.Valid(raw) {
		return raw
	}
	return nil
}

func metadata(c *change.Envelope) map[string]string {
	m := map[string]string{
		MetaRev:     metaValue(c.Rev),
		MetaSeq:     metaValue(c.SeqText()),
		MetaVersion: c.Version.String(),
		MetaJob:     metaValue(c.Job),
		MetaOutput:  metaValue(c.Output),
	}
	if c.Tombstone() {
		m[MetaDeleted] = "true"
	}
	return m
}

// metaValue keeps a metadata value printable ASCII, as S3 requires for
// headers: other characters are written as JSON-style \u escapes (UTF-16,
// so a seq that is JSON stays valid JSON).
func metaValue(s string) string {
	if !strings.ContainsFunc(s, unprintable) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case !unprintable(r):
			b.WriteRune(r)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	return b.String()
}

func unprintable(r rune) bool { return r < 0x20 || r >= 0x7f }

// parseVersion parses "generation.counter".
func parseVersion(s string) (change.Version, bool) {
	g, c, ok := strings.Cut(s, ".")
	if !ok {
		return change.Version{}, false
	}
	gen, err1 := strconv.ParseInt(g, 10, 64)
	ctr, err2 := strconv.ParseInt(c, 10, 64)
	if err1 != nil || err2 != nil {
		return change.Version{}, false
	}
	return change.Version{Generation: gen, Counter: ctr}, true
}

func isConflict(err error) bool {
	switch errorCode(err) {
	case "PreconditionFailed", "ConditionalRequestConflict":
		return true
	}
	switch httpStatus(err) {
	case 409, 412:
		return true
	}
	return false
}

func errorCode(err error) string {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode()
	}
	return ""
}

func httpStatus(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// classify turns an S3 error into a *deliver.Error: by HTTP status when S3
// answered (4xx permanent, 5xx transient, as deliver.HTTPStatusClass),
// transient for timeouts and connection errors.
func classify(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return deliver.TransientError("timeout", err)
	}
	if status := httpStatus(err); status != 0 {
		class := deliver.HTTPStatusClass(status)
		if class == "" {
			class = deliver.Transient
		}
		return &deliver.Error{Class: class, Reason: "s3_status", HTTPStatus: status, Err: err}
	}
	return deliver.TransientError("connection", err)
}
