package writer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/failure"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/testbucket"
)

// countingS3 passes calls to a real client and counts them and the body
// bytes the handler reads.
type countingS3 struct {
	S3
	calls atomic.Int64
	read  atomic.Int64
}

func (c *countingS3) GetObject(ctx context.Context, in *s3.GetObjectInput, opts ...func(*s3.Options)) (*s3.GetObjectOutput, error) {
	c.calls.Add(1)
	out, err := c.S3.GetObject(ctx, in, opts...)
	if err == nil {
		out.Body = &countingBody{ReadCloser: out.Body, n: &c.read}
	}
	return out, err
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// claimConfig has two jobs, j (output o, a standard queue) and other, both
// with the stack bucket bucket.
func claimConfig(t *testing.T, bucket string) *config.File {
	t.Helper()
	out := `[{"id":"o","type":"http","ordering":"none","max_receive_count":3,"http":{"url":"http://x/{doc_id}"}}]`
	f, err := config.Parse([]byte(fmt.Sprintf(`{"stack":{"prefix":"cw","bucket":%q},"jobs":[
		{"id":"j","source":{"type":"couchdb","url":"http://h/db"},"outputs":%s},
		{"id":"other","source":{"type":"couchdb","url":"http://h/db2"},"outputs":%s}]}`, bucket, out, out)))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// refRecord is a message of job j, output o, whose body is the claim check ref.
func refRecord(t *testing.T, f *config.File, ref *change.ObjectRef) events.SQSMessage {
	t.Helper()
	e := change.Envelope{V: 1, Job: "j", Output: "o", DocID: "d", Rev: "1-a", Seq: json.RawMessage(`7`),
		Version: change.Version{Generation: 1, Counter: 7}, DocRef: ref}
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	j := f.Jobs[0]
	return events.SQSMessage{
		MessageId: "m1", ReceiptHandle: "rh-m1", Body: string(b),
		EventSourceARN: "arn:aws:sqs:us-east-1:000000000000:" + f.QueueName(j, j.Outputs[0]),
		Attributes:     map[string]string{"ApproximateReceiveCount": "1"},
	}
}

// outcome is what became of one message: delivered with a body, dead-lettered
// with a reason, or returned for a retry.
type outcome struct {
	delivered string // the body the sink got
	dlqClass  string
	dlqReason string
	dlqError  string
	retried   bool
}

func handleOne(t *testing.T, f *config.File, client S3, rec events.SQSMessage) outcome {
	t.Helper()
	var mu sync.Mutex
	var got outcome
	sink := &fakeSink{apply: func(c *change.Envelope) error {
		mu.Lock()
		defer mu.Unlock()
		got.delivered = abbreviate(string(c.Doc))
		return nil
	}}
	q := &fakeSQS{}
	h := newHandler(f, sink, q)
	h.S3 = client
	resp, err := h.Handle(t.Context(), events.SQSEvent{Records: []events.SQSMessage{rec}})
	if err != nil {
		t.Fatal(err)
	}
	got.retried = len(resp.BatchItemFailures) > 0
	for _, in := range q.sent {
		r := failure.Parse(failure.SQSValues(in.MessageAttributes))
		got.dlqClass, got.dlqReason, got.dlqError = r.Class, r.Reason, r.Error
	}
	return got
}

// A claim check is read only from the stack bucket, under the claim-check
// prefix of the stack and the message's own job (or the job's, without the
// stack prefix, as queued messages may name it), and only up to the size the message
// declares; anything else is refused before S3 is asked, or stops at the
// declared size, and goes to the DLQ with its reason.
func TestClaimCheckConfined(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	awsCfg := testenv.AWS(t)
	client := s3.NewFromConfig(awsCfg, awsconf.S3Options)
	stack, foreign := testbucket.Create(t, client), testbucket.Create(t, client)
	put := func(bucket, key string, body []byte) {
		t.Helper()
		if _, err := client.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: bytes.NewReader(body)}); err != nil {
			t.Fatalf("put %s/%s: %v", bucket, key, err)
		}
	}
	const good = `{"ok":true}`
	big := bytes.Repeat([]byte("x"), 64<<20)
	put(stack, "claim-check/j/cw/1/1.json", []byte(good))
	put(stack, "claim-check/j/1/8.json", []byte(good))
	put(stack, "claim-check/other/cw/1/2.json", []byte(`{"job":"other"}`))
	put(stack, "claim-check/j/cw2/1/1.json", []byte(`{"stack":"cw2"}`))
	put(foreign, "claim-check/j/cw/1/3.json", []byte(`{"bucket":"foreign"}`))
	put(stack, "archive/orders/4.json", []byte(`{"output":"archive"}`))
	put(stack, "claim-check/other/cw/1/5.json", []byte(`{"traversal":true}`))
	put(stack, "claim-check/j/cw/1/6.json", big)
	put(stack, "claim-check/j/cw/1/7.json", []byte(`{"short":1}`))
	f := claimConfig(t, stack)

	tests := []struct {
		name       string
		ref        change.ObjectRef
		want       outcome
		wantErr    string // in the recorded error
		wantCalls  int64  // GetObject calls
		wantMaxLen int64  // body bytes read at most
	}{
		{name: "own claim check", ref: change.ObjectRef{Bucket: stack, Key: "claim-check/j/cw/1/1.json", Size: int64(len(good))},
			want: outcome{delivered: good}, wantCalls: 1, wantMaxLen: int64(len(good))},
		{name: "own claim check without the stack prefix", ref: change.ObjectRef{Bucket: stack, Key: "claim-check/j/1/8.json", Size: int64(len(good))},
			want: outcome{delivered: good}, wantCalls: 1, wantMaxLen: int64(len(good))},
		{name: "another job's prefix", ref: change.ObjectRef{Bucket: stack, Key: "claim-check/other/cw/1/2.json", Size: 15},
			want: outcome{dlqClass: "permanent", dlqReason: "claim_check_refused"}, wantErr: `not under "claim-check/j/cw/"`},
		{name: "another stack's job of the same id", ref: change.ObjectRef{Bucket: stack, Key: "claim-check/j/cw2/1/1.json", Size: 15},
			want: outcome{dlqClass: "permanent", dlqReason: "claim_check_refused"}, wantErr: `not under "claim-check/j/cw/"`},
		{name: "another bucket", ref: change.ObjectRef{Bucket: foreign, Key: "claim-check/j/cw/1/3.json", Size: 20},
			want: outcome{dlqClass: "permanent", dlqReason: "claim_check_refused"}, wantErr: "is not the stack bucket"},
		{name: "outside the claim-check prefix", ref: change.ObjectRef{Bucket: stack, Key: "archive/orders/4.json", Size: 20},
			want: outcome{dlqClass: "permanent", dlqReason: "claim_check_refused"}, wantErr: `not under "claim-check/j/cw/"`},
		{name: "dot segments", ref: change.ObjectRef{Bucket: stack, Key: "claim-check/j/cw/../../other/cw/1/5.json", Size: 18},
			want: outcome{dlqClass: "permanent", dlqReason: "claim_check_refused"}, wantErr: "segment"},
		{name: "prefix only", ref: change.ObjectRef{Bucket: stack, Key: "claim-check/j/cw/", Size: 18},
			want: outcome{dlqClass: "permanent", dlqReason: "claim_check_refused"}, wantErr: "segment"},
		{name: "larger than declared", ref: change.ObjectRef{Bucket: stack, Key: "claim-check/j/cw/1/6.json", Size: 10},
			want: outcome{dlqClass: "permanent", dlqReason: "claim_check_size"}, wantErr: "10 bytes", wantCalls: 1, wantMaxLen: 10},
		{name: "smaller than declared", ref: change.ObjectRef{Bucket: stack, Key: "claim-check/j/cw/1/7.json", Size: 100},
			want: outcome{dlqClass: "permanent", dlqReason: "claim_check_size"}, wantErr: "100 bytes", wantCalls: 1, wantMaxLen: 11},
		{name: "declared size above any document", ref: change.ObjectRef{Bucket: stack, Key: "claim-check/j/cw/1/6.json", Size: 1 << 40},
			want: outcome{dlqClass: "permanent", dlqReason: "claim_check_size"}, wantErr: "largest"},
		{name: "declared size zero", ref: change.ObjectRef{Bucket: stack, Key: "claim-check/j/cw/1/1.json", Size: 0},
			want: outcome{dlqClass: "permanent", dlqReason: "claim_check_size"}, wantErr: "0 bytes"},
		{name: "missing object", ref: change.ObjectRef{Bucket: stack, Key: "claim-check/j/cw/9/9.json", Size: 10},
			want: outcome{dlqClass: "permanent", dlqReason: "claim_check_missing"}, wantErr: "NoSuchKey", wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := &countingS3{S3: client}
			got := handleOne(t, f, c, refRecord(t, f, &tt.ref))
			gotErr := got.dlqError
			got.dlqError = ""
			if got != tt.want {
				t.Errorf("outcome %+v (error %q), want %+v", got, gotErr, tt.want)
			}
			if !strings.Contains(gotErr, tt.wantErr) {
				t.Errorf("recorded error %q, want one containing %q", gotErr, tt.wantErr)
			}
			if n := c.calls.Load(); n != tt.wantCalls {
				t.Errorf("%d GetObject calls, want %d", n, tt.wantCalls)
			}
			if n := c.read.Load(); n > tt.wantMaxLen {
				t.Errorf("read %d bytes of the object, want at most %d", n, tt.wantMaxLen)
			}
		})
	}
}

