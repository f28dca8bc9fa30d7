package pgsink

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/changes-worker/changes-worker/shared/config"
)

// jsonTape is a parsed JSON document: its bytes and a flat list of its
// values in document order, each object or array followed by its contents
// (an object's as key, value, key, value...). Mapping a document reads a few
// of its values; the tape finds them without building a map per object or a
// string per key, which made decoding the larger part of mapping a document.
//
// What a tape holds is what encoding/json's Decoder with UseNumber would
// decode (TestTapeMatchesStdlib holds it to that): invalid UTF-8 and unpaired
// surrogates in strings read as U+FFFD, and of a repeated key the last value
// counts.
type jsonTape struct {
	src   string // a copy of the document: the values read from it are parts of it
	nodes []jsonNode
}

// jsonNode is one value of a tape.
type jsonNode struct {
	kind byte // '{', '[', '"', '0' (a number), 't', 'f', 'n'
	// plain is set on a string without escapes or non-ASCII bytes: its bytes
	// are its value.
	plain bool
	// start and end delimit the value's bytes; a string's without its quotes.
	start, end int32
	// next is the index of the node after this value and its contents.
	next int32
}

// rawJSON is an object or array as it is written in a document, or any value
// bound for a jsonb column.
type rawJSON string

// maxDepth is encoding/json's nesting limit.
const maxDepth = 10000

var errJSON = errors.New("invalid JSON")

// parseTape parses one JSON value. The caller may hand the tape back with
// release once it holds nothing read from it but strings.
func parseTape(b []byte) (*jsonTape, error) {
	if len(b) > math.MaxInt32 {
		return nil, fmt.Errorf("decode json: %w: document larger than 2 GiB", errJSON)
	}
	t, _ := tapes.Get().(*jsonTape)
	if t == nil {
		t = &jsonTape{}
	}
	t.src, t.nodes = string(b), t.nodes[:0]
	p := tapeParser{t: t}
	if err := p.value(); err != nil {
		t.release()
		return nil, err
	}
	p.space()
	if p.i != len(b) {
		err := p.fail("data after the value")
		t.release()
		return nil, err
	}
	return t, nil
}

// tapes keeps released tapes, so that their node lists are used again.
var tapes sync.Pool

// maxPooledNodes bounds the node lists kept, so that one large document
// does not keep its list for good.
const maxPooledNodes = 1 << 14

// release hands t back for another document; t must not be used after.
func (t *jsonTape) release() {
	if cap(t.nodes) > maxPooledNodes {
		return
	}
	t.src = ""
	tapes.Put(t)
}

// decodeDoc parses one JSON value into what encoding/json's Decoder with
// UseNumber produces: map[string]any, []any, string, json.Number, bool, nil.
func decodeDoc(b []byte) (any, error) {
	t, err := parseTape(b)
	if err != nil {
		return nil, err
	}
	defer t.release()
	return t.value(0), nil
}

type tapeParser struct {
	t     *jsonTape
	i     int
	depth int
}

func (p *tapeParser) fail(what string) error {
	return fmt.Errorf("decode json: %w: %s at offset %d", errJSON, what, p.i)
}

func (p *tapeParser) space() {
	b := p.t.src
	for p.i < len(b) && (b[p.i] == ' ' || b[p.i] == '\t' || b[p.i] == '\n' || b[p.i] == '\r') {
		p.i++
	}
}

// add appends a node for a value starting at start and returns its index.
func (p *tapeParser) add(kind byte, start int) int {
	p.t.nodes = append(p.t.nodes, jsonNode{kind: kind, start: int32(start)})
	return len(p.t.nodes) - 1
}

// done closes node n, which ends at p.i.
func (p *tapeParser) done(n int) {
	p.t.nodes[n].end = int32(p.i)
	p.t.nodes[n].next = int32(len(p.t.nodes))
}

func (p *tapeParser) value() error {
	p.space()
	b := p.t.src
	if p.i >= len(b) {
		return p.fail("unexpected end")
	}
	switch c := b[p.i]; {
	case c == '{' || c == '[':
		return p.container(c)
	case c == '"':
		return p.str()
	case c == '-' || '0' <= c && c <= '9':
		return p.number()
	case c == 't':
		return p.literal('t', "true")
	case c == 'f':
		return p.literal('f', "false")
	case c == 'n':
		return p.literal('n', "null")
	}
	return p.fail("unexpected character")
}

