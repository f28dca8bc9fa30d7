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

// exists reports whether the object is in the bucket (HEAD).
func exists(ctx context.Context, c S3, bucket, key string) (bool, error) {
	_, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bucket, Key: &key})
	if err == nil {
		return true, nil
	}
	var nf *types.NotFound
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &nf) || (errors.As(err, &re) && re.HTTPStatusCode() == 404) {
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
// most one part is held in memory. check runs once r is exhausted and
// before the object becomes visible; an error from it (or from r) leaves
// no object (the multipart upload is aborted). It returns the bytes read.
func upload(ctx context.Context, c S3, bucket, key, contentType string, r io.Reader, partSize int64, check func() error) (int64, error) {
	buf := make([]byte, partSize)
	n, err := io.ReadFull(r, buf)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return 0, fmt.Errorf("read attachment: %w", err)
	}
	if err != nil { // the whole content fits in one part
		if cerr := check(); cerr != nil {
			return int64(n), cerr
		}
		_, err := c.PutObject(ctx, &s3.PutObjectInput{
			Bucket: &bucket, Key: &key, Body: bytes.NewReader(buf[:n]),
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
	for num := int32(1); ; num++ {
		total += int64(n)
		out, err := c.UploadPart(ctx, &s3.UploadPartInput{
			Bucket: &bucket, Key: &key, UploadId: mu.UploadId, PartNumber: aws.Int32(num),
			Body: bytes.NewReader(buf[:n]), ContentLength: aws.Int64(int64(n)),
		})
		if err != nil {
			return abort(fmt.Errorf("upload part %d of s3://%s/%s: %w", num, bucket, key, err))
		}
		parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(num)})
		n, err = io.ReadFull(r, buf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			return abort(fmt.Errorf("read attachment: %w", err))
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

func contentTypeOrNil(ct string) *string {
	if ct == "" {
		return nil
	}
	return &ct
}
