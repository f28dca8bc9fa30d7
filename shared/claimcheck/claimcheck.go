// Package claimcheck owns the claim checks: the S3 objects that carry a
// document body too large for a queue message. It says where the poller puts
// them (one prefix per job and stack in the stack bucket), which references the writer
// may follow (only those), how large a body may be, and how long the objects
// are kept.
package claimcheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
)

// MaxSize is the largest body a claim check may declare: 20 MiB, the largest
// document Couchbase Server (behind Sync Gateway, App Services and Edge
// Server) stores, and more than CouchDB's default max_document_size
// (8,000,000 bytes). A reference declaring more is refused without reading.
const MaxSize = 20 << 20

// maxKey is S3's limit on the length of an object key, in bytes.
const maxKey = 1024

// Sentinel errors of Check and Fetch. All four are permanent: the same
// reference can never be read later.
var (
	// ErrRefused: the reference names another bucket, a key outside the
	// job's prefix, or a key that is not one this package makes.
	ErrRefused = errors.New("claim check refused")
	// ErrSize: the declared size is out of bounds, or the object's size is
	// not the declared size.
	ErrSize = errors.New("claim check size")
	// ErrMissing: S3 answered 404 (NoSuchKey, NoSuchBucket).
	ErrMissing = errors.New("claim check missing")
	// ErrDenied: S3 answered 403 AccessDenied. The writer may read its jobs'
	// claim checks but not list the bucket, and S3 then answers a GetObject
	// of a missing key with 403 rather than 404: the object expired or was
	// never written. It is also what an object the role may not read
	// (a bucket or key policy that refuses it) answers.
	ErrDenied = errors.New("claim check missing or unreadable")
)

// Prefix is the key prefix of one job's claim checks in the stack bucket:
// claim-check/<job>/<stack>/, stack being the stack's prefix, so that two
// deployments sharing a bucket, with jobs of the same id, never write each
// other's keys. It lies under UnscopedPrefix(jobID), which is all a writer
// of a release before 1.0.0 follows (and its role may read): during a
// rolling deploy such a writer still delivers what this poller queues.
// Stack prefixes and job ids contain no '/', and the keys under Prefix have
// one segment more than the unscoped ones, so no two meet.
func Prefix(stack, jobID string) string {
	return config.ClaimCheckPrefix + jobID + "/" + stack + "/"
}

// UnscopedPrefix is claim-check/<job>/, where the releases before 1.0.0
// kept claim checks, without the stack prefix. Messages they queued may
// still wait in a queue or a DLQ: Check accepts such a key, of the one
// shape they gave it (<generation>/<counter>.json), so that they are
// delivered; nothing is written there but under Prefix.
func UnscopedPrefix(jobID string) string { return config.ClaimCheckPrefix + jobID + "/" }

// unscoped reports whether key is under jobID's unscoped prefix and of the
// shape <generation>/<counter>.json.
func unscoped(key, jobID string) bool {
	rest, ok := strings.CutPrefix(key, UnscopedPrefix(jobID))
	segs := strings.Split(rest, "/")
	return ok && len(segs) == 2 && versionShape(segs)
}

// Key is the key of the claim check of the change with version v of a job:
// one object per change, which every output's envelope points at.
func Key(stack, jobID string, v change.Version) string {
	return fmt.Sprintf("%s%d/%d.json", Prefix(stack, jobID), v.Generation, v.Counter)
}

// Rebase returns key, a claim check's key as Key makes it for any stack and
// job (or under the job's unscoped prefix), as Key makes it for stack and
// jobID, and false when key is no such key.
func Rebase(key, stack, jobID string) (string, bool) {
	rest, ok := strings.CutPrefix(key, config.ClaimCheckPrefix)
	if !ok {
		return "", false
	}
	segs := strings.Split(rest, "/")
	if len(segs) < 3 || len(segs) > 4 || !versionShape(segs[len(segs)-2:]) {
		return "", false
	}
	return Prefix(stack, jobID) + strings.Join(segs[len(segs)-2:], "/"), true
}

// versionShape reports whether segs are "<generation>", "<counter>.json",
// as Key writes them.
func versionShape(segs []string) bool {
	digits := func(s string) bool {
		return s != "" && strings.Trim(s, "0123456789") == ""
	}
	counter, ok := strings.CutSuffix(segs[1], ".json")
	return ok && digits(segs[0]) && digits(counter)
}

