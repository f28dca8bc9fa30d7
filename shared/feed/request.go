package feed

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/changes-worker/changes-worker/shared/docid"
)

const userAgent = "changes-worker"

// Accept headers. Sync Gateway answers _bulk_get only as multipart/mixed and
// refuses it with 406 to a request whose Accept names neither "multipart/"
// nor "*/*"; every other answer the client reads is JSON.
const (
	acceptJSON      = "application/json"
	acceptMultipart = "multipart/mixed, application/json;q=0.9"
)

// response is a complete 2xx answer.
type response struct {
	body        []byte
	contentType string
}

// endpoint returns the URL of path (already escaped) below the database.
func (c *Client) endpoint(path string, q url.Values) string {
	u := c.base + "/" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// docPath escapes a document id as one path segment, so that ids holding
// '/', '?', '#', '%', '+', spaces or any non-ASCII text, and ids made of dots
// ("." and ".."), reach the source intact. The '/' after _design and _local stays literal: CouchDB routes
// those prefixes by path segment.
func docPath(id string) string {
	for _, prefix := range []string{"_design/", "_local/"} {
		if rest, ok := strings.CutPrefix(id, prefix); ok && rest != "" {
			return prefix + docid.PathSegment(rest)
		}
	}
	return docid.PathSegment(id)
}

// roundTrip sends one request that accepts JSON and reads the whole answer,
// at most Options.MaxAnswerBytes, within timeout. A non-2xx answer is a
// *StatusError; an answer over the limit a *LimitError; a failure to get a
// complete answer a *transportError.
func (c *Client) roundTrip(parent context.Context, op, method, target string, body []byte, timeout time.Duration) (*response, error) {
	st, err := c.open(parent, op, method, target, acceptJSON, body, timeout)
	if err != nil {
		return nil, err
	}
	defer st.close()
	b, err := io.ReadAll(st.body)
	if err != nil {
		return nil, st.fail(err, "")
	}
	return &response{body: b, contentType: st.contentType}, nil
}

// stream is a 2xx answer being read. Its body yields at most
// Options.MaxAnswerBytes; close ends the request, read to its end or not.
type stream struct {
	op          string
	status      int
	contentType string
	timeout     time.Duration
	body        *boundedReader
	own         func() bool // our deadline, not the caller's context, ended the request
	close       func()
}

// fail turns an error met while reading the body into the error to report:
// a *LimitError when the body went past the limit (where names what was
// being read), otherwise a *transportError that keeps how the answer began.
// Errors that are neither (a decoder's syntax error) come back as they are.
func (s *stream) fail(err error, where string) error {
	if s.body.over {
		return &LimitError{Op: s.op, Bound: BoundAnswerBytes, Limit: s.body.limit, Where: where}
	}
	if s.body.err == nil {
		return err
	}
	err = s.body.err // what the decoder met after it is its consequence
	te := &transportError{op: s.op, status: s.status, partial: s.body.head, more: s.body.n > int64(len(s.body.head)), deadline: s.own()}
	if te.deadline {
		err = fmt.Errorf("answer not complete within %s: %w", s.timeout, err)
	}
	te.err = fmt.Errorf("read answer (status %d): %w", s.status, err)
	return te
}

// open sends one request with the given Accept header and returns its 2xx
// answer for reading, within timeout. A non-2xx answer is a *StatusError
// (its body read up to errorBodyMax); no answer at all a *transportError.
func (c *Client) open(parent context.Context, op, method, target, accept string, body []byte, timeout time.Duration) (*stream, error) {
	ctx, cancel := context.WithTimeout(parent, timeout)
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("%s: build request: %w", op, err)
	}
	c.header(req, accept, body != nil)
	// own says whether our deadline, not the caller's context, ended the request.
	own := func() bool { return parent.Err() == nil && ctx.Err() != nil }
	start := time.Now()
	// ended tells OnRequest of the request once it is over: when its answer
	// has been read (or given up), not when it began.
	ended := func(status int) {
		if c.o.OnRequest != nil {
			c.o.OnRequest(op, status, time.Since(start))
		}
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		ownDeadline := own()
		cancel()
		ended(0)
		if ownDeadline {
			err = fmt.Errorf("no answer within %s: %w", timeout, err)
		}
		return nil, &transportError{op: op, err: err, deadline: ownDeadline}
	}
	st := &stream{
		op: op, status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), timeout: timeout,
		body: &boundedReader{r: resp.Body, limit: c.o.MaxAnswerBytes},
		own:  own,
		close: sync.OnceFunc(func() {
			resp.Body.Close()
			cancel()
			ended(resp.StatusCode)
		}),
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer st.close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, errorBodyMax))
		if err != nil {
			return nil, st.fail(err, "")
		}
		return nil, newStatusError(op, resp.StatusCode, b)
	}
	return st, nil
}

// errorBodyMax bounds what is read of a non-2xx answer: its error and
// reason fields are all that is kept.
const errorBodyMax = 64 << 10

// headMax is how much of an answer's beginning a stream keeps, to tell an
// idle long-poll (see idle) from one cut off in the middle.
const headMax = 256

// boundedReader reads an answer's body up to limit bytes: reading past it
// fails with errOverLimit (and sets over). It keeps the first headMax bytes
// and the first read error, which every later read returns again. Not safe
// for concurrent use.
type boundedReader struct {
	r     io.Reader
	limit int64
	n     int64 // bytes read
	head  []byte
	over  bool
	err   error // the underlying reader's first error other than io.EOF
}

// errOverLimit is what a boundedReader returns past its limit.
var errOverLimit = errors.New("answer over its byte limit")

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.over {
		return 0, errOverLimit
	}
	if b.err != nil {
		return 0, b.err
	}
	if left := b.limit - b.n + 1; int64(len(p)) > left {
		p = p[:left] // one byte past the limit tells "over" from "exactly"
	}
	n, err := b.r.Read(p)
	b.n += int64(n)
	if len(b.head) < headMax {
		b.head = append(b.head, p[:min(n, headMax-len(b.head))]...)
	}
	if b.n > b.limit {
		b.over = true
		return n - int(b.n-b.limit), errOverLimit
	}
	if err != nil && !errors.Is(err, io.EOF) && b.err == nil {
		b.err = err
	}
	return n, err
}

// malformed wraps ErrMalformed with the operation and what was wrong.
func malformed(op string, format string, args ...any) error {
	return fmt.Errorf("%s: %w: %s", op, ErrMalformed, fmt.Sprintf(format, args...))
}

// header sets the headers every request carries: Accept, User-Agent, the
// credentials, and Content-Type when there is a JSON body.
func (c *Client) header(req *http.Request, accept string, jsonBody bool) {
	req.Header.Set("Accept", accept)
	if jsonBody {
		req.Header.Set("Content-Type", "application/json")
	}
	c.identify(req.Header)
}

// identify sets User-Agent and the credentials (a session's cookie is set
// by the client's transport, see session).
func (c *Client) identify(h http.Header) {
	h.Set("User-Agent", userAgent)
	switch {
	case c.o.Token != "":
		h.Set("Authorization", "Bearer "+c.o.Token)
	case c.o.Username != "" && !c.o.Session:
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(c.o.Username+":"+c.o.Password)))
	}
}
