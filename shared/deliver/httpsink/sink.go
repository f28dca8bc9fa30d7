// Package httpsink delivers document changes to a REST endpoint: the document
// JSON with PUT (default), POST or PATCH for a live document, DELETE for a
// tombstone, to a URL built from a template holding {doc_id}.
//
// HTTP cannot enforce monotonic application by itself: the sink cannot ask an
// arbitrary endpoint which version it holds. It sends every change's
// observation version instead (X-Changes-Version: generation.counter) with an
// Idempotency-Key, so a receiver can drop what is not newer than what it has.
// That is also why HTTP outputs default to ordering per_document: a FIFO
// queue grouped by document delivers each document's changes in the order
// they were observed, so even a receiver that ignores the headers ends at the
// newest state. With ordering none (a standard queue) changes can arrive
// duplicated and out of order, and the endpoint must be idempotent and
// compare versions itself.
package httpsink

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/docid"
)

var _ deliver.Sink = (*Sink)(nil)

// Headers the sink sets on every request.
const (
	HeaderRev            = "X-Changes-Rev"
	HeaderSeq            = "X-Changes-Seq"
	HeaderVersion        = "X-Changes-Version"
	HeaderJob            = "X-Changes-Job"
	HeaderOutput         = "X-Changes-Output"
	HeaderIdempotencyKey = "Idempotency-Key"
)

const (
	// DefaultTimeout bounds one request when the output sets no timeout.
	DefaultTimeout = 10 * time.Second
	// Parallelism is how many requests one Apply has in flight at most.
	Parallelism = 8
	// maxRedirects bounds followed redirects (FollowRedirects).
	maxRedirects = 10
	// drainLimit is how much of a response body is read to reuse the connection.
	drainLimit = 64 << 10
)

// Credentials are the resolved secrets of the output: Username and Password
// for basic auth (Username defaults to the configured one), Token for bearer
// auth, the values of the headers given by reference (by configured name)
// and the value of url_secret. They never appear in logs, errors or
// formatted output.
type Credentials struct {
	Username  string
	Password  string
	Token     string
	Headers   map[string]string
	URLSecret string
}

// String redacts the credentials, so %v and %+v never print them.
func (Credentials) String() string { return "httpsink.Credentials{redacted}" }

// GoString redacts the credentials for %#v.
func (c Credentials) GoString() string { return c.String() }

// LogValue redacts the credentials in slog output.
func (Credentials) LogValue() slog.Value { return slog.StringValue("redacted") }

// Sink sends changes to one HTTP output. It is safe for concurrent use.
type Sink struct {
	client  *http.Client
	method  string
	base    url.URL // scheme and host of the template
	path    string  // escaped path template, may hold {doc_id}; {secret} filled in
	query   string  // raw query template, may hold {doc_id}; {secret} filled in
	display string  // the template without its query, for errors
	headers http.Header
	auth    func(*http.Request)
	timeout time.Duration
}

// reserved are headers the sink owns; configuration may not set them.
var reserved = []string{
	"Authorization", "Host", "Content-Length", "Transfer-Encoding",
	HeaderRev, HeaderSeq, HeaderVersion, HeaderJob, HeaderOutput, HeaderIdempotencyKey,
}

// New returns a sink for out. creds are the already resolved secrets of
// out.Auth (zero when out.Auth is nil). client may be nil for a default
// client; New does not modify it but uses a copy whose redirect policy
// follows out.FollowRedirects.
func New(out config.HTTPOutput, creds Credentials, client *http.Client) (*Sink, error) {
	s := &Sink{
		method:  strings.ToUpper(out.Method),
		headers: http.Header{},
		timeout: out.Timeout.D(),
	}
	if s.method == "" {
		s.method = http.MethodPut
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	var errs []error
	switch s.method {
	case http.MethodPut, http.MethodPost, http.MethodPatch:
	default:
		errs = append(errs, fmt.Errorf("method %q is not PUT, POST or PATCH", out.Method))
	}
	if err := s.parseTemplate(out.URL, out.URLSecret != nil, creds.URLSecret); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, s.setHeaders(out.Headers, creds.Headers)...)
	auth, err := authFunc(out.Auth, creds)
	if err != nil {
		errs = append(errs, err)
	}
	s.auth = auth
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new http sink: %w", err)
	}

	if client == nil {
		client = &http.Client{}
	}
	c := *client
	c.CheckRedirect = checkRedirect(out.FollowRedirects)
	s.client = &c
	return s, nil
}

