package verify

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/s3sink"
)

// S3API is the part of the S3 client the S3 reader calls.
type S3API interface {
	ListObjectsV2(ctx context.Context, in *s3.ListObjectsV2Input, optFns ...func(*s3.Options)) (*s3.ListObjectsV2Output, error)
	HeadObject(ctx context.Context, in *s3.HeadObjectInput, optFns ...func(*s3.Options)) (*s3.HeadObjectOutput, error)
}

// S3 reads an S3 output's state: the objects under the output's prefix and
// their rev metadata (one HEAD per object: listings carry no metadata).
// A document whose object is older than its tombstone marker (a deletion
// not settled yet) is not held. Objects under the prefix whose key the
// output's key template cannot have produced are ignored.
type S3 struct {
	Client S3API
	Out    config.S3Output
	// Parallelism bounds concurrent HEAD requests. Default 16.
	Parallelism int

	keys keyer
}

// keyer is the part of the sink that names keys.
type keyer interface {
	Key(docID string) string
	TombstoneKey(docID string) string
}

var _ Output = (*S3)(nil)

// NewS3 returns the reader of the output out.
func NewS3(client S3API, out config.S3Output) (*S3, error) {
	// The sink only names keys here; it writes nothing.
	sink, err := s3sink.New(noWrites{}, out)
	if err != nil {
		return nil, fmt.Errorf("verify s3 output: %w", err)
	}
	return &S3{Client: client, Out: out, keys: sink}, nil
}

// noWrites satisfies s3sink.S3API for a sink used only for its key names.
type noWrites struct{ s3sink.S3API }

// docID returns the document id whose object key is key, if any.
func (s *S3) docID(key string) (string, bool) {
	tmpl := s.Out.KeyTemplate
	if tmpl == "" {
		tmpl = s3sink.DefaultKeyTemplate
	}
	rest, ok := strings.CutPrefix(key, s.Out.Prefix)
	if !ok || strings.HasPrefix(rest, s3sink.TombstoneDir) {
		return "", false
	}
	before, after, _ := strings.Cut(tmpl, "{doc_id}")
	mid, ok := strings.CutPrefix(rest, before)
	if !ok {
		return "", false
	}
	if i := strings.Index(mid, after); after != "" && i >= 0 {
		mid = mid[:i]
	}
	id, err := url.PathUnescape(mid)
	if err != nil || id == "" || s.keys.Key(id) != key {
		return "", false
	}
	return id, true
}

// Scan lists the objects under the prefix and reads each one's metadata.
func (s *S3) Scan(ctx context.Context, fn func(Doc) error) error {
	var ids []string
	markers := map[string]bool{}
	p := s3.NewListObjectsV2Paginator(s.Client, &s3.ListObjectsV2Input{Bucket: &s.Out.Bucket, Prefix: aws.String(s.Out.Prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list s3://%s/%s: %w", s.Out.Bucket, s.Out.Prefix, err)
		}
		for _, o := range page.Contents {
			key := aws.ToString(o.Key)
			if strings.HasPrefix(key, s.Out.Prefix+s3sink.TombstoneDir) {
				markers[key] = true
				continue
			}
			if id, ok := s.docID(key); ok {
				ids = append(ids, id)
			}
		}
	}
	return s.read(ctx, ids, markers, fn)
}

// Lookup reads the given documents.
func (s *S3) Lookup(ctx context.Context, ids []string) (map[string]Doc, error) {
	out := map[string]Doc{}
	var mu sync.Mutex
	err := s.read(ctx, ids, nil, func(d Doc) error {
		mu.Lock()
		defer mu.Unlock()
		out[d.ID] = d
		return nil
	})
	return out, err
}

// read HEADs the objects of ids and calls fn, serialized, for each one that
// exists. markers, when not nil, lists the marker keys that exist; when nil
// every marker is read.
func (s *S3) read(ctx context.Context, ids []string, markers map[string]bool, fn func(Doc) error) error {
	n := s.Parallelism
	if n <= 0 {
		n = 16
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
			cancel()
		}
	}
	for _, id := range ids {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			obj, found, err := s.head(ctx, s.keys.Key(id))
			if err != nil || !found {
				if err != nil {
					fail(err)
				}
				return
			}
			d := Doc{ID: id, Rev: obj.Metadata[s3sink.MetaRev], Held: true}
			if mk := s.keys.TombstoneKey(id); markers == nil || markers[mk] {
				mark, found, err := s.head(ctx, mk)
				if err != nil {
					fail(err)
					return
				}
				if found && version(mark).Compare(version(obj)) > 0 {
					d.Held = false
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if firstErr == nil {
				if err := fn(d); err != nil {
					firstErr = err
					cancel()
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

func (s *S3) head(ctx context.Context, key string) (*s3.HeadObjectOutput, bool, error) {
	out, err := s.Client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.Out.Bucket, Key: &key})
	if err != nil {
		var nf *types.NotFound
		var re *awshttp.ResponseError
		if errors.As(err, &nf) || (errors.As(err, &re) && re.HTTPStatusCode() == 404) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("head s3://%s/%s: %w", s.Out.Bucket, key, err)
	}
	return out, true, nil
}

// version reads the version metadata the sink writes ("generation.counter");
// zero when absent.
func version(o *s3.HeadObjectOutput) change.Version {
	var v change.Version
	_, _ = fmt.Sscanf(o.Metadata[s3sink.MetaVersion], "%d.%d", &v.Generation, &v.Counter)
	return v
}