// On AWS the writer may not list the bucket, so S3 answers a GetObject of a
// missing claim check with 403 AccessDenied instead of 404: no retry can
// make it appear, so it goes to the DLQ at once. Throttling stays transient.
func TestClaimCheckS3Errors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status int
		code   string
		want   outcome
	}{
		{name: "access denied", status: http.StatusForbidden, code: "AccessDenied",
			want: outcome{dlqClass: "permanent", dlqReason: "claim_check_denied"}},
		{name: "not found", status: http.StatusNotFound, code: "NoSuchKey",
			want: outcome{dlqClass: "permanent", dlqReason: "claim_check_missing"}},
		{name: "no such bucket", status: http.StatusNotFound, code: "NoSuchBucket",
			want: outcome{dlqClass: "permanent", dlqReason: "claim_check_missing"}},
		{name: "slow down", status: http.StatusServiceUnavailable, code: "SlowDown",
			want: outcome{retried: true}},
		{name: "clock skew", status: http.StatusForbidden, code: "RequestTimeTooSkewed",
			want: outcome{retried: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/xml")
				w.WriteHeader(tt.status)
				fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>refused</Message><RequestId>R</RequestId><HostId>H</HostId></Error>`, tt.code)
			}))
			defer srv.Close()
			client := s3.New(s3.Options{
				BaseEndpoint: aws.String(srv.URL), UsePathStyle: true, Region: "us-east-1", RetryMaxAttempts: 1,
				Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
			})
			f := claimConfig(t, "stack-bucket")
			got := handleOne(t, f, client, refRecord(t, f, &change.ObjectRef{Bucket: "stack-bucket", Key: "claim-check/j/cw/1/7.json", Size: 10}))
			gotErr := got.dlqError
			got.dlqError = ""
			if got != tt.want {
				t.Errorf("outcome %+v (error %q), want %+v", got, gotErr, tt.want)
			}
			if strings.Contains(gotErr, "SECRET") || strings.Contains(gotErr, "AKID") {
				t.Errorf("recorded error shows credentials: %q", gotErr)
			}
		})
	}
}

var _ deliver.Sink = (*fakeSink)(nil)

// abbreviate keeps test output readable when a large body was delivered.
func abbreviate(s string) string {
	if len(s) <= 64 {
		return s
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:32], len(s))
}
