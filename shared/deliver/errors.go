package deliver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Class says whether retrying a failed delivery can help.
type Class string

const (
	// Transient failures (connection errors, timeouts, 5xx, 408, 429,
	// deadlocks, serialization failures) are retried by SQS.
	Transient Class = "transient"
	// Permanent failures (other 4xx, constraint and type errors, undecodable
	// envelopes) go to the DLQ at once with their reason.
	Permanent Class = "permanent"
)

// Error is a classified delivery failure. Reason is short and stable
// ("http_status", "sql_error", "decode", ...) so operators can group by it;
// Err carries the detail. Neither may contain secrets or document bodies.
type Error struct {
	Class      Class
	Reason     string
	HTTPStatus int
	SQLState   string
	// Backpressure marks a transient failure that is the output asking us
	// to slow down (HTTP 429 or 503, PostgreSQL too_many_connections)
	// rather than failing the change: the writer waits instead of counting
	// it toward the DLQ.
	Backpressure bool
	// RetryAfter is how long the output asked us to wait (Retry-After), zero
	// when it did not say, at most MaxRetryAfter.
	RetryAfter time.Duration
	Err        error
}

func (e *Error) Error() string {
	s := string(e.Class) + " " + e.Reason
	if e.HTTPStatus != 0 {
		s += fmt.Sprintf(" (http %d)", e.HTTPStatus)
	}
	if e.SQLState != "" {
		s += " (sqlstate " + e.SQLState + ")"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// TransientError returns a transient failure with the given reason.
func TransientError(reason string, err error) *Error {
	return &Error{Class: Transient, Reason: reason, Err: err}
}

// PermanentError returns a permanent failure with the given reason.
func PermanentError(reason string, err error) *Error {
	return &Error{Class: Permanent, Reason: reason, Err: err}
}

// Classify returns err as a classified *Error. An unclassified error is
// transient: a failure we do not understand is retried, and reaches the DLQ
// only when its receive count runs out, never silently dropped.
func Classify(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return TransientError("timeout", err)
	}
	return TransientError("unclassified", err)
}

// HTTPStatusClass classifies an HTTP response status as in the reference
// failure tables: 408, 425, 429 and 5xx are transient; 3xx (redirects not
// followed) and other 4xx are permanent. 2xx is not a failure and returns "".
func HTTPStatusClass(status int) Class {
	switch {
	case status >= 200 && status < 300:
		return ""
	case status == 408 || status == 425 || status == 429 || status >= 500:
		return Transient
	default:
		return Permanent
	}
}

// MaxRetryAfter is the longest wait an output can ask for: a message held
// for it stays in flight that long, and under ordering total it keeps the
// whole output waiting behind it.
const MaxRetryAfter = 5 * time.Minute

// ParseRetryAfter reads a Retry-After header value: delay seconds or an HTTP
// date (relative to now), at most MaxRetryAfter. It returns zero for an
// absent, malformed or past value.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		// A number too large for an int64 is out of range: a long wait.
		if n <= 0 {
			return 0
		}
		return time.Duration(min(n, int64(MaxRetryAfter/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), MaxRetryAfter)
	}
	return 0
}

// AuthFailure says whether err is the output refusing our credentials: HTTP
// 401 or 403 (S3's AccessDenied is a 403), or PostgreSQL's
// invalid_password (28P01) or invalid_authorization_specification (28000).
func AuthFailure(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	return e.HTTPStatus == 401 || e.HTTPStatus == 403 || e.SQLState == "28P01" || e.SQLState == "28000"
}
