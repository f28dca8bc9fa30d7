package failure

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"
)

var (
	first = time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	last  = first.Add(90 * time.Second)
)

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   Record
	}{
		{name: "http failure", in: Record{Class: "permanent", Reason: "http_status", Error: "permanent http_status (http 400): bad request",
			HTTPStatus: 400, Attempts: 1, FirstAt: first, LastAt: last, Job: "orders", Output: "rest", DocID: "order-1"}},
		{name: "sql failure", in: Record{Class: "permanent", Reason: "sql_error", Error: "permanent sql_error (sqlstate 23502)",
			SQLState: "23502", Attempts: 3, FirstAt: first, LastAt: last, Job: "orders", Output: "pg", DocID: "order-2"}},
		{name: "undecodable body, no document id", in: Record{Class: "permanent", Reason: "decode", Error: "invalid envelope",
			Attempts: 1, FirstAt: first, LastAt: first, Job: "orders", Output: "pg"}},
		{name: "non-ASCII document id", in: Record{Class: "transient", Reason: "timeout", Error: "transient timeout",
			Attempts: 5, FirstAt: first, LastAt: last, Job: "j", Output: "o", DocID: "café/ünïcode"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Parse(SQSValues(tt.in.Attributes()))
			if d := cmp.Diff(tt.in, got); d != "" {
				t.Errorf("Parse(Attributes()) (-want +got):\n%s", d)
			}
			if !got.Recorded() {
				t.Errorf("Recorded() = false for %+v", got)
			}
		})
	}
}

// The attribute names, data types and values are what operators see in the
// SQS console and what DLQ messages already written carry: they must not
// drift.
func TestAttributes(t *testing.T) {
	t.Parallel()
	str := func(s string) sqstypes.MessageAttributeValue {
		return sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(s)}
	}
	num := func(s string) sqstypes.MessageAttributeValue {
		return sqstypes.MessageAttributeValue{DataType: aws.String("Number"), StringValue: aws.String(s)}
	}
	tests := []struct {
		name string
		in   Record
		want map[string]sqstypes.MessageAttributeValue
	}{
		{
			name: "every field: the HTTP status, not the SQL state, within SQS's ten attributes",
			in: Record{Class: "permanent", Reason: "http_status", Error: "boom", HTTPStatus: 422, SQLState: "23505",
				Attempts: 2, FirstAt: first, LastAt: last, Job: "orders", Output: "rest", DocID: "order-1"},
			want: map[string]sqstypes.MessageAttributeValue{
				"failure_class":       str("permanent"),
				"failure_reason":      str("http_status"),
				"failure_error":       str("boom"),
				"failure_http_status": num("422"),
				"failure_attempts":    num("2"),
				"failure_first_at":    str("2026-01-02T03:04:05.000000006Z"),
				"failure_last_at":     str("2026-01-02T03:05:35.000000006Z"),
				"failure_output":      str("rest"),
				"failure_job":         str("orders"),
				"doc_id":              str("order-1"),
			},
		},
		{
			name: "unset status, state and document id are left out",
			in:   Record{Class: "permanent", Reason: "decode", Error: "e", Attempts: 1, FirstAt: first, LastAt: first, Job: "j", Output: "o"},
			want: map[string]sqstypes.MessageAttributeValue{
				"failure_class":    str("permanent"),
				"failure_reason":   str("decode"),
				"failure_error":    str("e"),
				"failure_attempts": num("1"),
				"failure_first_at": str("2026-01-02T03:04:05.000000006Z"),
				"failure_last_at":  str("2026-01-02T03:04:05.000000006Z"),
				"failure_output":   str("o"),
				"failure_job":      str("j"),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if d := cmp.Diff(tt.want, tt.in.Attributes(), cmp.AllowUnexported(sqstypes.MessageAttributeValue{})); d != "" {
				t.Errorf("Attributes() (-want +got):\n%s", d)
			}
		})
	}
}

