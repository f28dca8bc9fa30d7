package feed

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/changes-worker/changes-worker/shared/docid"
)

// Attachment opens the content of one attachment of a revision:
// GET {url}/{id}/{name}?rev=REV. The answer is streamed: the caller reads it
// and must close it. The content is asked for without a Content-Encoding (a
// source that stores it compressed sends it decoded), so that the bytes read
// are the bytes sent and the caller's bound on them holds: no small
// compressed answer inflates past it in the HTTP client.
//
// A missing document, revision or attachment is a *StatusError matching
// ErrNotFound. No timeout of its own: the body can be large, so the caller's
// context bounds the whole transfer. A failure while reading the body is
// transient (see Transient). Safe for concurrent use.
func (c *Client) Attachment(ctx context.Context, id, rev, name string) (io.ReadCloser, error) {
	const op = "get attachment"
	var q url.Values
	if rev != "" {
		q = url.Values{"rev": {rev}}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.endpoint(docPath(id)+"/"+docid.PathSegment(name), q), nil)
	if err != nil {
		return nil, fmt.Errorf("%s: build request: %w", op, err)
	}
	req.Header.Set("Accept", "*/*")
	// Setting the header also turns off the HTTP client's own gzip.
	req.Header.Set("Accept-Encoding", "identity")
	c.identify(req.Header)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, &transportError{op: op, err: err}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, newStatusError(op, resp.StatusCode, b)
	}
	return &attachmentBody{rc: resp.Body, op: op}, nil
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
