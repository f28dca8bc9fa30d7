package s3sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/delivertest"
	"github.com/changes-worker/changes-worker/shared/testenv/testbucket"
)

var (
	live    = delivertest.Live
	deleted = delivertest.Deleted
	v       = delivertest.V
)

const testPrefix = "out/docs/"

func newSink(t *testing.T) (*Sink, *s3.Client) {
	t.Helper()
	client, bucket := testbucket.New(t)
	s, err := New(client, config.S3Output{Bucket: bucket, Prefix: testPrefix})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s, client
}

// stored is what one key holds.
type stored struct {
	Body        string
	ContentType string
	Meta        map[string]string
}

func get(t *testing.T, client *s3.Client, bucket, key string) (stored, bool) {
	t.Helper()
	out, err := client.GetObject(t.Context(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	var nsk *types.NoSuchKey
	if errors.As(err, &nsk) {
		return stored{}, false
	}
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return stored{Body: string(b), ContentType: aws.ToString(out.ContentType), Meta: out.Metadata}, true
}

func TestConformance(t *testing.T) {
	t.Parallel()
	delivertest.Run(t, delivertest.Harness{
		New: func(t *testing.T) (deliver.Sink, delivertest.StateFunc) {
			s, client := newSink(t)
			return s, func(t *testing.T, docID string) (string, bool) {
				o, ok := get(t, client, s.bucket, s.Key(docID))
				return o.Meta[MetaRev], ok
			}
		},
	})
}

// TestEmulatorEnforcesConditionalWrites records what the sink relies on: the
// AWS emulator, like S3, refuses a PutObject whose If-None-Match or If-Match
// does not hold.
func TestEmulatorEnforcesConditionalWrites(t *testing.T) {
	t.Parallel()
	client, bucket := testbucket.New(t)
	put := func(in *s3.PutObjectInput) (string, error) {
		in.Bucket, in.Key, in.Body = aws.String(bucket), aws.String("k"), strings.NewReader(fmt.Sprint(rand.Int()))
		out, err := client.PutObject(t.Context(), in)
		if err != nil {
			return "", err
		}
		return aws.ToString(out.ETag), nil
	}
	etag, err := put(&s3.PutObjectInput{IfNoneMatch: aws.String("*")})
	if err != nil {
		t.Fatalf("If-None-Match on an absent key: %v", err)
	}
	if _, err := put(&s3.PutObjectInput{IfNoneMatch: aws.String("*")}); !isConflict(err) {
		t.Errorf("If-None-Match on an existing key: got %v, want 412 PreconditionFailed", err)
	}
	if _, err := put(&s3.PutObjectInput{IfMatch: aws.String(`"0123456789abcdef0123456789abcdef"`)}); !isConflict(err) {
		t.Errorf("If-Match with a stale ETag: got %v, want 412 PreconditionFailed", err)
	}
	if _, err := put(&s3.PutObjectInput{IfMatch: aws.String(etag)}); err != nil {
		t.Errorf("If-Match with the current ETag: %v", err)
	}
	_, err = client.DeleteObject(t.Context(), &s3.DeleteObjectInput{Bucket: aws.String(bucket), Key: aws.String("k"), IfMatch: aws.String(etag)})
	if !isConflict(err) {
		t.Errorf("DeleteObject If-Match with a stale ETag: got %v, want 412 PreconditionFailed", err)
	}
}

func TestApply(t *testing.T) {
	t.Parallel()
	type want struct {
		rev    string // "" when the object must be absent
		marker string // version of the tombstone marker, "" when absent
	}
	tests := []struct {
		name    string
		batches [][]*change.Envelope
		want    want
	}{
		{name: "apply", batches: [][]*change.Envelope{{live("a", "1-x", v(1, 1))}}, want: want{rev: "1-x"}},
		{name: "duplicate", batches: [][]*change.Envelope{{live("a", "1-x", v(1, 1))}, {live("a", "1-x", v(1, 1))}}, want: want{rev: "1-x"}},
		{name: "duplicate within one batch", batches: [][]*change.Envelope{{live("a", "1-x", v(1, 1)), live("a", "1-x", v(1, 1))}}, want: want{rev: "1-x"}},
		{name: "older after newer is a no-op", batches: [][]*change.Envelope{{live("a", "2-x", v(1, 8))}, {live("a", "1-x", v(1, 3))}}, want: want{rev: "2-x"}},
		{name: "newer and older in one batch", batches: [][]*change.Envelope{{live("a", "2-x", v(1, 8)), live("a", "1-x", v(1, 3))}}, want: want{rev: "2-x"}},
		{
			name: "tombstone then stale update stays deleted",
			batches: [][]*change.Envelope{
				{live("a", "1-x", v(1, 1))}, {deleted("a", "2-x", v(1, 2))}, {live("a", "1-x", v(1, 1))},
			},
			want: want{marker: "1.2"},
		},
		{
			name: "a newer live change removes the marker",
			batches: [][]*change.Envelope{
				{deleted("a", "2-x", v(1, 2))}, {live("a", "3-x", v(1, 3))},
			},
			want: want{rev: "3-x"},
		},
		{
			name:    "conflict: a lower revision observed later wins",
			batches: [][]*change.Envelope{{live("a", "3-b", v(5, 9))}, {live("a", "2-a", v(5, 10))}},
			want:    want{rev: "2-a"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, client := newSink(t)
			delivertest.ApplyAll(t, s, tt.batches...)
			obj, ok := get(t, client, s.bucket, s.Key("a"))
			checkHeld(t, "object rev", obj.Meta[MetaRev], ok, tt.want.rev)
			mark, ok := get(t, client, s.bucket, s.TombstoneKey("a"))
			checkHeld(t, "tombstone marker version", mark.Meta[MetaVersion], ok, tt.want.marker)
		})
	}
}

// checkHeld fails the test unless an object the bucket holds (present) with
// metadata value got is as wanted: absent for want "", else present with
// value want.
func checkHeld(t *testing.T, what, got string, present bool, want string) {
	t.Helper()
	switch {
	case want == "" && present:
		t.Errorf("%s %q present, want none", what, got)
	case want != "" && (!present || got != want):
		t.Errorf("%s %q (present %v), want %q", what, got, present, want)
	}
}

func TestObjectContent(t *testing.T) {
	t.Parallel()
	s, client := newSink(t)
	c := live("doc-1", "2-abc", v(3, 17))
	c.Seq = json.RawMessage(`[ 12, "g1AAAA" ]`)
	tomb := delivertest.Removed("doc-2", "5-def", v(3, 18))
	for i, err := range s.Apply(t.Context(), []*change.Envelope{c, tomb}) {
		if err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
	}

	obj, ok := get(t, client, s.bucket, testPrefix+"doc-1.json")
	if !ok {
		t.Fatalf("no object at %sdoc-1.json; bucket holds %v", testPrefix, testbucket.Keys(t.Context(), t, client, s.bucket))
	}
	want := stored{
		Body:        string(c.Doc),
		ContentType: "application/json",
		Meta: map[string]string{
			MetaRev: "2-abc", MetaSeq: `[12,"g1AAAA"]`, MetaVersion: "3.17",
			MetaJob: delivertest.Job, MetaOutput: delivertest.Output,
		},
	}
	if diff := cmp.Diff(want, obj); diff != "" {
		t.Errorf("object (-want +got):\n%s", diff)
	}

	mark, ok := get(t, client, s.bucket, testPrefix+"_tombstones/doc-2.json")
	if !ok {
		t.Fatalf("no tombstone marker; bucket holds %v", testbucket.Keys(t.Context(), t, client, s.bucket))
	}
	wantMeta := map[string]string{
		MetaRev: "5-def", MetaSeq: `"3:18"`, MetaVersion: "3.18",
		MetaJob: delivertest.Job, MetaOutput: delivertest.Output, MetaDeleted: "true",
	}
	if diff := cmp.Diff(wantMeta, mark.Meta); diff != "" {
		t.Errorf("marker metadata (-want +got):\n%s", diff)
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(mark.Body), &body); err != nil || body["doc_id"] != "doc-2" || body["counter"] != 18.0 || body["removed"] != true {
		t.Errorf("marker body %s (%v), want doc_id, version and removed", mark.Body, err)
	}
}

func TestEscapeID(t *testing.T) {
	t.Parallel()
	tests := []struct{ id, want string }{
		{"plain", "plain"},
		{"a/b", "a%2Fb"},
		{"../../x", "%2E%2E%2F%2E%2E%2Fx"},
		{"..", "%2E%2E"},
		{".", "%2E"},
		{"a.b", "a%2Eb"},
		{"100%", "100%25"},
		{"a%2Fb", "a%252Fb"},
		{"é✓", "%C3%A9%E2%9C%93"},
		{"tab\tnl\n\x00", "tab%09nl%0A%00"},
		{`back\slash`, "back%5Cslash"},
		{"a b?c#d", "a%20b%3Fc%23d"},
		{"_tombstones", "_tombstones"},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			t.Parallel()
			got := EscapeID(tt.id)
			if got != tt.want {
				t.Errorf("EscapeID(%q) = %q, want %q", tt.id, got, tt.want)
			}
			if strings.ContainsAny(got, "/.") {
				t.Errorf("EscapeID(%q) = %q holds '/' or '.'", tt.id, got)
			}
			if back, err := url.PathUnescape(got); err != nil || back != tt.id {
				t.Errorf("PathUnescape(%q) = %q, %v; want %q", got, back, err, tt.id)
			}
		})
	}
}

