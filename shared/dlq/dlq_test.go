package dlq

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/failure"
)

func str(s string) sqstypes.MessageAttributeValue {
	return sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(s)}
}

func num(n int) sqstypes.MessageAttributeValue {
	return sqstypes.MessageAttributeValue{DataType: aws.String("Number"), StringValue: aws.String(fmt.Sprint(n))}
}

// failed builds a DLQ message as writer.Handler writes it.
func failed(id, docID, class, reason string, status int, sqlState string, last time.Time) sqstypes.Message {
	body := fmt.Sprintf(`{"v":1,"job":"orders","output":"pg","doc_id":%q,"rev":"1-a","seq":7,"generation":2,"counter":3,"enqueued_at":"2026-01-02T03:04:05Z","doc":{"_id":%q,"secret":"body"}}`, docID, docID)
	attrs := map[string]sqstypes.MessageAttributeValue{
		failure.AttrClass:          str(class),
		failure.AttrReason:         str(reason),
		failure.AttrError:          str(class + " " + reason + ": boom " + docID),
		failure.AttrAttempts:       num(1),
		failure.AttrFirstFailureAt: str(last.Add(-time.Minute).Format(time.RFC3339Nano)),
		failure.AttrLastFailureAt:  str(last.Format(time.RFC3339Nano)),
		failure.AttrOutput:         str("pg"),
		failure.AttrJob:            str("orders"),
		failure.AttrDocID:          str(docID),
	}
	if status != 0 {
		attrs[failure.AttrHTTPStatus] = num(status)
	}
	if sqlState != "" {
		attrs[failure.AttrSQLState] = str(sqlState)
	}
	return sqstypes.Message{
		MessageId: aws.String(id), Body: aws.String(body), ReceiptHandle: aws.String("rh-" + id),
		Attributes:        map[string]string{"SentTimestamp": fmt.Sprint(last.UnixMilli()), "ApproximateReceiveCount": "2"},
		MessageAttributes: attrs,
	}
}

