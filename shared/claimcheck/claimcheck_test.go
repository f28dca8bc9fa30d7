package claimcheck_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/testbucket"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	key := claimcheck.Key("cw", "orders", change.Version{Generation: 3, Counter: 41})
	if key != "claim-check/orders/cw/3/41.json" {
		t.Fatalf("Key = %q", key)
	}
	tests := []struct {
		name string
		ref  change.ObjectRef
		want error // nil, ErrRefused or ErrSize
	}{
		{"made by Key", change.ObjectRef{Bucket: "stack", Key: key, Size: 1}, nil},
		{"largest size", change.ObjectRef{Bucket: "stack", Key: key, Size: claimcheck.MaxSize}, nil},
		{"one byte too large", change.ObjectRef{Bucket: "stack", Key: key, Size: claimcheck.MaxSize + 1}, claimcheck.ErrSize},
		{"negative size", change.ObjectRef{Bucket: "stack", Key: key, Size: -1}, claimcheck.ErrSize},
		{"other bucket", change.ObjectRef{Bucket: "stack2", Key: key, Size: 1}, claimcheck.ErrRefused},
		{"empty bucket", change.ObjectRef{Key: key, Size: 1}, claimcheck.ErrRefused},
		{"job whose id extends ours", change.ObjectRef{Bucket: "stack", Key: "claim-check/orders-eu/cw/3/41.json", Size: 1}, claimcheck.ErrRefused},
		{"stack prefix without slash", change.ObjectRef{Bucket: "stack", Key: "claim-check/orders/cw", Size: 1}, claimcheck.ErrRefused},
		{"another stack's", change.ObjectRef{Bucket: "stack", Key: "claim-check/orders/cw2/3/41.json", Size: 1}, claimcheck.ErrRefused},
		{"a stack whose prefix extends ours", change.ObjectRef{Bucket: "stack", Key: "claim-check/orders/cw-eu/3/41.json", Size: 1}, claimcheck.ErrRefused},
		{"another output's prefix", change.ObjectRef{Bucket: "stack", Key: "archive/orders/1.json", Size: 1}, claimcheck.ErrRefused},
		{"double slash", change.ObjectRef{Bucket: "stack", Key: "claim-check/orders/cw//41.json", Size: 1}, claimcheck.ErrRefused},
		{"dot segment", change.ObjectRef{Bucket: "stack", Key: "claim-check/orders/cw/./41.json", Size: 1}, claimcheck.ErrRefused},
		{"escape upwards", change.ObjectRef{Bucket: "stack", Key: "claim-check/orders/cw/../../x", Size: 1}, claimcheck.ErrRefused},
		{"control character", change.ObjectRef{Bucket: "stack", Key: "claim-check/orders/cw/a\nb", Size: 1}, claimcheck.ErrRefused},
		{"invalid UTF-8", change.ObjectRef{Bucket: "stack", Key: "claim-check/orders/cw/\xff", Size: 1}, claimcheck.ErrRefused},
		{"too long", change.ObjectRef{Bucket: "stack", Key: "claim-check/orders/cw/" + strings.Repeat("x", 1010), Size: 1}, claimcheck.ErrRefused},
		// Keys without the stack prefix, which messages queued by a release
		// before 1.0.0 may name, in the one shape it gave them.
		{"unscoped", change.ObjectRef{Bucket: "stack", Key: "claim-check/orders/3/41.json", Size: 1}, nil},
		{"unscoped, another job", change.ObjectRef{Bucket: "stack", Key: "claim-check/orders-eu/3/41.json", Size: 1}, claimcheck.ErrRefused},
		{"unscoped, a claim check of another stack's job named like ours", change.ObjectRef{Bucket: "stack", Key: "claim-check/orders/other/3/41.json", Size: 1}, claimcheck.ErrRefused},
		{"unscoped, no counter", change.ObjectRef{Bucket: "stack", Key: "claim-check/orders/3/x.json", Size: 1}, claimcheck.ErrRefused},
		{"unscoped, dot-dot", change.ObjectRef{Bucket: "stack", Key: "claim-check/orders/../41.json", Size: 1}, claimcheck.ErrRefused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := claimcheck.Check(&tt.ref, "stack", "cw", "orders")
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("Check = %v, want %v", err, tt.want)
			}
			if err != nil && len(err.Error()) > 600 {
				t.Errorf("error of %d bytes: the key must be cut short", len(err.Error()))
			}
		})
	}
}

