package s3sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sync/errgroup"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
)

// StateAPI is the part of the S3 client the state reader calls.
type StateAPI interface {
	s3.HeadObjectAPIClient
	s3.ListObjectsV2APIClient
	GetObject(ctx context.Context, in *s3.GetObjectInput, optFns ...func(*s3.Options)) (*s3.GetObjectOutput, error)
}

// DefaultStateParallelism bounds a state reader's concurrent HEAD requests
// when its Parallelism is not set.
const DefaultStateParallelism = 16

// State reads what one S3 output holds: the objects under the output's
// prefix and their metadata (one HEAD per object: listings carry none), the
// tombstone markers read only for documents that have an object. A document
// whose object is older than its marker (a deletion not settled yet) is not
// held. Objects under the prefix whose key the output's key template cannot
// have produced are ignored. Digest is the object's ETag without quotes (the
// MD5 of the body for a single-part upload, which is how the sink writes).
//
// State only reads, and is safe for concurrent use.
type State struct {
	client StateAPI
	place
	// Parallelism bounds concurrent HEAD requests; DefaultStateParallelism
	// when zero. Set it before the first call.
	Parallelism int
}

// NewState returns the state reader of out, whose keys are named as New
// names them.
func NewState(client StateAPI, out config.S3Output) (*State, error) {
	p, err := newPlace(out, client != nil)
	if err != nil {
		return nil, fmt.Errorf("new s3 state reader: %w", err)
	}
	return &State{client: client, place: p}, nil
}

// docID returns the document id whose object key is key, if any: the
// inverse of Key.
func (s place) docID(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, s.prefix)
	if !ok || strings.HasPrefix(rest, TombstoneDir) {
		return "", false
	}
	before, after, _ := strings.Cut(s.tmpl, "{doc_id}")
	mid, ok := strings.CutPrefix(rest, before)
	if !ok {
		return "", false
	}
	if i := strings.Index(mid, after); after != "" && i >= 0 {
		mid = mid[:i]
	}
	id, err := url.PathUnescape(mid)
	if err != nil || id == "" || s.Key(id) != key {
		return "", false
	}
	return id, true
}

// Scan calls fn, one call at a time, for every document that has an object
// under the prefix; a deleted document (only its marker left) is not
// listed. fn's error stops the scan and is returned.
func (s *State) Scan(ctx context.Context, fn func(deliver.Stored) error) error {
	var ids []string
	markers := map[string]bool{}
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Prefix: aws.String(s.prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list s3://%s/%s: %w", s.bucket, s.prefix, err)
		}
		for _, o := range page.Contents {
			key := aws.ToString(o.Key)
			if strings.HasPrefix(key, s.prefix+TombstoneDir) {
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

// Lookup reads the given documents as Scan would list them; a document Scan
// would not list is absent from the result.
func (s *State) Lookup(ctx context.Context, ids []string) (map[string]deliver.Stored, error) {
	out := map[string]deliver.Stored{}
	err := s.read(ctx, ids, nil, func(d deliver.Stored) error {
		out[d.ID] = d
		return nil
	})
	return out, err
}

// group returns an errgroup that runs at most Parallelism calls at once,
// and its context.
func (s *State) group(ctx context.Context) (*errgroup.Group, context.Context) {
	n := s.Parallelism
	if n <= 0 {
		n = DefaultStateParallelism
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(n)
	return g, gctx
}

// read HEADs the objects of ids, at most Parallelism at once, and calls fn,
// one call at a time, for each one that exists. markers, when not nil,
// lists the marker keys that exist; when nil every marker is read.
func (s *State) read(ctx context.Context, ids []string, markers map[string]bool, fn func(deliver.Stored) error) error {
	g, gctx := s.group(ctx)
	var mu sync.Mutex
	for _, id := range ids {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			d, found, err := s.stored(gctx, id, markers)
			if err != nil || !found {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if err := gctx.Err(); err != nil {
				return err // stopped: fn is not called again
			}
			return fn(d)
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err()
}

// stored reads what the output holds for id: false when it has no object.
func (s *State) stored(ctx context.Context, id string, markers map[string]bool) (deliver.Stored, bool, error) {
	obj, err := s.headObject(ctx, s.client, s.Key(id))
	if err != nil || !obj.exists {
		return deliver.Stored{}, false, err
	}
	d := deliver.Stored{ID: id, Version: obj.version, Rev: obj.rev, Held: true, Digest: strings.Trim(obj.etag, `"`)}
	if mk := s.TombstoneKey(id); markers == nil || markers[mk] {
		mark, err := s.headObject(ctx, s.client, mk)
		if err != nil {
			return deliver.Stored{}, false, err
		}
		if mark.exists && mark.version.Compare(obj.version) > 0 {
			d.Version, d.Held, d.Deleted = mark.version, false, true
		}
	}
	return d, true, nil
}

// Body returns the body of the document's object and true, or false when
// there is no object.
func (s *State) Body(ctx context.Context, docID string) (json.RawMessage, bool, error) {
	key := s.Key(docID)
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)})
	if err != nil {
		var nsk *types.NoSuchKey
		if errors.As(err, &nsk) || httpStatus(err) == 404 {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("get object %s: %w", key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		return nil, false, fmt.Errorf("read object %s: %w", key, err)
	}
	return b, true, nil
}