// Check reports, wrapping ErrRefused or ErrSize, why ref may not be read for
// jobID of the stack whose prefix is stack, from the stack bucket; nil when
// it may. It makes no request.
func Check(ref *change.ObjectRef, bucket, stack, jobID string) error {
	if ref.Bucket != bucket {
		return fmt.Errorf("%w: bucket %s is not the stack bucket %s", ErrRefused, quote(ref.Bucket), quote(bucket))
	}
	if len(ref.Key) > maxKey {
		return fmt.Errorf("%w: key %s is longer than %d bytes", ErrRefused, quote(ref.Key), maxKey)
	}
	prefix := Prefix(stack, jobID)
	if rest, ok := strings.CutPrefix(ref.Key, prefix); ok {
		if err := checkKey(rest); err != nil {
			return fmt.Errorf("%w: key %s: %w", ErrRefused, quote(ref.Key), err)
		}
	} else if !unscoped(ref.Key, jobID) {
		return fmt.Errorf("%w: key %s is not under %q, the claim checks of job %s", ErrRefused, quote(ref.Key), prefix, jobID)
	}
	switch {
	case ref.Size <= 0:
		return fmt.Errorf("%w: declared size %d bytes: a document body is never empty", ErrSize, ref.Size)
	case ref.Size > MaxSize:
		return fmt.Errorf("%w: declared size %d bytes exceeds %d, the largest document a source stores", ErrSize, ref.Size, MaxSize)
	}
	return nil
}

// checkKey refuses what follows the job prefix unless it is one or more
// non-empty segments, none "." or "..", of valid UTF-8 without control
// characters.
func checkKey(rest string) error {
	if !utf8.ValidString(rest) {
		return errors.New("not valid UTF-8")
	}
	for _, r := range rest {
		if r < 0x20 || r == 0x7f {
			return errors.New("has a control character")
		}
	}
	for _, seg := range strings.Split(rest, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("has an empty, '.' or '..' segment after the job prefix")
		}
	}
	return nil
}

// GetObjecter is the S3 call Fetch makes.
type GetObjecter interface {
	GetObject(ctx context.Context, in *s3.GetObjectInput, optFns ...func(*s3.Options)) (*s3.GetObjectOutput, error)
}

// Fetch returns the body ref points at, for a message of job jobID, with
// bucket the stack bucket and stack its prefix. It asks S3 only for a reference Check accepts, and
// reads at most the declared size: an object of any other size is refused
// with ErrSize. Errors wrap ErrRefused, ErrSize, ErrMissing or ErrDenied when
// retrying cannot help; any other error (throttling, 5xx, a connection
// broken off) may pass. Safe for concurrent use if client is.
func Fetch(ctx context.Context, client GetObjecter, ref *change.ObjectRef, bucket, stack, jobID string) ([]byte, error) {
	if err := Check(ref, bucket, stack, jobID); err != nil {
		return nil, err
	}
	out, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(ref.Bucket), Key: aws.String(ref.Key)})
	if err != nil {
		return nil, fmt.Errorf("get claim check %s: %w", ref.Key, classify(err))
	}
	defer out.Body.Close()
	if n := aws.ToInt64(out.ContentLength); out.ContentLength != nil && n != ref.Size {
		return nil, fmt.Errorf("%w: object %s has %d bytes, the message declares %d bytes", ErrSize, ref.Key, n, ref.Size)
	}
	// One byte past the declared size tells a larger object from an equal one
	// when the length was not announced.
	var buf bytes.Buffer
	buf.Grow(int(ref.Size) + 1)
	n, err := io.Copy(&buf, io.LimitReader(out.Body, ref.Size+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("read claim check %s: %w", ref.Key, err)
	case n > ref.Size:
		return nil, fmt.Errorf("%w: object %s is larger than the %d bytes the message declares", ErrSize, ref.Key, ref.Size)
	case n < ref.Size:
		return nil, fmt.Errorf("%w: object %s has %d bytes, the message declares %d bytes", ErrSize, ref.Key, n, ref.Size)
	}
	return buf.Bytes(), nil
}

// classify marks the S3 answers that no retry changes.
func classify(err error) error {
	var apiErr smithy.APIError
	code := ""
	if errors.As(err, &apiErr) {
		code = apiErr.ErrorCode()
	}
	var nsk *s3types.NoSuchKey
	var nsb *s3types.NoSuchBucket
	var resp *awshttp.ResponseError
	switch {
	case errors.As(err, &nsk), errors.As(err, &nsb), code == "NoSuchKey", code == "NoSuchBucket", code == "NotFound":
		return fmt.Errorf("%w: %w", ErrMissing, err)
	case errors.As(err, &resp) && resp.HTTPStatusCode() == http.StatusNotFound:
		return fmt.Errorf("%w: %w", ErrMissing, err)
	case code == "AccessDenied":
		return fmt.Errorf("%w (S3 answers 403 for a missing key to a role that may not list the bucket): %w", ErrDenied, err)
	}
	return err
}

// quote shows a bucket or key from a message in an error: quoted, and cut
// short, since the message may come from anywhere.
func quote(s string) string {
	const max = 200
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return fmt.Sprintf("%q…", s[:cut])
	}
	return fmt.Sprintf("%q", s)
}