// countingClient counts the body bytes read through it.
type countingClient struct {
	c    claimcheck.GetObjecter
	read atomic.Int64
}

func (c *countingClient) GetObject(ctx context.Context, in *s3.GetObjectInput, opts ...func(*s3.Options)) (*s3.GetObjectOutput, error) {
	out, err := c.c.GetObject(ctx, in, opts...)
	if err == nil {
		out.Body = readCloser{Reader: io.TeeReader(out.Body, countWriter{&c.read}), Closer: out.Body}
	}
	return out, err
}

type readCloser struct {
	io.Reader
	io.Closer
}

type countWriter struct{ n *atomic.Int64 }

func (w countWriter) Write(p []byte) (int, error) { w.n.Add(int64(len(p))); return len(p), nil }

// An S3 peer that sends no Content-Length (chunked) or breaks off: the read
// still stops one byte past the declared size, and a body cut short is not
// mistaken for a wrong size (a retry may get it whole).
func TestFetchWithoutLength(t *testing.T) {
	t.Parallel()
	const declared = 10
	tests := []struct {
		name    string
		serve   func(w http.ResponseWriter)
		want    error // sentinel, or nil for success
		wantAny bool  // any error that is none of the sentinels
	}{
		{name: "chunked, larger", want: claimcheck.ErrSize, serve: func(w http.ResponseWriter) {
			for i := 0; i < 1024; i++ {
				w.Write([]byte(strings.Repeat("x", 1024)))
				w.(http.Flusher).Flush()
			}
		}},
		{name: "chunked, exact", serve: func(w http.ResponseWriter) {
			w.Write([]byte(`{"a":1234}`))
			w.(http.Flusher).Flush()
		}},
		{name: "chunked, shorter", want: claimcheck.ErrSize, serve: func(w http.ResponseWriter) {
			w.Write([]byte(`{}`))
			w.(http.Flusher).Flush()
		}},
		{name: "broken off", wantAny: true, serve: func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", fmt.Sprint(declared))
			w.WriteHeader(http.StatusOK)
			w.Write([]byte(`{"a"`))
			w.(http.Flusher).Flush()
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { tt.serve(w) }))
			defer srv.Close()
			c := &countingClient{c: s3.New(s3.Options{
				BaseEndpoint: aws.String(srv.URL), UsePathStyle: true, Region: "us-east-1", RetryMaxAttempts: 1,
				Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
			})}
			ref := &change.ObjectRef{Bucket: "stack", Key: "claim-check/j/cw/1/1.json", Size: declared}
			b, err := claimcheck.Fetch(t.Context(), c, ref, "stack", "cw", "j")
			sentinel := errors.Is(err, claimcheck.ErrSize) || errors.Is(err, claimcheck.ErrRefused) ||
				errors.Is(err, claimcheck.ErrMissing) || errors.Is(err, claimcheck.ErrDenied)
			switch {
			case tt.wantAny:
				if err == nil || sentinel {
					t.Errorf("Fetch error %v, want a retryable one", err)
				}
			case tt.want == nil:
				if err != nil || string(b) != `{"a":1234}` {
					t.Errorf("Fetch = %q, %v", b, err)
				}
			case !errors.Is(err, tt.want):
				t.Errorf("Fetch error %v, want %v", err, tt.want)
			}
			if n := c.read.Load(); n > declared+1 {
				t.Errorf("read %d bytes, want at most %d", n, declared+1)
			}
		})
	}
}