// TestKeysStayInsidePrefix writes hostile ids to a real bucket and checks
// every key it holds afterwards.
func TestKeysStayInsidePrefix(t *testing.T) {
	t.Parallel()
	s, client := newSink(t)
	ids := []string{"../../x", "..", ".", "a/b", "a%2Fb", "a/../../b", "/abs", "é/✓", "_tombstones/x", "x.json", "x", "%2E%2E"}
	var batch []*change.Envelope
	for i, id := range ids {
		batch = append(batch, live(id, "1-a", v(1, int64(i+1))))
	}
	batch = append(batch, deleted("../gone", "2-a", v(2, 1)))
	for i, err := range s.Apply(t.Context(), batch) {
		if err != nil {
			t.Fatalf("change %d (%q): %v", i, batch[i].DocID, err)
		}
	}

	keys := testbucket.Keys(t.Context(), t, client, s.bucket)
	if len(keys) != len(batch) {
		t.Errorf("bucket holds %d keys, want %d distinct ones: %q", len(keys), len(batch), keys)
	}
	for _, k := range keys {
		rest, ok := strings.CutPrefix(k, testPrefix)
		if !ok {
			t.Errorf("key %q is outside the prefix %q", k, testPrefix)
			continue
		}
		for seg := range strings.SplitSeq(rest, "/") {
			if seg == "" || seg == "." || seg == ".." {
				t.Errorf("key %q has a %q segment", k, seg)
			}
		}
		if strings.Contains(rest, "/") && !strings.HasPrefix(rest, TombstoneDir) {
			t.Errorf("object key %q adds levels below the prefix", k)
		}
	}
	for _, id := range ids {
		if o, ok := get(t, client, s.bucket, s.Key(id)); !ok || o.Meta[MetaRev] != "1-a" {
			t.Errorf("document %q not at its key %q", id, s.Key(id))
		}
	}
}