func TestDecode(t *testing.T) {
	t.Parallel()
	last := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name string
		in   sqstypes.Message
		want func(*testing.T, Message)
	}{
		{
			name: "writer failure",
			in:   failed("m1", "order-1", "permanent", "http_status", 422, "", last),
			want: func(t *testing.T, m Message) {
				want := failure.Record{Class: "permanent", Reason: "http_status", Error: "permanent http_status: boom order-1", HTTPStatus: 422,
					Attempts: 1, FirstAt: last.Add(-time.Minute), LastAt: last, Job: "orders", Output: "pg", DocID: "order-1"}
				if diff := cmp.Diff(want, m.Failure); diff != "" {
					t.Errorf("failure (-want +got):\n%s", diff)
				}
				if m.Envelope == nil || m.Envelope.DocID != "order-1" || m.Envelope.Version.String() != "2.3" || m.EnvelopeError != "" {
					t.Errorf("envelope = %+v, error %q", m.Envelope, m.EnvelopeError)
				}
				if m.Receives != 2 || !m.SentAt.Equal(last) {
					t.Errorf("receives %d sent %s", m.Receives, m.SentAt)
				}
			},
		},
		{
			name: "moved by the redrive policy: no reason",
			in:   sqstypes.Message{MessageId: aws.String("m2"), Body: aws.String(`{"v":1,"job":"orders","output":"pg","doc_id":"x","seq":1,"generation":1,"counter":1,"deleted":true}`)},
			want: func(t *testing.T, m Message) {
				if m.Failure.Recorded() {
					t.Errorf("Recorded() = true for %+v", m.Failure)
				}
				if m.DocID() != "x" {
					t.Errorf("DocID() = %q", m.DocID())
				}
			},
		},
		{
			name: "poison body",
			in:   sqstypes.Message{MessageId: aws.String("m3"), Body: aws.String(`{not json`)},
			want: func(t *testing.T, m Message) {
				if m.Envelope != nil || m.EnvelopeError == "" {
					t.Errorf("envelope %+v error %q", m.Envelope, m.EnvelopeError)
				}
			},
		},
		{
			name: "json but not an envelope",
			in:   sqstypes.Message{MessageId: aws.String("m4"), Body: aws.String(`{"v":1}`)},
			want: func(t *testing.T, m Message) {
				if m.Envelope == nil || m.EnvelopeError == "" {
					t.Errorf("envelope %+v error %q", m.Envelope, m.EnvelopeError)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.want(t, Decode(tt.in))
		})
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	var msgs []Message
	for i := range 5 {
		msgs = append(msgs, Decode(failed(fmt.Sprint("h", i), fmt.Sprint("doc-", i%3), "permanent", "http_status", 422, "", t0.Add(time.Duration(i)*time.Minute))))
	}
	msgs = append(msgs,
		Decode(failed("s1", "doc-9", "transient", "sql_error", 0, "40001", t0)),
		Decode(sqstypes.Message{MessageId: aws.String("p1"), Body: aws.String(`{}`)}),
	)
	got := Summarize(msgs, 2)
	want := []Group{
		{Class: "permanent", Reason: "http_status", HTTPStatus: 422, Count: 5, Samples: []string{"doc-0", "doc-1"},
			Error: "permanent http_status: boom doc-1", FirstAt: t0.Add(-time.Minute), LastAt: t0.Add(4 * time.Minute)},
		{Count: 1, Samples: []string{},
			Error: "no reason recorded: the queue's redrive policy moved it (the writer failed or timed out on every receive)"},
		{Class: "transient", Reason: "sql_error", SQLState: "40001", Count: 1, Samples: []string{"doc-9"},
			Error: "transient sql_error: boom doc-9", FirstAt: t0.Add(-time.Minute), LastAt: t0},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Summarize (-want +got):\n%s", diff)
	}
}

func TestUnsupported(t *testing.T) {
	t.Parallel()
	resp := func(status int) *smithyhttp.Response {
		return &smithyhttp.Response{Response: &http.Response{StatusCode: status}}
	}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"sqs unsupported operation", fmt.Errorf("op: %w", &sqstypes.UnsupportedOperation{Message: aws.String("x")}), true},
		{"http 501", &awshttp.ResponseError{ResponseError: &smithyhttp.ResponseError{Response: resp(501), Err: errors.New("x")}}, true},
		{"error code string alone", &smithy.GenericAPIError{Code: "AWS.SimpleQueueService.UnsupportedOperation", Message: "x"}, false},
		{"not json", fmt.Errorf("op: %w", &smithy.DeserializationError{Err: errors.New("invalid character '<'")}), false},
		{"access denied", &smithy.GenericAPIError{Code: "AccessDenied", Message: "not authorized"}, false},
		{"server error", &awshttp.ResponseError{ResponseError: &smithyhttp.ResponseError{Response: resp(500), Err: errors.New("x")}}, false},
		{"timeout", context.DeadlineExceeded, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Unsupported(tt.err); got != tt.want {
				t.Errorf("Unsupported(%v) = %t, want %t", tt.err, got, tt.want)
			}
		})
	}
}

func TestPacer(t *testing.T) {
	t.Parallel()
	p := &pacer{rate: 100}
	start := time.Now()
	for range 5 {
		if err := p.wait(t.Context(), 10); err != nil {
			t.Fatal(err)
		}
	}
	// 50 messages at 100/s: the fifth batch may start after 0.4s.
	if got := time.Since(start); got < 380*time.Millisecond || got > 2*time.Second {
		t.Errorf("5 batches of 10 at 100/s took %s, want about 400ms", got)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := p.wait(ctx, 1000); !errors.Is(err, context.Canceled) {
		t.Errorf("wait on a cancelled context = %v", err)
	}
	if err := (&pacer{}).wait(ctx, 10); err != nil {
		t.Errorf("zero rate waited: %v", err)
	}
}

func TestDeduplicationID(t *testing.T) {
	t.Parallel()
	a, b := DeduplicationID("m-1"), DeduplicationID("m-2")
	if a == b || a != DeduplicationID("m-1") || len(a) > 128 {
		t.Errorf("ids %q %q: want stable, distinct, at most 128 characters", a, b)
	}
}
