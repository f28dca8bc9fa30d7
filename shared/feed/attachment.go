package feed

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/changes-worker/changes-worker/shared/docid"
)

// Attachment opens the content of one attachment of a revision:
// GET {url}/{id}/{name}?rev=REV, asking for gzip. The answer is streamed:
// the caller reads it and must close it. encoding is the answer's
// Content-Encoding ("" for none): "gzip" when the source sends the bytes it
// stores compressed (CouchDB's digest of such an attachment is of those
// bytes). The client never decompresses by itself, so that the bytes read
// are the bytes sent and the caller's bounds on them hold: it is the caller
// that decodes, with a bound of its own.
//
// A missing document, revision or attachment is a *StatusError matching
// ErrNotFound. No timeout of its own: the body can be large, so the caller's
// context bounds the whole transfer. A failure while reading the body is
// transient (see Transient); a body that ends before its Content-Length (a
// connection cut) is such a failure, never a plain end. Safe for concurrent
// use.
func (c *Client) Attachment(ctx context.Context, id, rev, name string) (body io.ReadCloser, encoding string, err error) {
	const op = "get attachment"
	var q url.Values
	if rev != "" {
		q = url.Values{"rev": {rev}}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.endpoint(docPath(id)+"/"+docid.PathSegment(name), q), nil)
	if err != nil {
		return nil, "", fmt.Errorf("%s: build request: %w", op, err)
	}
	req.Header.Set("Accept", "*/*")
	// Setting the header also turns off the HTTP client's own gzip.
	req.Header.Set("Accept-Encoding", "gzip")
	c.identify(req.Header)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, "", &transportError{op: op, err: err}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, "", newStatusError(op, resp.StatusCode, b)
	}
	encoding = strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding")))
	if encoding == "identity" {
		encoding = ""
	}
	return &attachmentBody{rc: resp.Body, op: op}, encoding, nil
}

// attachmentBody classifies read failures as transport errors.
type attachmentBody struct {
	rc io.ReadCloser
	op string
}

func (b *attachmentBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF {
		return n, &transportError{op: b.op, err: fmt.Errorf("read body: %w", err)}
	}
	return n, err
}

func (b *attachmentBody) Close() error { return b.rc.Close() }