func TestKeyTooLong(t *testing.T) {
	t.Parallel()
	s, err := New(&fakeS3{}, config.S3Output{Bucket: "b"})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	err = s.Apply(t.Context(), []*change.Envelope{live(strings.Repeat("é", 200), "1-a", v(1, 1))})[0]
	if e := deliver.Classify(err); err == nil || e.Class != deliver.Permanent || e.Reason != "key_too_long" {
		t.Errorf("got %v, want a permanent key_too_long error", err)
	}
}

// TestSettlesInterruptedTombstone starts from the state a writer leaves when
// it stops between writing a marker and deleting the object: any later
// change of the document, even a stale one, finishes the deletion.
func TestSettlesInterruptedTombstone(t *testing.T) {
	t.Parallel()
	s, client := newSink(t)
	ctx := t.Context()
	if err := s.Apply(ctx, []*change.Envelope{live("a", "1-a", v(1, 1))})[0]; err != nil {
		t.Fatalf("apply live: %v", err)
	}
	tomb := deleted("a", "3-a", v(1, 3))
	if _, err := s.put(ctx, s.TombstoneKey("a"), object{}, tomb, markerBody(tomb)); err != nil {
		t.Fatalf("write marker: %v", err)
	}
	if _, ok := get(t, client, s.bucket, s.Key("a")); !ok {
		t.Fatal("setup: object should still exist")
	}

	if err := s.Apply(ctx, []*change.Envelope{live("a", "2-a", v(1, 2))})[0]; err != nil {
		t.Fatalf("apply stale change: %v", err)
	}
	if o, ok := get(t, client, s.bucket, s.Key("a")); ok {
		t.Errorf("object rev %q still present under a newer marker", o.Meta[MetaRev])
	}
	if m, ok := get(t, client, s.bucket, s.TombstoneKey("a")); !ok || m.Meta[MetaVersion] != "1.3" {
		t.Errorf("marker = %v (present %v), want version 1.3", m.Meta, ok)
	}
}

