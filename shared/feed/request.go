package feed

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/changes-worker/changes-worker/shared/docid"
)

const userAgent = "changes-worker"

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

// roundTrip sends one request and reads the whole answer within timeout. A
// non-2xx answer is a *StatusError; a failure to get a complete answer is a
// *transportError.
func (c *Client) roundTrip(parent context.Context, op, method, target string, body []byte, timeout time.Duration) (*response, error) {
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return nil, fmt.Errorf("%s: build request: %w", op, err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", userAgent)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	switch {
	case c.o.Token != "":
		req.Header.Set("Authorization", "Bearer "+c.o.Token)
	case c.o.Username != "":
		req.SetBasicAuth(c.o.Username, c.o.Password)
	}
	// own says whether our deadline, not the caller's context, ended the request.
	own := func() bool { return parent.Err() == nil && ctx.Err() != nil }
	resp, err := c.hc.Do(req)
	if err != nil {
		if own() {
			err = fmt.Errorf("no answer within %s: %w", timeout, err)
		}
		return nil, &transportError{op: op, err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		te := &transportError{op: op, status: resp.StatusCode, partial: b, deadline: own()}
		if te.deadline {
			err = fmt.Errorf("answer not complete within %s: %w", timeout, err)
		}
		te.err = fmt.Errorf("read answer (status %d): %w", resp.StatusCode, err)
		return nil, te
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, newStatusError(op, resp.StatusCode, b)
	}
	return &response{body: b, contentType: resp.Header.Get("Content-Type")}, nil
}

// malformed wraps ErrMalformed with the operation and what was wrong.
func malformed(op string, format string, args ...any) error {
	return fmt.Errorf("%s: %w: %s", op, ErrMalformed, fmt.Sprintf(format, args...))
}
