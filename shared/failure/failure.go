// Package failure is the record of why a change was dead-lettered, and its
// one wire format: SQS message attributes on the DLQ message, readable in the
// SQS console. The writer writes the record when it moves a message to the
// DLQ; the DLQ tools read it back to list and group failures. A redrive keeps
// the attributes, so a change that fails again after a redrive carries its
// earlier history to the writer, which extends it (Record.After).
package failure

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// Message attribute names of a Record.
const (
	AttrClass          = "failure_class"
	AttrReason         = "failure_reason"
	AttrError          = "failure_error"
	AttrHTTPStatus     = "failure_http_status"
	AttrSQLState       = "failure_sql_state"
	AttrAttempts       = "failure_attempts"
	AttrFirstFailureAt = "failure_first_at"
	AttrLastFailureAt  = "failure_last_at"
	AttrOutput         = "failure_output"
	AttrJob            = "failure_job"
	AttrDocID          = "doc_id"
)

// Bounds of the attribute values of a Record: the error text and the
// document id keep at most MaxText bytes, every other text (class, reason,
// SQL state, job, output, the two times) at most MaxCode, and a number
// takes at most maxDigits.
const (
	MaxText   = 1024
	MaxCode   = 64
	maxDigits = 20 // an int64 with its sign
)

// MaxSize is the most bytes the attributes of a Record take of an SQS
// message, counted as SQS counts them against its size limit: each
// attribute's name, data type ("String" or "Number", 6 bytes) and value.
const MaxSize = len(AttrClass+AttrReason+AttrError+AttrHTTPStatus+AttrSQLState+AttrAttempts+
	AttrFirstFailureAt+AttrLastFailureAt+AttrOutput+AttrJob+AttrDocID) +
	11*len("String") + 2*MaxText + 7*MaxCode + 2*maxDigits

// MaxAttributes is the most attributes a Record writes: SQS takes ten on a
// message, so a record keeps an HTTP status or an SQL state, not both.
const MaxAttributes = 10

// Record is why a change reached the DLQ. A message moved there by the work
// queue's redrive policy instead (the writer crashed or timed out on every
// receive) carries none: its Record is the zero value.
type Record struct {
	Class      string    `json:"class"`
	Reason     string    `json:"reason"`
	Error      string    `json:"error,omitempty"`
	HTTPStatus int       `json:"http_status,omitempty"`
	SQLState   string    `json:"sql_state,omitempty"`
	Attempts   int       `json:"attempts,omitempty"`
	FirstAt    time.Time `json:"first_failure_at,omitzero"`
	LastAt     time.Time `json:"last_failure_at,omitzero"`
	Job        string    `json:"job,omitempty"`
	Output     string    `json:"output,omitempty"`
	DocID      string    `json:"doc_id,omitempty"`
}

// Recorded reports whether the writer recorded a reason.
func (r Record) Recorded() bool { return r.Class != "" }

// After returns r extended with the history of prev, the record of an
// earlier failure of the same message (one redriven from the DLQ): the
// attempts add up, and the first failure is the earlier of the two.
func (r Record) After(prev Record) Record {
	r.Attempts += prev.Attempts
	if !prev.FirstAt.IsZero() && prev.FirstAt.Before(r.FirstAt) {
		r.FirstAt = prev.FirstAt
	}
	return r
}

// Attributes returns r as SQS message attributes, at most MaxSize bytes of
// them. Times are written as RFC 3339 with nanoseconds in their own
// location; every text is made a valid attribute value of at most MaxText
// bytes (the error text and the document id) or MaxCode (the others). The
// HTTP status, SQL state and document id are left out when unset, and the
// SQL state when there is an HTTP status (MaxAttributes).
func (r Record) Attributes() map[string]sqstypes.MessageAttributeValue {
	attrs := map[string]sqstypes.MessageAttributeValue{
		AttrClass:          text(r.Class, MaxCode),
		AttrReason:         text(r.Reason, MaxCode),
		AttrError:          text(r.Error, MaxText),
		AttrAttempts:       number(r.Attempts),
		AttrFirstFailureAt: text(r.FirstAt.Format(time.RFC3339Nano), MaxCode),
		AttrLastFailureAt:  text(r.LastAt.Format(time.RFC3339Nano), MaxCode),
		AttrOutput:         text(r.Output, MaxCode),
		AttrJob:            text(r.Job, MaxCode),
	}
	switch {
	case r.HTTPStatus != 0:
		attrs[AttrHTTPStatus] = number(r.HTTPStatus)
	case r.SQLState != "":
		attrs[AttrSQLState] = text(r.SQLState, MaxCode)
	}
	if r.DocID != "" {
		attrs[AttrDocID] = text(r.DocID, MaxText)
	}
	return attrs
}

// Parse reads a Record from a message's attribute values by name (see
// Values and SQSValues). A missing or malformed value leaves its field zero.
func Parse(values map[string]string) Record {
	at := func(k string) time.Time {
		t, _ := time.Parse(time.RFC3339Nano, values[k])
		return t
	}
	r := Record{
		Class: values[AttrClass], Reason: values[AttrReason], Error: values[AttrError], SQLState: values[AttrSQLState],
		FirstAt: at(AttrFirstFailureAt), LastAt: at(AttrLastFailureAt),
		Job: values[AttrJob], Output: values[AttrOutput], DocID: values[AttrDocID],
	}
	r.HTTPStatus, _ = strconv.Atoi(values[AttrHTTPStatus])
	r.Attempts, _ = strconv.Atoi(values[AttrAttempts])
	return r
}

// Values returns the string values of message attributes by name, whatever
// their type: the SDK's sqstypes.MessageAttributeValue or the Lambda event's
// attribute, with stringValue reading the value of one (nil for a binary
// attribute, which is left out).
func Values[A any](attrs map[string]A, stringValue func(A) *string) map[string]string {
	out := make(map[string]string, len(attrs))
	for k, a := range attrs {
		if v := stringValue(a); v != nil {
			out[k] = *v
		}
	}
	return out
}

// SQSValues is Values of the SDK's message attributes.
func SQSValues(attrs map[string]sqstypes.MessageAttributeValue) map[string]string {
	return Values(attrs, func(a sqstypes.MessageAttributeValue) *string { return a.StringValue })
}

// clip makes s a valid SQS attribute value of at most max bytes: valid
// UTF-8, no control characters SQS refuses, cut on a character boundary.
func clip(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 && r != '\t' && r != '\n' && r != '\r' || r == 0xFFFE || r == 0xFFFF {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// text is a String attribute of s made a valid value of at most max bytes.
func text(s string, max int) sqstypes.MessageAttributeValue {
	return sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(clip(s, max))}
}

func number(n int) sqstypes.MessageAttributeValue {
	return sqstypes.MessageAttributeValue{DataType: aws.String("Number"), StringValue: aws.String(strconv.Itoa(n))}
}
