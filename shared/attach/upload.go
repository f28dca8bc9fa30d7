package attach

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/changes-worker/changes-worker/shared/feed"
)

// S3 is what the stage calls on S3.
type S3 interface {
	HeadObject(ctx context.Context, in *s3.HeadObjectInput, opts ...func(*s3.Options)) (*s3.HeadObjectOutput, error)
	PutObject(ctx context.Context, in *s3.PutObjectInput, opts ...func(*s3.Options)) (*s3.PutObjectOutput, error)
	CreateMultipartUpload(ctx context.Context, in *s3.CreateMultipartUploadInput, opts ...func(*s3.Options)) (*s3.CreateMultipartUploadOutput, error)
	UploadPart(ctx context.Context, in *s3.UploadPartInput, opts ...func(*s3.Options)) (*s3.UploadPartOutput, error)
	CompleteMultipartUpload(ctx context.Context, in *s3.CompleteMultipartUploadInput, opts ...func(*s3.Options)) (*s3.CompleteMultipartUploadOutput, error)
	AbortMultipartUpload(ctx context.Context, in *s3.AbortMultipartUploadInput, opts ...func(*s3.Options)) (*s3.AbortMultipartUploadOutput, error)
}

// exists reports whether the object is in the bucket (HEAD). An answer to
// a HEAD has no error code, so a 400 about the object is not an error here:
// the put that follows is refused with a code that says why (s3Failure).
func exists(ctx context.Context, c S3, bucket, key string) (bool, error) {
	_, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bucket, Key: &key})
	if err == nil {
		return true, nil
	}
	var nf *types.NotFound
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &nf) || (errors.As(err, &re) && (re.HTTPStatusCode() == 404 || re.HTTPStatusCode() == 400)) {
		return false, nil
	}
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorCode() == "NoSuchKey" {
		return false, nil
	}
	return false, fmt.Errorf("head s3://%s/%s: %w", bucket, key, err)
}

// upload streams r to bucket/key: one PutObject when r ends within the
// first part, a multipart upload of partSize parts otherwise, so that at
// most one part is held in memory; never an empty part. check runs once r
// has ended and before the object becomes visible; an error from it, or
// from reading r (wrapped in a *readError unless it wraps ErrContent),
// leaves no object (the multipart upload is aborted). r ends only with
// io.EOF: any other error, io.ErrUnexpectedEOF included, is a failure.
// touch, when set, is called as S3 takes the parts' bytes. It returns the
// bytes read.
func upload(ctx context.Context, c S3, bucket, key, contentType string, r io.Reader, partSize int64, touch func(), check func() error) (int64, error) {
	buf := make([]byte, partSize)
	n, end, err := fill(r, buf)
	if err != nil {
		return int64(n), readFailed(err)
	}
	if end { // the whole content fits in one part
		if cerr := check(); cerr != nil {
			return int64(n), cerr
		}
		_, err := c.PutObject(ctx, &s3.PutObjectInput{
			Bucket: &bucket, Key: &key, Body: body(buf[:n], touch),
			ContentLength: aws.Int64(int64(n)), ContentType: contentTypeOrNil(contentType),
		})
		if err != nil {
			return int64(n), fmt.Errorf("put s3://%s/%s: %w", bucket, key, err)
		}
		return int64(n), nil
	}

	mu, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &bucket, Key: &key, ContentType: contentTypeOrNil(contentType)})
	if err != nil {
		return 0, fmt.Errorf("create multipart upload s3://%s/%s: %w", bucket, key, err)
	}
	total := int64(0)
	abort := func(cause error) (int64, error) {
		// Abort even when the invocation's context is done: parts left
		// behind are billed until a lifecycle rule removes them.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, aerr := c.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: &bucket, Key: &key, UploadId: mu.UploadId}); aerr != nil {
			cause = errors.Join(cause, fmt.Errorf("abort multipart upload: %w", aerr))
		}
		return total, cause
	}
	var parts []types.CompletedPart
	for num := int32(1); n > 0; num++ {
		total += int64(n)
		out, err := c.UploadPart(ctx, &s3.UploadPartInput{
			Bucket: &bucket, Key: &key, UploadId: mu.UploadId, PartNumber: aws.Int32(num),
			Body: body(buf[:n], touch), ContentLength: aws.Int64(int64(n)),
		})
		if err != nil {
			return abort(fmt.Errorf("upload part %d of s3://%s/%s: %w", num, bucket, key, err))
		}
		parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(num)})
		if end {
			break
		}
		if n, end, err = fill(r, buf); err != nil {
			return abort(readFailed(err))
		}
	}
	if err := check(); err != nil {
		return abort(err)
	}
	_, err = c.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: &bucket, Key: &key, UploadId: mu.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
	})
	if err != nil {
		return abort(fmt.Errorf("complete multipart upload s3://%s/%s: %w", bucket, key, err))
	}
	return total, nil
}