// The claim checks the poller's sender writes are the ones the writer's
// Fetch accepts, from the emulator's S3.
func TestFanoutClaimChecksAccepted(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg := testenv.AWS(t)
	sq, s3c := sqs.NewFromConfig(cfg), s3.NewFromConfig(cfg, awsconf.S3Options)
	name := testbucket.Create(t, s3c)
	q, err := sq.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sq.DeleteQueue(context.WithoutCancel(ctx), &sqs.DeleteQueueInput{QueueUrl: q.QueueUrl}) })
	body := fmt.Sprintf(`{"big":%q}`, strings.Repeat("é", 3000))
	c := &change.Envelope{V: 1, Job: "orders", DocID: "d", Rev: "1-a", Seq: json.RawMessage(`1`),
		Version: change.Version{Generation: 2, Counter: 9}, Doc: json.RawMessage(body)}
	snd := &fanout.Sender{SQS: sq, S3: s3c, Bucket: name, Stack: "cw", MaxBytes: 1024}
	if _, err := snd.Send(ctx, []fanout.Target{{Output: "o", QueueURL: *q.QueueUrl}}, []*change.Envelope{c}, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	out, err := sq.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: q.QueueUrl, WaitTimeSeconds: 1})
	if err != nil || len(out.Messages) != 1 {
		t.Fatalf("receive: %v, %d messages", err, len(out.Messages))
	}
	env, err := change.Decode([]byte(*out.Messages[0].Body))
	if err != nil || env.DocRef == nil {
		t.Fatalf("decode: %v, doc_ref %v", err, env)
	}
	if want := claimcheck.Key("cw", "orders", c.Version); env.DocRef.Key != want {
		t.Errorf("claim check key %q, want %q", env.DocRef.Key, want)
	}
	got, err := claimcheck.Fetch(ctx, s3c, env.DocRef, name, "cw", "orders")
	if err != nil || string(got) != body {
		t.Fatalf("Fetch = %d bytes, %v; want the body", len(got), err)
	}
	if _, err := claimcheck.Fetch(ctx, s3c, env.DocRef, name, "cw", "other"); !errors.Is(err, claimcheck.ErrRefused) {
		t.Errorf("Fetch for another job: %v, want ErrRefused", err)
	}
	if _, err := claimcheck.Fetch(ctx, s3c, env.DocRef, name, "cw2", "orders"); !errors.Is(err, claimcheck.ErrRefused) {
		t.Errorf("Fetch for another stack's job of the same id: %v, want ErrRefused", err)
	}
}

func TestRebase(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key, want string // want "" for no claim-check key
	}{
		{"claim-check/orders/changes-worker/3/1210.json", "claim-check/j/cw/3/1210.json"},
		{"claim-check/orders/3/1210.json", "claim-check/j/cw/3/1210.json"},
		{"claim-check/orders/3/x.json", ""},
		{"claim-check/a/b/c/3/1.json", ""},
		{"archive/orders/3/1.json", ""},
	}
	for _, tt := range tests {
		got, ok := claimcheck.Rebase(tt.key, "cw", "j")
		if got != tt.want || ok != (tt.want != "") {
			t.Errorf("Rebase(%q) = %q, %t; want %q", tt.key, got, ok, tt.want)
		}
	}
}

// previousReleaseFollows is the rule by which the writer of the release
// before 1.0.0 follows a claim check of job: a key under claim-check/<job>/
// whose rest is non-empty segments, none "." or "..". Its IAM grant is the
// same prefix.
func previousReleaseFollows(key, job string) bool {
	rest, ok := strings.CutPrefix(key, "claim-check/"+job+"/")
	if !ok {
		return false
	}
	for _, seg := range strings.Split(rest, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

// TestKeyReadByPreviousRelease: during a rolling deploy, a writer of the
// release before 1.0.0 may receive what this release's poller queued, so
// every key Key makes is one that writer follows (and its role may read);
// and the keys of two stacks sharing a bucket, or of one stack and the
// previous release's unscoped keys, never meet.
func TestKeyReadByPreviousRelease(t *testing.T) {
	t.Parallel()
	v := change.Version{Generation: 3, Counter: 41}
	for _, stack := range []string{"cw", "changes-worker", "cw2"} {
		if key := claimcheck.Key(stack, "orders", v); !previousReleaseFollows(key, "orders") {
			t.Errorf("Key(%q, orders, %s) = %q: the previous release's writer refuses it", stack, v, key)
		}
	}
	keys := map[string]string{
		claimcheck.Key("cw", "orders", v):                 "stack cw",
		claimcheck.Key("cw2", "orders", v):                "stack cw2",
		claimcheck.Key("cw", "orders-eu", v):              "job orders-eu",
		claimcheck.UnscopedPrefix("orders") + "3/41.json": "the previous release",
	}
	if len(keys) != 4 {
		t.Errorf("claim-check keys meet: %v", keys)
	}
}