// TestConcurrentWriters runs writers applying the same changes in different
// orders; conditional writes make them agree on the newest version.
func TestConcurrentWriters(t *testing.T) {
	t.Parallel()
	s, client := newSink(t)

	var all []*change.Envelope
	last := map[string]*change.Envelope{}
	for counter := int64(1); counter <= 24; counter++ {
		id := fmt.Sprintf("doc-%d", counter%3)
		c := live(id, fmt.Sprintf("%d-%d", rand.IntN(9)+1, counter), v(1, counter))
		if counter%4 == 0 {
			c = deleted(id, c.Rev, c.Version)
		}
		all = append(all, c)
		last[id] = c
	}
	delivertest.ApplyConcurrently(t, s, all, 4, 6)

	for id, c := range last {
		obj, hasObj := get(t, client, s.bucket, s.Key(id))
		mark, hasMark := get(t, client, s.bucket, s.TombstoneKey(id))
		if c.Tombstone() {
			if hasObj || !hasMark || mark.Meta[MetaVersion] != c.Version.String() {
				t.Errorf("%s: object %v, marker %v; want only a marker at %s", id, obj.Meta, mark.Meta, c.Version)
			}
			continue
		}
		if hasMark || !hasObj || obj.Meta[MetaVersion] != c.Version.String() || obj.Meta[MetaRev] != c.Rev {
			t.Errorf("%s: object %v, marker %v; want only the object at %s rev %s", id, obj.Meta, mark.Meta, c.Version, c.Rev)
		}
	}
}

// barrierS3 holds every PutObject until parties writers have reached one, so
// each of them read and decided before any writes: the interleaving in which
// a live change and a tombstone both believe the document is absent.
type barrierS3 struct {
	S3API
	t       *testing.T
	parties int

	mu      sync.Mutex
	arrived int
	release chan struct{}
}

func (b *barrierS3) PutObject(ctx context.Context, in *s3.PutObjectInput, optFns ...func(*s3.Options)) (*s3.PutObjectOutput, error) {
	b.mu.Lock()
	b.arrived++
	if b.arrived == b.parties {
		close(b.release)
	}
	b.mu.Unlock()
	select {
	case <-b.release:
	case <-time.After(10 * time.Second):
		b.t.Error("writers never all reached PutObject")
	}
	return b.S3API.PutObject(ctx, in, optFns...)
}