func (p *tapeParser) literal(kind byte, word string) error {
	if len(p.t.src)-p.i < len(word) || p.t.src[p.i:p.i+len(word)] != word {
		return p.fail("bad literal")
	}
	n := p.add(kind, p.i)
	p.i += len(word)
	p.done(n)
	return nil
}

// container reads an object or array.
func (p *tapeParser) container(open byte) error {
	if p.depth++; p.depth > maxDepth {
		return p.fail("nested too deeply")
	}
	closing := byte(']')
	if open == '{' {
		closing = '}'
	}
	n := p.add(open, p.i)
	p.i++
	p.space()
	b := p.t.src
	if p.i < len(b) && b[p.i] == closing {
		p.i++
		p.depth--
		p.done(n)
		return nil
	}
	for {
		if open == '{' {
			p.space()
			if p.i >= len(b) || b[p.i] != '"' {
				return p.fail("expected a key")
			}
			if err := p.str(); err != nil {
				return err
			}
			p.space()
			if p.i >= len(b) || b[p.i] != ':' {
				return p.fail("expected ':'")
			}
			p.i++
		}
		if err := p.value(); err != nil {
			return err
		}
		p.space()
		if p.i >= len(b) {
			return p.fail("unexpected end")
		}
		switch b[p.i] {
		case ',':
			p.i++
		case closing:
			p.i++
			p.depth--
			p.done(n)
			return nil
		default:
			return p.fail("expected ',' or " + string(closing))
		}
	}
}

// number reads -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?.
func (p *tapeParser) number() error {
	b := p.t.src
	n := p.add('0', p.i)
	digits := func() int {
		start := p.i
		for p.i < len(b) && '0' <= b[p.i] && b[p.i] <= '9' {
			p.i++
		}
		return p.i - start
	}
	if b[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(b) && b[p.i] == '0':
		p.i++
	case digits() == 0:
		return p.fail("bad number")
	}
	if p.i < len(b) && b[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return p.fail("bad number")
		}
	}
	if p.i < len(b) && (b[p.i] == 'e' || b[p.i] == 'E') {
		p.i++
		if p.i < len(b) && (b[p.i] == '+' || b[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return p.fail("bad number")
		}
	}
	p.done(n)
	return nil
}

// str checks a string; p.t.src[p.i] is its opening quote. Its value is
// read when needed, by jsonTape.str.
func (p *tapeParser) str() error {
	b := p.t.src
	p.i++
	n := p.add('"', p.i)
	plain := true
	for p.i < len(b) {
		c := b[p.i]
		switch {
		case c == '"':
			p.done(n)
			p.t.nodes[n].plain = plain
			p.i++
			return nil
		case c < 0x20:
			return p.fail("control character in string")
		case c == '\\':
			plain = false
			if p.i+1 >= len(b) {
				return p.fail("unexpected end")
			}
			switch b[p.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.i += 2
			case 'u':
				if u4(b[p.i:]) < 0 {
					return p.fail("bad \\u escape")
				}
				p.i += 6
			default:
				return p.fail("bad escape")
			}
		case c >= utf8.RuneSelf:
			plain = false
			p.i++
		default:
			p.i++
		}
	}
	return p.fail("unterminated string")
}

// u4 reads \uXXXX at the start of b, or returns -1.
func u4(b string) rune {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range b[2:6] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}

// str returns the value of string node n.
func (t *jsonTape) str(n int) string {
	nd := t.nodes[n]
	s := t.src[nd.start:nd.end]
	if nd.plain {
		return s
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '\\':
			switch e := s[i+1]; e {
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r := u4(s[i:])
				i += 6
				if utf16.IsSurrogate(r) {
					// A pair makes one rune; anything else leaves U+FFFD
					// and is read on its own.
					if d := utf16.DecodeRune(r, u4(s[i:])); d != unicode.ReplacementChar {
						out = utf8.AppendRune(out, d)
						i += 6
						continue
					}
					r = unicode.ReplacementChar
				}
				out = utf8.AppendRune(out, r)
				continue
			default: // '"', '\\', '/'
				out = append(out, e)
			}
			i += 2
		case c < utf8.RuneSelf:
			out = append(out, c)
			i++
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			out = utf8.AppendRune(out, r) // invalid UTF-8 reads as U+FFFD
			i += size
		}
	}
	return string(out)
}

