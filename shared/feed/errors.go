package feed

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"unicode"
)

// ErrMalformed marks a response that is not the JSON the operation expects.
// It is wrapped with the operation's name ("changes: malformed response: ...")
// and counts as transient (see Transient).
var ErrMalformed = errors.New("malformed response")

// ErrNotFound matches (errors.Is) a *StatusError with status 404, and the error
// Get returns for a deleted document.
var ErrNotFound = errors.New("not found")

// maxReason bounds the length of StatusError.Reason.
const maxReason = 200

// StatusError is a non-2xx answer from the source.
type StatusError struct {
	// Op is the operation: changes, bulk_get, get or all_docs.
	Op     string
	Status int
	// Reason is the source's JSON error and reason fields ("unauthorized:
	// Login required"), truncated; the status text when the body had none.
	Reason string
}

func (e *StatusError) Error() string {
	return e.Op + ": source answered " + strconv.Itoa(e.Status) + " " + e.Reason
}

// Is makes a 404 match ErrNotFound.
func (e *StatusError) Is(target error) bool {
	return target == ErrNotFound && e.Status == http.StatusNotFound
}

// Transient reports whether retrying can help: 5xx, 408 and 429.
func (e *StatusError) Transient() bool {
	return e.Status >= 500 || e.Status == http.StatusRequestTimeout || e.Status == http.StatusTooManyRequests
}

// newStatusError builds the error for a non-2xx answer. Only the body's error
// and reason fields are kept: never headers, never anything else.
func newStatusError(op string, status int, body []byte) *StatusError {
	var b struct {
		Error  any `json:"error"`
		Reason any `json:"reason"`
	}
	_ = json.Unmarshal(body, &b) // a body that is not JSON leaves both empty
	return &StatusError{Op: op, Status: status, Reason: reason(status, text(b.Error), text(b.Reason))}
}

// reason joins a source's error and reason fields, falling back to the
// status text, and makes the result short and printable.
func reason(status int, name, detail string) string {
	var r string
	switch {
	case name != "" && detail != "":
		r = name + ": " + detail
	case name != "":
		r = name
	case detail != "":
		r = detail
	default:
		r = strings.ToLower(http.StatusText(status))
	}
	r = strings.Map(func(c rune) rune {
		if unicode.IsControl(c) {
			return ' '
		}
		return c
	}, r)
	if runes := []rune(r); len(runes) > maxReason {
		r = string(runes[:maxReason]) + "…"
	}
	return r
}

// text returns a JSON string field's value; other types are ignored.
func text(v any) string {
	s, _ := v.(string)
	return s
}

// statusFor returns the HTTP status of an error a source reported inside a
// 200 answer (one document of _bulk_get): the status it gave, else the one
// its error name stands for, else 502 so that an error we cannot classify is
// retried rather than treated as final.
func statusFor(name string, status int) int {
	if status >= 100 {
		return status
	}
	switch name {
	case "not_found":
		return http.StatusNotFound
	case "forbidden":
		return http.StatusForbidden
	case "unauthorized":
		return http.StatusUnauthorized
	case "bad_request":
		return http.StatusBadRequest
	case "conflict":
		return http.StatusConflict
	}
	return http.StatusBadGateway
}

// Bounds a LimitError names: the setting a person changes, or the rule the
// answer broke.
const (
	// BoundAnswerBytes is Options.MaxAnswerBytes (feed.max_answer_bytes).
	BoundAnswerBytes = "max_answer_bytes"
	// BoundMultipartDepth is the one nested multipart level a _bulk_get
	// answer may hold (a document with its attachments).
	BoundMultipartDepth = "multipart_depth"
)

// LimitError is an answer that breaks one of the client's bounds: more
// bytes than Options.MaxAnswerBytes before anything usable in it was whole,
// or multipart nested deeper than one level. It is not transient.
type LimitError struct {
	// Op is the operation: changes, bulk_get, get or all_docs.
	Op string
	// Bound is BoundAnswerBytes or BoundMultipartDepth.
	Bound string
	// Limit is the bound's value: bytes, or levels.
	Limit int64
	// Where says what was being read ("its first row", `document "a"`).
	Where string
}

func (e *LimitError) Error() string {
	var msg string
	switch e.Bound {
	case BoundAnswerBytes:
		msg = fmt.Sprintf("answer exceeds the limit of %d bytes (%s)", e.Limit, e.Bound)
	case BoundMultipartDepth:
		msg = fmt.Sprintf("multipart nested deeper than %d level (%s): a document's attachments are the only nesting a source sends", e.Limit, e.Bound)
	default:
		msg = fmt.Sprintf("answer breaks %s (%d)", e.Bound, e.Limit)
	}
	if e.Where != "" {
		msg += " in " + e.Where
	}
	return e.Op + ": " + msg
}

// transportError is a request that got no complete answer: the connection
// failed, was dropped, or the deadline passed.
type transportError struct {
	op  string
	err error
	// When the answer began but its body did not complete: the status, the
	// bytes that did arrive, and whether our own deadline cut it short.
	status   int
	partial  []byte // the answer's first bytes
	more     bool   // more arrived than partial holds
	deadline bool
}

func (e *transportError) Error() string { return e.op + ": " + e.err.Error() }
func (e *transportError) Unwrap() error { return e.err }

// Transient reports whether err is worth retrying later, with the same
// request:
//
//   - true: connection errors, dropped connections, timeouts (the client's
//     deadline or the caller's), 5xx, 408 and 429;
//   - true: ErrMalformed. A source does not answer 200 with broken JSON on
//     purpose; it is nearly always a body cut short by a proxy, load
//     balancer or restart, and the next attempt gets a whole one. The error
//     still says "malformed response" so that a source that keeps doing it
//     is visible;
//   - false: a *LimitError (the same request gets the same answer: a
//     person raises the limit or fixes the source);
//   - false: 3xx, 400, 401, 403, 404 and every other 4xx (bad URL, bad
//     credentials, missing database: a person must act), a certificate the
//     client does not trust (unknown authority, wrong host name, expired: a
//     person must fix the CA bundle or the URL), a cancelled context (the
//     caller gave up), invalid arguments, and nil.
func Transient(err error) bool {
	var le *LimitError
	if err == nil || errors.Is(err, context.Canceled) || untrusted(err) || errors.As(err, &le) {
		return false
	}
	var mt *transientError
	if errors.As(err, &mt) {
		return true
	}
	var se *StatusError
	if errors.As(err, &se) {
		return se.Transient()
	}
	var te *transportError
	var ne net.Error
	return errors.Is(err, ErrMalformed) || errors.As(err, &te) ||
		errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne)
}

// untrusted reports whether err is the failure to verify the source's
// certificate.
func untrusted(err error) bool {
	var cve *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	return errors.As(err, &cve) || errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid)
}

// transientError marks a failure outside the source (say, of a stage that
// runs with the fetch) as worth retrying.
type transientError struct{ err error }

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

// MarkTransient returns err such that Transient reports true for it (nil
// stays nil); errors.Is and errors.As still see err.
func MarkTransient(err error) error {
	if err == nil {
		return nil
	}
	return &transientError{err: err}
}