// TestLiveAndTombstoneDecidedTogether checks that after a live change and a
// tombstone that both decided on a stale view finish, the output holds only
// the newer of the two: each writer reads the other key again after its
// write, so at least one of them sees both and removes the older.
func TestLiveAndTombstoneDecidedTogether(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		live, tomb change.Version
	}{
		{name: "tombstone newer", live: v(1, 6), tomb: v(1, 7)},
		{name: "live newer", live: v(1, 8), tomb: v(1, 7)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client, bucket := testbucket.New(t)
			s, err := New(&barrierS3{S3API: client, t: t, parties: 2, release: make(chan struct{})}, config.S3Output{Bucket: bucket, Prefix: testPrefix})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			var wg sync.WaitGroup
			for _, c := range []*change.Envelope{live("a", "1-a", tt.live), deleted("a", "2-a", tt.tomb)} {
				wg.Go(func() {
					if err := s.Apply(t.Context(), []*change.Envelope{c})[0]; err != nil {
						t.Errorf("apply %s: %v", c.Version, err)
					}
				})
			}
			wg.Wait()

			obj, hasObj := get(t, client, bucket, s.Key("a"))
			mark, hasMark := get(t, client, bucket, s.TombstoneKey("a"))
			if tt.tomb.Compare(tt.live) > 0 {
				if hasObj || !hasMark {
					t.Errorf("object %v (present %v), marker %v (present %v); want only the marker", obj.Meta, hasObj, mark.Meta, hasMark)
				}
				return
			}
			if !hasObj || hasMark {
				t.Errorf("object %v (present %v), marker %v (present %v); want only the object", obj.Meta, hasObj, mark.Meta, hasMark)
			}
		})
	}
}

// fakeS3 is an S3API whose calls tests script.
type fakeS3 struct {
	head func(*s3.HeadObjectInput) (*s3.HeadObjectOutput, error)
	put  func(*s3.PutObjectInput) (*s3.PutObjectOutput, error)
	del  func(*s3.DeleteObjectInput) (*s3.DeleteObjectOutput, error)
}

func (f *fakeS3) HeadObject(_ context.Context, in *s3.HeadObjectInput, _ ...func(*s3.Options)) (*s3.HeadObjectOutput, error) {
	if f.head == nil {
		return nil, &types.NotFound{}
	}
	return f.head(in)
}

func (f *fakeS3) PutObject(_ context.Context, in *s3.PutObjectInput, _ ...func(*s3.Options)) (*s3.PutObjectOutput, error) {
	return f.put(in)
}

func (f *fakeS3) DeleteObject(_ context.Context, in *s3.DeleteObjectInput, _ ...func(*s3.Options)) (*s3.DeleteObjectOutput, error) {
	return f.del(in)
}

// apiError builds the error the SDK returns for an S3 error response.
func apiError(status int, code string) error {
	return &smithy.OperationError{ServiceID: "S3", OperationName: "PutObject", Err: &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
			Err:      &smithy.GenericAPIError{Code: code, Message: code},
		},
	}}
}

