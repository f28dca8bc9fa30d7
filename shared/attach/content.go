package attach

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"hash"
	"io"
)

// content reads one attachment's bytes within bounds and checks them
// against its entry: the length of the content, and the digest, which may
// be of the content or, for an answer the source sends compressed (gzip:
// CouchDB's digest of an attachment it stores compressed), of the bytes
// sent. Bytes that match the digest in neither form are never stored.
type content struct {
	a         *attachment
	encoding  string // the answer's Content-Encoding: "" or "gzip"
	maxBytes  int64
	bound     int64 // content bytes that may be read (one more tells it is longer)
	wireBound int64 // compressed bytes that may be read
	plain     int64 // content bytes read
	wire      int64 // compressed bytes read
	plainHash hash.Hash
	wireHash  hash.Hash
}

func newContent(a *attachment, encoding string, maxBytes int64) *content {
	c := &content{a: a, encoding: encoding, maxBytes: maxBytes, bound: maxBytes}
	if a.length >= 0 {
		c.bound = a.length
	}
	// Compressing adds at most a few bytes per block to content that does
	// not compress, and a header.
	c.wireBound = c.bound + c.bound/8 + 64<<10
	return c
}

// reader returns the content read from body: at most bound+1 bytes of it,
// counted and hashed, decoded when the answer is compressed (its
// compressed bytes are bounded, counted and hashed too). A compressed
// answer that does not decode is content that does not match (ErrContent);
// body's own errors come back as they are.
func (c *content) reader(body io.Reader) (io.Reader, error) {
	h := digests[c.a.algo].newHash
	c.plainHash = h()
	var r io.Reader
	switch c.encoding {
	case "":
		r = body
	case "gzip":
		c.wireHash = h()
		wire := io.TeeReader(&counter{r: io.LimitReader(body, c.wireBound+1), n: &c.wire}, c.wireHash)
		zr, err := gzip.NewReader(wire)
		if err != nil {
			return nil, c.decodeFailed(err)
		}
		r = &decoder{c: c, r: zr}
	default:
		return nil, fmt.Errorf("%w: the source sent it with Content-Encoding %q", ErrContent, c.encoding)
	}
	return io.TeeReader(&counter{r: io.LimitReader(r, c.bound+1), n: &c.plain}, c.plainHash), nil
}

// decoder is a gzip reader whose format errors are ErrContent.
type decoder struct {
	c *content
	r io.Reader
}

func (d *decoder) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if err != nil && err != io.EOF {
		err = d.c.decodeFailed(err)
	}
	return n, err
}

// decodeFailed: a failure to read the body stays what it is; anything else
// the gzip reader says (a bad header or checksum, corrupt data, a stream
// that ends early) is about the content.
func (c *content) decodeFailed(err error) error {
	var re *sourceError
	if errors.As(err, &re) {
		return err
	}
	if c.wire > c.wireBound {
		return fmt.Errorf("%w: more than %d compressed bytes", ErrContent, c.wireBound)
	}
	return fmt.Errorf("%w: the compressed answer does not decode: %v", ErrContent, err)
}

// check runs once the content has been read to its end.
func (c *content) check() error {
	a := c.a
	if a.length >= 0 && c.plain != a.length {
		return fmt.Errorf("%w: %d bytes read, the entry says %d", ErrContent, c.plain, a.length)
	}
	if a.length < 0 && c.plain > c.maxBytes {
		return fmt.Errorf("%w: more than max_bytes %d", ErrContent, c.maxBytes)
	}
	if c.wire > c.wireBound {
		return fmt.Errorf("%w: more than %d compressed bytes", ErrContent, c.wireBound)
	}
	if bytes.Equal(c.plainHash.Sum(nil), a.sum) || (c.wireHash != nil && bytes.Equal(c.wireHash.Sum(nil), a.sum)) {
		return nil
	}
	return fmt.Errorf("%w: digest is not %s", ErrContent, a.digest)
}

// counter counts the bytes read through it.
type counter struct {
	r io.Reader
	n *int64
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	*c.n += int64(n)
	return n, err
}