// parseTemplate splits the URL template into scheme and host, an escaped path
// and a raw query, checks that {doc_id} and {secret} only occur in path and
// query, and fills in {secret}: as it is in the path (where it must be
// percent-encoded and hold no "." or ".." segment), query-escaped in the
// query. hasRef says whether the output has a url_secret. Errors quote the
// template, which holds no secret, never the secret.
func (s *Sink) parseTemplate(tmpl string, hasRef bool, secret string) error {
	if tmpl == "" {
		return errors.New("url is empty")
	}
	shown, quotable := config.ShownURL(tmpl)
	if !quotable {
		return errors.New("url template must start with http:// or https:// (the template is not shown: it does not start with a scheme and \"://\")")
	}
	rest, _, hasFrag := strings.Cut(tmpl, "#")
	if hasFrag {
		return fmt.Errorf("url template %q must not have a fragment (#...)", shown)
	}
	rest, query, _ := strings.Cut(rest, "?")
	scheme, afterScheme, ok := strings.Cut(rest, "://")
	if !ok || (scheme != "http" && scheme != "https") {
		return fmt.Errorf("url template %q must start with http:// or https://", shown)
	}
	host, path, _ := strings.Cut(afterScheme, "/")
	path = "/" + path
	switch {
	case host == "" || strings.Contains(host, "{doc_id}") || strings.Contains(host, "{secret}"):
		return fmt.Errorf("url template %q must name a host, and {doc_id} and {secret} may only appear in the path or query", shown)
	case strings.Contains(tmpl, "@"):
		// Anywhere, not only in the host: a password may hold a '/' or '?'.
		return errors.New("url template must not contain credentials (an '@'); use auth with a secret reference")
	}
	placeholders := strings.NewReplacer("{doc_id}", "x", "{secret}", "x")
	// Check the template parses once an id is in place.
	u, err := url.Parse(scheme + "://" + host + placeholders.Replace(path) + "?" + placeholders.Replace(query))
	if err != nil {
		// The *url.Error quotes the whole URL, query included.
		return fmt.Errorf("url template %q does not parse", shown)
	}
	if want := placeholders.Replace(path); u.EscapedPath() != want {
		return fmt.Errorf("url template path %q must be percent-encoded (as %q)", want, u.EscapedPath())
	}
	if hasDotSegment(path) {
		// A client, proxy or server may resolve it: the request would go
		// elsewhere than the template says.
		return fmt.Errorf(`url template path %q must not have a "." or ".." segment`, path)
	}
	s.base = url.URL{Scheme: u.Scheme, Host: u.Host}
	s.display = scheme + "://" + host + path

	hasPlaceholder := strings.Contains(path+query, "{secret}")
	switch {
	case hasPlaceholder && !hasRef:
		return errors.New("url template: {secret} needs url_secret")
	case !hasPlaceholder && hasRef:
		return errors.New("url template: url_secret is set but the template has no {secret}")
	case hasRef && secret == "":
		return errors.New("url template: url_secret is not resolved")
	case strings.Contains(path, "{secret}") && !pathSafe(secret):
		return errors.New("url template: url_secret in the path must be percent-encoded, with no '?', '#', \".\" or \"..\" segment")
	}
	s.path = strings.ReplaceAll(path, "{secret}", secret)
	s.query = strings.ReplaceAll(query, "{secret}", url.QueryEscape(secret))
	return nil
}

// pathSafe reports whether p can stand in a URL path as it is: only
// unreserved characters, sub-delimiters, ':', '@', '/' and valid %XX
// escapes, and no "." or ".." segment.
func pathSafe(p string) bool {
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', strings.IndexByte("-._~!$&'()*+,;=:@/", c) >= 0:
		case c == '%' && i+2 < len(p) && isHex(p[i+1]) && isHex(p[i+2]):
			i += 2
		default:
			return false
		}
	}
	return !hasDotSegment(p)
}

// hasDotSegment reports whether the path p has a "." or ".." segment.
func hasDotSegment(p string) bool {
	return slices.ContainsFunc(strings.Split(p, "/"), func(seg string) bool { return seg == "." || seg == ".." })
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// setHeaders sets the configured headers: literal values as they are,
// references from resolved. Errors name the header, never its value.
func (s *Sink) setHeaders(conf map[string]config.HeaderValue, resolved map[string]string) []error {
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(conf)) {
		hv := conf[k]
		if slices.ContainsFunc(reserved, func(r string) bool { return strings.EqualFold(r, k) }) {
			errs = append(errs, fmt.Errorf("header %s is set by the sink and cannot be configured", k))
			continue
		}
		val := hv.Value
		if hv.Ref != nil {
			v, ok := resolved[k]
			if !ok || v == "" {
				errs = append(errs, fmt.Errorf("header %s: its secret reference is not resolved", k))
				continue
			}
			val = v
		}
		if strings.ContainsFunc(val, func(r rune) bool { return (r < 0x20 && r != '\t') || r == 0x7f }) {
			what := "value"
			if hv.Ref != nil {
				what = "resolved value"
			}
			errs = append(errs, fmt.Errorf("header %s: the %s holds control characters", k, what))
			continue
		}
		s.headers.Set(k, val)
	}
	for _, k := range slices.Sorted(maps.Keys(resolved)) {
		if hv, ok := conf[k]; !ok || hv.Ref == nil {
			errs = append(errs, fmt.Errorf("header %s: a resolved value was given for a header that is not a secret reference", k))
		}
	}
	return errs
}