func TestConflictRetries(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		conflicts  int // conditional puts refused before one succeeds
		code       string
		wantPuts   int
		wantReason string // "" for success
	}{
		{name: "one 412 then success", conflicts: 1, code: "PreconditionFailed", wantPuts: 2},
		{name: "one 409 then success", conflicts: 1, code: "ConditionalRequestConflict", wantPuts: 2},
		{name: "always refused", conflicts: 100, code: "PreconditionFailed", wantPuts: maxAttempts, wantReason: "conflict"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var puts atomic.Int32
			fake := &fakeS3{put: func(in *s3.PutObjectInput) (*s3.PutObjectOutput, error) {
				if aws.ToString(in.IfNoneMatch) != "*" {
					t.Errorf("put of an absent key without If-None-Match: *")
				}
				if int(puts.Add(1)) <= tt.conflicts {
					return nil, apiError(http.StatusPreconditionFailed, tt.code)
				}
				return &s3.PutObjectOutput{ETag: aws.String(`"e"`)}, nil
			}}
			s, err := New(fake, config.S3Output{Bucket: "b"})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			err = s.Apply(t.Context(), []*change.Envelope{live("a", "1-a", v(1, 1))})[0]
			if got := int(puts.Load()); got != tt.wantPuts {
				t.Errorf("%d puts, want %d", got, tt.wantPuts)
			}
			e := deliver.Classify(err)
			switch {
			case tt.wantReason == "" && err != nil:
				t.Errorf("got %v, want success", err)
			case tt.wantReason != "" && (err == nil || e.Class != deliver.Transient || e.Reason != tt.wantReason):
				t.Errorf("got %v, want transient %s", err, tt.wantReason)
			}
		})
	}
}

func TestIfMatchUsesTheETagRead(t *testing.T) {
	t.Parallel()
	var gotIfMatch string
	fake := &fakeS3{
		head: func(in *s3.HeadObjectInput) (*s3.HeadObjectOutput, error) {
			if strings.Contains(aws.ToString(in.Key), TombstoneDir) {
				return nil, &types.NotFound{}
			}
			return &s3.HeadObjectOutput{ETag: aws.String(`"current"`), Metadata: map[string]string{MetaVersion: "1.1"}}, nil
		},
		put: func(in *s3.PutObjectInput) (*s3.PutObjectOutput, error) {
			gotIfMatch = aws.ToString(in.IfMatch)
			if in.IfNoneMatch != nil {
				t.Errorf("If-None-Match set on an existing key")
			}
			return &s3.PutObjectOutput{ETag: aws.String(`"new"`)}, nil
		},
	}
	s, err := New(fake, config.S3Output{Bucket: "b"})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Apply(t.Context(), []*change.Envelope{live("a", "2-a", v(1, 2))})[0]; err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if gotIfMatch != `"current"` {
		t.Errorf("If-Match = %q, want the ETag read", gotIfMatch)
	}
}

func TestErrorClassification(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		err        error
		wantClass  deliver.Class
		wantStatus int
		wantReason string
	}{
		{name: "access denied", err: apiError(403, "AccessDenied"), wantClass: deliver.Permanent, wantStatus: 403, wantReason: "s3_status"},
		{name: "no such bucket", err: apiError(404, "NoSuchBucket"), wantClass: deliver.Permanent, wantStatus: 404, wantReason: "s3_status"},
		{name: "slow down", err: apiError(503, "SlowDown"), wantClass: deliver.Transient, wantStatus: 503, wantReason: "s3_status"},
		{name: "internal error", err: apiError(500, "InternalError"), wantClass: deliver.Transient, wantStatus: 500, wantReason: "s3_status"},
		{name: "connection", err: errors.New("dial tcp: connection refused"), wantClass: deliver.Transient, wantReason: "connection"},
		{name: "deadline", err: fmt.Errorf("put: %w", context.DeadlineExceeded), wantClass: deliver.Transient, wantReason: "timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fake := &fakeS3{put: func(*s3.PutObjectInput) (*s3.PutObjectOutput, error) { return nil, tt.err }}
			s, err := New(fake, config.S3Output{Bucket: "b"})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			e := deliver.Classify(s.Apply(t.Context(), []*change.Envelope{live("a", "1-a", v(1, 1))})[0])
			if e == nil {
				t.Fatal("got success, want an error")
			}
			got := deliver.Error{Class: e.Class, HTTPStatus: e.HTTPStatus, Reason: e.Reason}
			want := deliver.Error{Class: tt.wantClass, HTTPStatus: tt.wantStatus, Reason: tt.wantReason}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("error %v (-want +got):\n%s", e, diff)
			}
		})
	}
}