func TestAttributesClipText(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", MaxText) // 2 bytes a rune
	a := Record{Class: "permanent", Reason: "r", Error: "x\x00" + long, DocID: long}.Attributes()
	for _, k := range []string{AttrError, AttrDocID} {
		v := aws.ToString(a[k].StringValue)
		if len(v) > MaxText || !strings.HasSuffix(v, "é") {
			t.Errorf("%s: %d bytes ending %q, want at most %d ending on a whole character", k, len(v), v[len(v)-2:], MaxText)
		}
	}
	if got := aws.ToString(a[AttrError].StringValue); !strings.HasPrefix(got, "x?é") {
		t.Errorf("%s starts %q, want the NUL replaced", AttrError, got[:4])
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   map[string]string
		want Record
	}{
		{name: "moved by the redrive policy: nothing recorded", in: map[string]string{}, want: Record{}},
		{
			name: "malformed numbers and times stay zero",
			in: map[string]string{AttrClass: "transient", AttrReason: "timeout", AttrAttempts: "many",
				AttrHTTPStatus: "5xx", AttrFirstFailureAt: "yesterday", AttrLastFailureAt: "2026-01-02T03:05:35.000000006Z"},
			want: Record{Class: "transient", Reason: "timeout", LastAt: last},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Parse(tt.in)
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("Parse (-want +got):\n%s", d)
			}
			if got.Recorded() != (tt.want.Class != "") {
				t.Errorf("Recorded() = %v", got.Recorded())
			}
		})
	}
}

func TestValues(t *testing.T) {
	t.Parallel()
	got := SQSValues(map[string]sqstypes.MessageAttributeValue{
		"a": {DataType: aws.String("String"), StringValue: aws.String("x")},
		"n": {DataType: aws.String("Number"), StringValue: aws.String("3")},
		"b": {DataType: aws.String("Binary"), BinaryValue: []byte{1}},
	})
	if d := cmp.Diff(map[string]string{"a": "x", "n": "3"}, got); d != "" {
		t.Errorf("SQSValues (-want +got):\n%s", d)
	}
}

func TestAfter(t *testing.T) {
	t.Parallel()
	now := Record{Class: "transient", Reason: "timeout", Attempts: 3, FirstAt: last, LastAt: last.Add(time.Hour)}
	tests := []struct {
		name string
		prev Record
		want Record
	}{
		{name: "first failure: no history", prev: Record{}, want: now},
		{
			name: "redriven: attempts add up, first failure kept",
			prev: Record{Class: "permanent", Reason: "http_status", Attempts: 2, FirstAt: first, LastAt: first},
			want: Record{Class: "transient", Reason: "timeout", Attempts: 5, FirstAt: first, LastAt: last.Add(time.Hour)},
		},
		{
			name: "a later first failure does not move it",
			prev: Record{Attempts: 1, FirstAt: last.Add(time.Minute)},
			want: Record{Class: "transient", Reason: "timeout", Attempts: 4, FirstAt: last, LastAt: last.Add(time.Hour)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if d := cmp.Diff(tt.want, now.After(tt.prev)); d != "" {
				t.Errorf("After (-want +got):\n%s", d)
			}
		})
	}
}

func TestClip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		max  int
		want string
	}{
		{name: "control characters and invalid UTF-8 replaced, cut on a rune", in: "é\x00b" + string([]byte{0xff}) + "ééé", max: 7, want: "é?b?é"},
		{name: "tab, newline and return kept", in: "a\tb\nc\r", max: 10, want: "a\tb\nc\r"},
		{name: "noncharacters replaced", in: "a\uFFFEb\uFFFF", max: 10, want: "a?b?"},
		{name: "short enough", in: "abc", max: 3, want: "abc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := clip(tt.in, tt.max); got != tt.want {
				t.Errorf("clip(%q, %d) = %q, want %q", tt.in, tt.max, got, tt.want)
			}
		})
	}
}

// The attributes of any record, however long its texts and numbers, take
// at most MaxSize bytes of a message as SQS counts them (name, data type
// and value of each).
func TestAttributesWithinMaxSize(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 2*MaxText)
	far := time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("", -(23*3600+59*60)))
	tests := []struct {
		name string
		in   Record
	}{
		{name: "every field at its longest", in: Record{Class: long, Reason: long, Error: long, HTTPStatus: math.MinInt64, SQLState: long,
			Attempts: math.MinInt64, FirstAt: far, LastAt: far, Job: long, Output: long, DocID: long}},
		{name: "usual", in: Record{Class: "permanent", Reason: "http_status", Error: "permanent http_status (http 400): bad request",
			HTTPStatus: 400, Attempts: 1, FirstAt: first, LastAt: last, Job: "orders", Output: "rest", DocID: "order-1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			size := 0
			for name, a := range tt.in.Attributes() {
				size += len(name) + len(aws.ToString(a.DataType)) + len(aws.ToString(a.StringValue)) + len(a.BinaryValue)
			}
			if size > MaxSize {
				t.Errorf("attributes take %d bytes, more than MaxSize (%d)", size, MaxSize)
			}
			// SQS takes at most ten attributes on a message.
			if n := len(tt.in.Attributes()); n > MaxAttributes || MaxAttributes > 10 {
				t.Errorf("%d attributes, MaxAttributes %d; SQS takes at most 10", n, MaxAttributes)
			}
		})
	}
}
