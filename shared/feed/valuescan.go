package feed

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// valueScanner reads an answer's JSON as it arrives, one value at a time,
// holding no more of it than the value being read and what the last read
// brought in beyond it. Each value is found in one pass that only looks for
// quotes and brackets, then checked with json.Valid: one full scan of each
// row, where json.Decoder's Decode makes two (finding the value's end, then
// decoding it) and copies it. Not safe for concurrent use.
type valueScanner struct {
	r    io.Reader
	buf  []byte
	pos  int   // the next byte of buf to read
	base int64 // the answer's offset of buf[0]
	err  error // what r returned (io.EOF at the end): once set, nothing more is read
}

// minRead is the least free space a read is given.
const minRead = 16 << 10

// offset is the number of the answer's bytes read so far.
func (s *valueScanner) offset() int64 { return s.base + int64(s.pos) }

// fill reads more of the answer into buf, keeping what it holds. It returns
// false, with s.err set, when nothing more came.
func (s *valueScanner) fill() bool {
	if s.err != nil {
		return false
	}
	if cap(s.buf)-len(s.buf) < minRead {
		grown := make([]byte, len(s.buf), max(2*cap(s.buf), len(s.buf)+minRead))
		copy(grown, s.buf)
		s.buf = grown
	}
	for {
		n, err := s.r.Read(s.buf[len(s.buf):cap(s.buf)])
		s.buf = s.buf[:len(s.buf)+n]
		if err != nil {
			s.err = err
		}
		if n > 0 || err != nil {
			return n > 0
		}
	}
}

// failed is the error to return when the answer ended or broke before what
// was being read did.
func (s *valueScanner) failed() error {
	if s.err == nil || errors.Is(s.err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return s.err
}

// peek returns the next byte that is not JSON whitespace, without reading
// it.
func (s *valueScanner) peek() (byte, error) {
	for {
		for s.pos < len(s.buf) {
			switch c := s.buf[s.pos]; c {
			case ' ', '\t', '\n', '\r':
				s.pos++
			default:
				return c, nil
			}
		}
		if !s.fill() {
			return 0, s.failed()
		}
	}
}

// expect reads the next byte that is not whitespace, which must be c.
func (s *valueScanner) expect(c byte) error {
	got, err := s.peek()
	if err != nil {
		return err
	}
	if got != c {
		return s.unexpected(got, fmt.Sprintf("where %q belongs", c))
	}
	s.pos++
	return nil
}

// separator reads what follows a member of an object or an element of a
// list, after: a comma, then more follow, or close, which ends it.
func (s *valueScanner) separator(close byte, after string) (more bool, err error) {
	c, err := s.peek()
	if err != nil {
		return false, err
	}
	if c != ',' && c != close {
		return false, s.unexpected(c, after)
	}
	s.pos++
	return c == ',', nil
}

// unexpected is the error for byte c, just peeked, where it does not
// belong.
func (s *valueScanner) unexpected(c byte, where string) error {
	return fmt.Errorf("invalid character %q %s (byte %d of the answer)", c, where, s.offset())
}

// compact moves the unread bytes to the start of buf, so that a value read
// next starts there and buf holds no more than it.
func (s *valueScanner) compact() {
	if s.pos == 0 {
		return
	}
	n := copy(s.buf, s.buf[s.pos:])
	s.base += int64(s.pos)
	s.buf, s.pos = s.buf[:n], 0
}

// value reads the next JSON value and returns its bytes, which stay valid
// until the next read; the caller copies what it keeps. An answer that is
// not JSON there is a *json.SyntaxError.
func (s *valueScanner) value() ([]byte, error) {
	if _, err := s.peek(); err != nil {
		return nil, err
	}
	s.compact()
	end, err := s.valueEnd()
	if err != nil {
		return s.decode(s.buf[s.pos:], err)
	}
	if v := s.buf[s.pos:end]; json.Valid(v) {
		s.pos = end
		return v, nil
	}
	return s.decode(s.buf[s.pos:end], nil)
}

// decode reads the value at s.pos as json.Decoder reads a stream of
// values, from part, the bytes at hand: the whole value valueEnd found
// (readErr nil) or what came before the answer broke or ended (readErr).
// A number or literal ends where JSON's grammar ends it (00 is 0, then
// 0); bytes that are already not JSON are a *json.SyntaxError, whatever
// the reader met after them.
func (s *valueScanner) decode(part []byte, readErr error) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(part))
	var v json.RawMessage
	err := dec.Decode(&v)
	// Before the answer broke, a value is whole only if bytes follow it.
	if n := int(dec.InputOffset()); err == nil && (readErr == nil || n < len(part)) {
		s.pos += n
		return v, nil
	}
	if se := (*json.SyntaxError)(nil); errors.As(err, &se) {
		se.Offset += s.offset()
		return nil, se
	}
	if readErr != nil {
		return nil, readErr
	}
	return nil, fmt.Errorf("invalid JSON at byte %d of the answer", s.offset())
}

// valueEnd returns the index of buf after the value that starts at s.pos,
// reading more of the answer as needed: past the closing quote or bracket
// that matches its first byte, or, for a number or literal, up to the next
// byte that is not part of one. It checks nothing else: value does.
func (s *valueScanner) valueEnd() (int, error) {
	c := s.buf[s.pos]
	if c == '"' {
		end, err := s.stringEnd(s.pos)
		// As json.Decoder, a string is not whole until the byte after it
		// or the end of the answer is read.
		if err == nil && end == len(s.buf) && !s.fill() && !errors.Is(s.err, io.EOF) {
			return 0, s.err
		}
		return end, err
	}
	if c != '{' && c != '[' {
		return s.scalarEnd()
	}
	depth := 0
	for i := s.pos; ; {
		if i >= len(s.buf) {
			if !s.fill() {
				return 0, s.failed()
			}
			continue
		}
		switch s.buf[i] {
		case '"':
			end, err := s.stringEnd(i)
			if err != nil {
				return 0, err
			}
			i = end
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1, nil
			}
		}
		i++
	}
}

// scalarEnd returns the index of buf after the number or literal that
// starts at s.pos: at the next byte that is not part of one, or at the end
// of the answer.
func (s *valueScanner) scalarEnd() (int, error) {
	i := s.pos
	for {
		for ; i < len(s.buf); i++ {
			switch s.buf[i] {
			case ',', ':', '{', '}', '[', ']', '"', ' ', '\t', '\n', '\r':
				return i, nil
			}
		}
		if !s.fill() {
			if errors.Is(s.err, io.EOF) && i > s.pos {
				return i, nil // it ends the answer
			}
			return 0, s.failed()
		}
	}
}

// stringEnd returns the index of buf after the string whose opening quote is
// at buf[q], reading more of the answer as needed.
func (s *valueScanner) stringEnd(q int) (int, error) {
	j := q + 1
	for {
		k := bytes.IndexByte(s.buf[j:], '"')
		if k < 0 {
			j = len(s.buf)
			if !s.fill() {
				return 0, s.failed()
			}
			continue
		}
		j += k
		escapes := 0
		for b := j - 1; b > q && s.buf[b] == '\\'; b-- {
			escapes++
		}
		j++
		if escapes%2 == 0 {
			return j, nil
		}
	}
}