func authFunc(a *config.Auth, creds Credentials) (func(*http.Request), error) {
	if a == nil {
		if creds.Username != "" || creds.Password != "" || creds.Token != "" {
			return nil, errors.New("credentials given for an output without auth")
		}
		return func(*http.Request) {}, nil
	}
	switch a.Type {
	case "basic":
		user := creds.Username
		if user == "" {
			user = a.Username
		}
		if user == "" || creds.Password == "" {
			return nil, errors.New("basic auth needs a username and a resolved password")
		}
		return func(r *http.Request) { r.SetBasicAuth(user, creds.Password) }, nil
	case "bearer":
		if creds.Token == "" {
			return nil, errors.New("bearer auth needs a resolved token")
		}
		return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+creds.Token) }, nil
	default:
		return nil, fmt.Errorf("auth type %q is not basic or bearer", a.Type)
	}
}

// errOffOrigin marks a redirect to another scheme, host or port.
var errOffOrigin = errors.New("follow_redirects follows only to the same scheme, host and port")

// checkRedirect never follows a redirect unless follow is set, so the 3xx
// comes back as the response (and fails permanently). When following, only
// 307 and 308 are followed: Go turns a PUT redirected by 301, 302 or 303
// into a GET, whose 200 would pass for a delivery that never happened. And
// only to the origin of the first request (same scheme, host and port):
// Go keeps custom headers and the body on any redirect, and Authorization
// on a change of scheme or port, so elsewhere would receive them.
func checkRedirect(follow bool) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if !follow || len(via) >= maxRedirects {
			return http.ErrUseLastResponse
		}
		if req.Response != nil && req.Response.StatusCode != http.StatusTemporaryRedirect && req.Response.StatusCode != http.StatusPermanentRedirect {
			return http.ErrUseLastResponse
		}
		if origin(req.URL) != origin(via[0].URL) {
			return fmt.Errorf("redirect to %s refused: %w", origin(req.URL), errOffOrigin)
		}
		return nil
	}
}