// fill reads r into buf until buf is full or r ends (io.EOF, reported as
// end). Any other error is returned as it is: io.ErrUnexpectedEOF from an
// HTTP body is a transfer cut short, not an end.
func fill(r io.Reader, buf []byte) (n int, end bool, err error) {
	for empty := 0; n < len(buf); {
		m, err := r.Read(buf[n:])
		n += m
		if err == io.EOF {
			return n, true, nil
		}
		if err != nil {
			return n, false, err
		}
		if m > 0 {
			empty = 0
		} else if empty++; empty >= 100 {
			return n, false, io.ErrNoProgress
		}
	}
	return n, false, nil
}

// readError is a failure to read the attachment's content.
type readError struct{ err error }

func (e *readError) Error() string { return "read attachment: " + e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

// readFailed wraps a read failure; content that does not match is left as
// it is.
func readFailed(err error) error {
	if errors.Is(err, ErrContent) {
		return err
	}
	return &readError{err: err}
}

// body is a part's content for S3, calling touch as it is read (the SDK
// may read it more than once: to sign, to retry).
func body(b []byte, touch func()) io.ReadSeeker {
	if touch == nil {
		return bytes.NewReader(b)
	}
	return &touching{r: bytes.NewReader(b), touch: touch}
}

type touching struct {
	r     *bytes.Reader
	touch func()
}

func (t *touching) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 {
		t.touch()
	}
	return n, err
}

func (t *touching) Seek(offset int64, whence int) (int64, error) { return t.r.Seek(offset, whence) }

// s3Failure classifies a failed request about one object: one S3 answers
// with a code that refuses the object itself (retrying sends the same
// request) wraps ErrRefused; another 4xx that is not about the bucket, the
// credentials or the pace counts as a failed transfer of the attachment
// (*transferError), so that it is given up after Attempts; anything else
// (no answer, 5xx, throttling, access) is transient.
func s3Failure(what string, err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) && objectRefusals[ae.ErrorCode()] {
		return fmt.Errorf("%s: %w: %w", what, ErrRefused, err)
	}
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) && re.HTTPStatusCode() >= 400 && re.HTTPStatusCode() < 500 {
		switch status := re.HTTPStatusCode(); {
		case status == 403, status == 404, status == 408, status == 409, status == 429:
		case ae != nil && serviceCodes[ae.ErrorCode()]:
		default:
			return &transferError{what: what, err: err}
		}
	}
	return feed.MarkTransient(fmt.Errorf("%s: %w", what, err))
}

// objectRefusals are the S3 error codes that refuse an object for what it
// is (its key, its size, its headers).
var objectRefusals = map[string]bool{
	"KeyTooLongError": true, "InvalidArgument": true, "InvalidURI": true, "InvalidObjectName": true,
	"EntityTooLarge": true, "MetadataTooLarge": true,
}

// serviceCodes are the S3 4xx codes about the request's bucket,
// credentials, clock or pace rather than its object.
var serviceCodes = map[string]bool{
	"RequestTimeout": true, "RequestTimeTooSkewed": true, "IncompleteBody": true, "ExpiredToken": true, "InvalidToken": true,
	"TokenRefreshRequired": true, "AuthorizationHeaderMalformed": true, "InvalidAccessKeyId": true, "SignatureDoesNotMatch": true,
	"InvalidBucketName": true, "NoSuchBucket": true, "NoSuchUpload": true, "IllegalLocationConstraintException": true,
	"SlowDown": true, "OperationAborted": true,
}

func contentTypeOrNil(ct string) *string {
	if ct == "" {
		return nil
	}
	return &ct
}
