// Package testbucket gives a test a bucket of its own on the local S3
// emulator.
package testbucket

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// New creates a bucket named after the test on the emulator's S3, emptied and
// deleted when the test ends, and returns a client for it and its name.
func New(t testing.TB) (*s3.Client, string) {
	t.Helper()
	client := s3.NewFromConfig(testenv.AWS(t), awsconf.S3Options)
	return client, Create(t, client)
}

// Create creates a bucket named after the test with client, emptied and
// deleted when the test ends, and returns its name.
func Create(t testing.TB, client *s3.Client) string {
	t.Helper()
	bucket := testenv.Name(t)
	if _, err := client.CreateBucket(t.Context(), &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatalf("create bucket %s: %v", bucket, err)
	}
	t.Cleanup(func() {
		// t.Context is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, k := range Keys(ctx, t, client, bucket) {
			_, _ = client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(bucket), Key: aws.String(k)})
		}
		if _, err := client.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bucket)}); err != nil {
			t.Logf("delete bucket %s: %v", bucket, err)
		}
	})
	return bucket
}

// Keys returns the keys bucket holds, sorted. A failed listing fails the
// test (without stopping it) and returns the keys listed until then.
func Keys(ctx context.Context, t testing.TB, client *s3.Client, bucket string) []string {
	t.Helper()
	var keys []string
	p := s3.NewListObjectsV2Paginator(client, &s3.ListObjectsV2Input{Bucket: aws.String(bucket)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Errorf("list %s: %v", bucket, err)
			return keys
		}
		for _, o := range page.Contents {
			keys = append(keys, aws.ToString(o.Key))
		}
	}
	slices.Sort(keys)
	return keys
}