// origin returns scheme://host:port of u, lowercase, with the scheme's
// default port made explicit.
func origin(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// EscapeID returns the document id as one URL path segment
// (docid.PathSegment): '/', '?', '#', '%', '+' and every non-ASCII byte are
// escaped, and each dot of an id made only of dots is written %2E. An escaped
// dot still means a dot (RFC 3986 §6.2.2.2), so URL refuses an id that would
// make a whole segment "." or "..".
func EscapeID(id string) string { return docid.PathSegment(id) }

// ErrDotSegment is wrapped by URL's error for a document id that would make
// a whole path segment "." or "..": a server or proxy that normalises the
// path would resolve it and reach the collection or its parent instead of
// the document. Such a change fails permanently (reason dot_segment_id).
var ErrDotSegment = errors.New(`makes a "." or ".." path segment, which servers resolve as a relative reference`)

// URL returns the URL a change of docID is sent to. The id is path-escaped
// in the path (kept escaped on the wire through URL.RawPath) and
// query-escaped in the query. An id that would make a path segment "." or
// ".." is refused (ErrDotSegment).
func (s *Sink) URL(docID string) (*url.URL, error) {
	if docID != "" && strings.Trim(docID, ".") == "" {
		for seg := range strings.SplitSeq(s.path, "/") {
			if !strings.Contains(seg, "{doc_id}") {
				continue
			}
			// Template segments decode (New checked), and so does the id's
			// escaping: seg's own characters around {doc_id} stay as they are.
			got, err := url.PathUnescape(strings.ReplaceAll(seg, "{doc_id}", EscapeID(docID)))
			if err == nil && (got == "." || got == "..") {
				return nil, fmt.Errorf("build url for %s: document id %q %w", s.display, docID, ErrDotSegment)
			}
		}
	}
	u := s.base
	u.RawPath = strings.ReplaceAll(s.path, "{doc_id}", EscapeID(docID))
	p, err := url.PathUnescape(u.RawPath)
	if err != nil {
		// Neither the built path nor the unescape error (which quotes part
		// of it) is shown: the path may hold the url_secret.
		return nil, fmt.Errorf("build url for %s: the escaped path does not decode", s.display)
	}
	u.Path = p
	if u.EscapedPath() != u.RawPath {
		// Cannot happen with a template New accepted; never send to a path
		// Go re-escaped differently.
		return nil, fmt.Errorf("build url for %s: the path does not keep its escaping", s.display)
	}
	u.RawQuery = strings.ReplaceAll(s.query, "{doc_id}", url.QueryEscape(docID))
	return &u, nil
}

// Apply sends each change as one request and returns one error per change:
// nil for a 2xx answer (and for 404 or 410 to a DELETE: already gone), a
// transient *deliver.Error for connection errors, timeouts, 408, 425, 429
// and 5xx, a permanent one for other statuses including unfollowed 3xx.
// Errors carry the status, never the response body.
//
// Requests run in parallel, at most Parallelism at once; changes of one
// document (possible only with ordering none) are sent one after another,
// oldest version first. Apply is safe for concurrent use; it is idempotent
// only as far as the endpoint is.
func (s *Sink) Apply(ctx context.Context, changes []*change.Envelope) []error {
	return deliver.EachDocument(ctx, changes, Parallelism, deliver.CheckChange, s.send)
}

// send delivers one change.
func (s *Sink) send(ctx context.Context, c *change.Envelope) error {
	if err := ctx.Err(); err != nil {
		return deliver.TransientError("timeout", fmt.Errorf("send change %s: %w", c.DocID, err))
	}
	reqCtx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := s.request(reqCtx, c)
	if errors.Is(err, ErrDotSegment) {
		return deliver.PermanentError("dot_segment_id", err)
	}
	if err != nil {
		return deliver.PermanentError("invalid_change", err)
	}
	// The template, not the URL built from it: the path may hold a secret.
	where := req.Method + " " + s.display

	resp, err := s.client.Do(req)
	if errors.Is(err, errOffOrigin) && resp != nil {
		resp.Body.Close()
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return &deliver.Error{
			Class:      deliver.Permanent,
			Reason:     "redirect_refused",
			HTTPStatus: resp.StatusCode,
			Err:        fmt.Errorf("send change: %s: status %d: %w", where, resp.StatusCode, err),
		}
	}
	if err != nil {
		// *url.Error prints the whole URL; its query may hold an API key.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		err = fmt.Errorf("send change: %s: %w", where, err)
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || reqCtx.Err() != nil {
			return deliver.TransientError("timeout", err)
		}
		return deliver.TransientError("connection", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))

	status := resp.StatusCode
	if req.Method == http.MethodDelete && (status == http.StatusNotFound || status == http.StatusGone) {
		return nil
	}
	class := deliver.HTTPStatusClass(status)
	if class == "" {
		return nil
	}
	e := &deliver.Error{
		Class:      class,
		Reason:     "http_status",
		HTTPStatus: status,
		Err:        fmt.Errorf("send change: %s: status %d", where, status),
	}
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		// The endpoint asks us to slow down: the writer pauses the output
		// instead of counting the attempt toward the DLQ.
		e.Backpressure = true
		e.RetryAfter = deliver.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	}
	return e
}

// request builds the request of one change.
func (s *Sink) request(ctx context.Context, c *change.Envelope) (*http.Request, error) {
	u, err := s.URL(c.DocID)
	if err != nil {
		return nil, err
	}
	method, body := s.method, io.Reader(nil)
	if c.Tombstone() {
		method = http.MethodDelete
	} else {
		body = bytes.NewReader(c.Doc)
	}
	req, err := http.NewRequestWithContext(ctx, method, "", body)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.URL = u
	req.Host = u.Host
	for k, vals := range s.headers {
		req.Header[k] = slices.Clone(vals)
	}
	if !c.Tombstone() && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set(HeaderRev, headerValue(c.Rev))
	req.Header.Set(HeaderSeq, headerValue(c.SeqText()))
	req.Header.Set(HeaderVersion, c.Version.String())
	req.Header.Set(HeaderJob, headerValue(c.Job))
	req.Header.Set(HeaderOutput, headerValue(c.Output))
	req.Header.Set(HeaderIdempotencyKey, IdempotencyKey(c))
	s.auth(req)
	return req, nil
}

// IdempotencyKey identifies one change of one document for one output: the
// hex SHA-256 of job, output, document id and version. A redelivery carries
// the same key; any other change of the document a different one.
func IdempotencyKey(c *change.Envelope) string {
	h := sha256.New()
	for _, part := range []string{c.Job, c.Output, c.DocID, strconv.FormatInt(c.Generation, 10), strconv.FormatInt(c.Counter, 10)} {
		// Length-prefixed, so no two different tuples hash the same input.
		fmt.Fprintf(h, "%d:%s;", len(part), part)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// headerValue makes s safe as a header value: control characters (which
// could split headers) and non-ASCII are written as \u escapes.
func headerValue(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r >= 0x7f }) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if r < 0x20 || r >= 0x7f {
			if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
				fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