func TestInvalidChanges(t *testing.T) {
	t.Parallel()
	s, err := New(&fakeS3{}, config.S3Output{Bucket: "b"})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	broken := live("a", "1-a", v(1, 1))
	broken.Doc = json.RawMessage(`{"x":`)
	empty := live("b", "1-a", v(1, 1))
	empty.Doc = nil
	tests := []struct {
		name   string
		c      *change.Envelope
		reason string
	}{
		{name: "broken body", c: broken, reason: "invalid_body"},
		{name: "no body", c: empty, reason: "invalid_body"},
		{name: "no id", c: live("", "1-a", v(1, 1)), reason: "invalid_change"},
		{name: "no version", c: live("c", "1-a", v(0, 0)), reason: "invalid_change"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := deliver.Classify(s.Apply(t.Context(), []*change.Envelope{tt.c})[0])
			if e == nil || e.Class != deliver.Permanent || e.Reason != tt.reason {
				t.Errorf("got %v, want permanent %s", e, tt.reason)
			}
		})
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		out     config.S3Output
		wantKey string
		wantErr string
	}{
		{name: "default template", out: config.S3Output{Bucket: "b", Prefix: "p/"}, wantKey: "p/a%2Fb.json"},
		{name: "template", out: config.S3Output{Bucket: "b", Prefix: "p/", KeyTemplate: "docs/{doc_id}/latest.json"}, wantKey: "p/docs/a%2Fb/latest.json"},
		{name: "no bucket", out: config.S3Output{}, wantErr: "bucket"},
		{name: "no doc_id", out: config.S3Output{Bucket: "b", KeyTemplate: "x.json"}, wantErr: "{doc_id}"},
		{name: "dot-dot in prefix", out: config.S3Output{Bucket: "b", Prefix: "p/../"}, wantErr: ".."},
		{name: "dot-dot across prefix and template", out: config.S3Output{Bucket: "b", Prefix: "p.", KeyTemplate: ".{doc_id}"}, wantErr: ".."},
		{name: "leading slash", out: config.S3Output{Bucket: "b", Prefix: "/p/"}, wantErr: "'/'"},
		{name: "empty segment", out: config.S3Output{Bucket: "b", Prefix: "p//"}, wantErr: "//"},
		{name: "dot segment in prefix", out: config.S3Output{Bucket: "b", Prefix: "p/./"}, wantErr: `"." segment`},
		{name: "dot segment in template", out: config.S3Output{Bucket: "b", KeyTemplate: "x/./{doc_id}"}, wantErr: `"." segment`},
		{name: "template ending in a dot segment", out: config.S3Output{Bucket: "b", KeyTemplate: "{doc_id}/."}, wantErr: `"." segment`},
		{name: "prefix that is a dot", out: config.S3Output{Bucket: "b", Prefix: ".", KeyTemplate: "/{doc_id}"}, wantErr: `"." segment`},
		{name: "dots inside a segment", out: config.S3Output{Bucket: "b", Prefix: "p.x/", KeyTemplate: "{doc_id}.json"}, wantKey: "p.x/a%2Fb.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := New(&fakeS3{}, tt.out)
			if !delivertest.CheckNew(t, err, tt.wantErr) {
				return
			}
			if got := s.Key("a/b"); got != tt.wantKey {
				t.Errorf("Key = %q, want %q", got, tt.wantKey)
			}
			if got, want := s.TombstoneKey("a/b"), tt.out.Prefix+TombstoneDir+strings.TrimPrefix(tt.wantKey, tt.out.Prefix); got != want {
				t.Errorf("TombstoneKey = %q, want %q", got, want)
			}
		})
	}
}

func TestMetaValue(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{`"12:34"`, `"12:34"`},
		{"é", `\u00e9`},
		{"a\nb", `a\u000ab`},
		{"😀", `\ud83d\ude00`},
	}
	for _, tt := range tests {
		if got := metaValue(tt.in); got != tt.want {
			t.Errorf("metaValue(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