// keyIs reports whether key node n reads as key.
func (t *jsonTape) keyIs(n int, key string) bool {
	nd := t.nodes[n]
	if nd.plain {
		return t.src[nd.start:nd.end] == key
	}
	return t.str(n) == key
}

// raw returns node n as JSON for PostgreSQL's jsonb: as written (a string
// with its quotes) when jsonb reads it as encoding/json does, re-encoded
// when it holds a \u escape (jsonb refuses unpaired surrogates) or invalid
// UTF-8 (which jsonb refuses and encoding/json reads as U+FFFD).
func (t *jsonTape) raw(n int) rawJSON {
	nd := t.nodes[n]
	start, end := nd.start, nd.end
	if nd.kind == '"' {
		start, end = start-1, end+1
	}
	b := t.src[start:end]
	if strings.Contains(b, `\u`) || !utf8.ValidString(b) {
		return rawJSON(jsonText(t.value(n)))
	}
	return rawJSON(b)
}

// lookup evaluates p from node context (or the document, for an anchored
// path) and returns the node it reaches.
func (t *jsonTape) lookup(p config.Path, context int) (int, bool) {
	n := context
	if p.Document {
		n = 0
	}
	for _, st := range p.Steps {
		nd := t.nodes[n]
		switch {
		case st.Index >= 0 && nd.kind == '[':
			i, k := n+1, 0
			for ; i < int(nd.next) && k < st.Index; k++ {
				i = int(t.nodes[i].next)
			}
			if i >= int(nd.next) {
				return 0, false
			}
			n = i
		case st.Index < 0 && nd.kind == '{':
			found := -1
			for i := n + 1; i < int(nd.next); i = int(t.nodes[i+1].next) {
				if t.keyIs(i, st.Key) {
					found = i + 1 // the last of repeated keys counts
				}
			}
			if found < 0 {
				return 0, false
			}
			n = found
		default:
			return 0, false
		}
	}
	return n, true
}

// count returns the number of elements of array node n.
func (t *jsonTape) count(n int) int {
	c := 0
	for i := n + 1; i < int(t.nodes[n].next); i = int(t.nodes[i].next) {
		c++
	}
	return c
}

// scalar returns node n for coercion: a string, json.Number, bool or nil,
// or an object or array as rawJSON.
func (t *jsonTape) scalar(n int) any {
	switch nd := t.nodes[n]; nd.kind {
	case '"':
		return t.str(n)
	case '0':
		return json.Number(t.src[nd.start:nd.end])
	case 't':
		return true
	case 'f':
		return false
	case 'n':
		return nil
	}
	return t.raw(n)
}

// value returns node n decoded as encoding/json would.
func (t *jsonTape) value(n int) any {
	switch nd := t.nodes[n]; nd.kind {
	case '{':
		m := map[string]any{}
		for i := n + 1; i < int(nd.next); i = int(t.nodes[i+1].next) {
			m[t.str(i)] = t.value(i + 1)
		}
		return m
	case '[':
		a := []any{}
		for i := n + 1; i < int(nd.next); i = int(t.nodes[i].next) {
			a = append(a, t.value(i))
		}
		return a
	}
	return t.scalar(n)
}

// rawValue decodes a rawJSON value.
func rawValue(r rawJSON) any {
	t, err := parseTape([]byte(r))
	if err != nil {
		// rawJSON comes from a parsed document.
		return nil
	}
	defer t.release()
	return t.value(0)
}

// mayHoldNUL reports whether raw JSON may hold U+0000, which only the
// escape \u0000 can write; a false positive (an escaped backslash before
// "u0000") costs a closer look.
func mayHoldNUL(r rawJSON) bool {
	return strings.Contains(string(r), `\u0000`)
}
