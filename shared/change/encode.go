package change

import (
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// AppendJSON appends the envelope's JSON to b: the bytes json.Marshal
// writes for it (TestAppendJSONMatchesMarshal and FuzzAppendJSON hold it to
// that), without reflection and with one pass over each raw value. Seq and
// Doc are written compacted, with <, >, &, U+2028 and U+2029 escaped, and
// must each be one JSON value; a nil Seq is written null, an empty Doc is
// left out. It fails as json.Marshal does: on a raw value that is not JSON,
// or an EnqueuedAt that RFC 3339 cannot write (a year outside 0 to 9999).
// On an error, b comes back as it was given.
func (e *Envelope) AppendJSON(b []byte) ([]byte, error) {
	in := len(b)
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(e.V), 10)
	b = append(b, `,"job":`...)
	b = AppendJSONString(b, e.Job)
	b = append(b, `,"output":`...)
	b = AppendJSONString(b, e.Output)
	b = append(b, `,"doc_id":`...)
	b = AppendJSONString(b, e.DocID)
	b = append(b, `,"rev":`...)
	b = AppendJSONString(b, e.Rev)
	b = append(b, `,"seq":`...)
	var err error
	if e.Seq == nil {
		b = append(b, "null"...)
	} else if b, err = appendRaw(b, e.Seq); err != nil {
		return b[:in], fmt.Errorf("encode seq: %w", err)
	}
	if e.Deleted {
		b = append(b, `,"deleted":true`...)
	}
	if e.Removed {
		b = append(b, `,"removed":true`...)
	}
	b = append(b, `,"generation":`...)
	b = strconv.AppendInt(b, e.Generation, 10)
	b = append(b, `,"counter":`...)
	b = strconv.AppendInt(b, e.Counter, 10)
	b = append(b, `,"enqueued_at":"`...)
	t, err := e.EnqueuedAt.AppendText(b)
	if err != nil {
		return b[:in], fmt.Errorf("encode enqueued_at: %w", err)
	}
	b = append(t, '"')
	if len(e.Doc) > 0 {
		b = append(b, `,"doc":`...)
		if b, err = appendRaw(b, e.Doc); err != nil {
			return b[:in], fmt.Errorf("encode doc: %w", err)
		}
	}
	if r := e.DocRef; r != nil {
		b = append(b, `,"doc_ref":{"bucket":`...)
		b = AppendJSONString(b, r.Bucket)
		b = append(b, `,"key":`...)
		b = AppendJSONString(b, r.Key)
		b = append(b, `,"size":`...)
		b = strconv.AppendInt(b, r.Size, 10)
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

const hexDigits = "0123456789abcdef"

// plain marks the ASCII bytes a JSON string holds as they are: the
// printable ones but ", \ and the HTML characters <, > and &, which
// encoding/json escapes.
var plain = func() (t [utf8.RuneSelf]bool) {
	for c := byte(' '); c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// AppendJSONString appends s as a JSON string, escaped as encoding/json
// escapes it: ", \ and control characters; <, > and &; U+2028 and U+2029;
// and each byte of invalid UTF-8 as U+FFFD.
func AppendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	from := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if plain[c] {
				i++
				continue
			}
			b = append(b, s[from:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			from = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[from:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[from:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		from = i
	}
	b = append(b, s[from:]...)
	return append(b, '"')
}

// maxDepth is how deeply encoding/json lets arrays and objects nest.
const maxDepth = 10000

var errSyntax = errors.New("not one JSON value")

// appendRaw appends the JSON value raw as encoding/json writes a
// json.RawMessage: without the spaces between tokens, with <, >, &, U+2028
// and U+2029 escaped, and refused unless raw is exactly one JSON value
// (spaces around it aside).
func appendRaw(b, raw []byte) ([]byte, error) {
	c := compactor{src: raw, dst: b}
	c.space()
	if err := c.value(0); err != nil {
		return b, err
	}
	c.space()
	if c.i != len(raw) {
		return b, c.fail("data after the value")
	}
	return append(c.dst, raw[c.from:]...), nil
}

// compactor copies a JSON value from src to dst as it checks it: runs of
// bytes that stay as they are, src[from:i], are copied in one append when
// something in src must be left out or written otherwise.
type compactor struct {
	src, dst []byte
	i, from  int
}

func (c *compactor) fail(what string) error {
	return fmt.Errorf("%w: %s at offset %d", errSyntax, what, c.i)
}

// space skips the spaces at i, leaving them out of dst.
func (c *compactor) space() {
	j := c.i
	for j < len(c.src) && (c.src[j] == ' ' || c.src[j] == '\t' || c.src[j] == '\n' || c.src[j] == '\r') {
		j++
	}
	if j > c.i {
		c.dst = append(c.dst, c.src[c.from:c.i]...)
		c.i, c.from = j, j
	}
}

// next returns the byte at i, or 0 at the end.
func (c *compactor) next() byte {
	if c.i < len(c.src) {
		return c.src[c.i]
	}
	return 0
}

// value checks and copies the value at i, inside depth arrays and objects.
func (c *compactor) value(depth int) error {
	switch ch := c.next(); {
	case ch == '{' || ch == '[':
		return c.container(ch, depth+1)
	case ch == '"':
		return c.str()
	case ch == '-' || '0' <= ch && ch <= '9':
		return c.number()
	case ch == 't':
		return c.literal("true")
	case ch == 'f':
		return c.literal("false")
	case ch == 'n':
		return c.literal("null")
	case c.i >= len(c.src):
		return c.fail("unexpected end")
	}
	return c.fail("unexpected character")
}

func (c *compactor) literal(word string) error {
	if len(c.src)-c.i < len(word) || string(c.src[c.i:c.i+len(word)]) != word {
		return c.fail("bad literal")
	}
	c.i += len(word)
	return nil
}

// container checks an object or array, the depth-th one open.
func (c *compactor) container(open byte, depth int) error {
	if depth > maxDepth {
		return c.fail("nested too deeply")
	}
	closing := byte(']')
	if open == '{' {
		closing = '}'
	}
	c.i++
	c.space()
	if c.next() == closing {
		c.i++
		return nil
	}
	for {
		if open == '{' {
			if c.next() != '"' {
				return c.fail("expected a key")
			}
			if err := c.str(); err != nil {
				return err
			}
			c.space()
			if c.next() != ':' {
				return c.fail("expected ':'")
			}
			c.i++
			c.space()
		}
		if err := c.value(depth); err != nil {
			return err
		}
		c.space()
		switch c.next() {
		case ',':
			c.i++
			c.space()
		case closing:
			c.i++
			return nil
		default:
			return c.fail("expected ',' or '" + string(closing) + "'")
		}
	}
}

// number checks -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?.
func (c *compactor) number() error {
	digits := func() int {
		start := c.i
		for c.i < len(c.src) && '0' <= c.src[c.i] && c.src[c.i] <= '9' {
			c.i++
		}
		return c.i - start
	}
	if c.next() == '-' {
		c.i++
	}
	switch {
	case c.next() == '0':
		c.i++
	case digits() == 0:
		return c.fail("bad number")
	}
	if c.next() == '.' {
		c.i++
		if digits() == 0 {
			return c.fail("bad number")
		}
	}
	if ch := c.next(); ch == 'e' || ch == 'E' {
		c.i++
		if ch := c.next(); ch == '+' || ch == '-' {
			c.i++
		}
		if digits() == 0 {
			return c.fail("bad number")
		}
	}
	return nil
}

// str checks the string at i (its opening quote), escaping <, >, &, U+2028
// and U+2029. Its bytes are otherwise copied as they are, invalid UTF-8
// included, as encoding/json copies them.
func (c *compactor) str() error {
	src := c.src
	c.i++
	for c.i < len(src) {
		ch := src[c.i]
		switch {
		case ch == '"':
			c.i++
			return nil
		case ch < ' ':
			return c.fail("control character in string")
		case ch == '\\':
			if c.i+1 >= len(src) {
				return c.fail("unexpected end")
			}
			switch src[c.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				c.i += 2
			case 'u':
				if len(src)-c.i < 6 || !isHex(src[c.i+2]) || !isHex(src[c.i+3]) || !isHex(src[c.i+4]) || !isHex(src[c.i+5]) {
					return c.fail(`bad \u escape`)
				}
				c.i += 6
			default:
				return c.fail("bad escape")
			}
		case ch == '<' || ch == '>' || ch == '&':
			c.dst = append(c.dst, src[c.from:c.i]...)
			c.dst = append(c.dst, '\\', 'u', '0', '0', hexDigits[ch>>4], hexDigits[ch&0xF])
			c.i++
			c.from = c.i
		case ch == 0xE2 && c.i+2 < len(src) && src[c.i+1] == 0x80 && src[c.i+2]&^1 == 0xA8:
			c.dst = append(c.dst, src[c.from:c.i]...)
			c.dst = append(c.dst, '\\', 'u', '2', '0', '2', hexDigits[src[c.i+2]&0xF])
			c.i += 3
			c.from = c.i
		default:
			c.i++
		}
	}
	return c.fail("unterminated string")
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
