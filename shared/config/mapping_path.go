package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Path addresses a value inside a JSON document. Its syntax:
//
//	customer.name        key "customer", then key "name"
//	items[0].sku         key "items", element 0, key "sku"
//	["odd.key"]["a b"]   keys that are not plain names, as JSON strings in brackets
//	$.total  $           anchored at the document root ($ alone: the whole document)
//	@.sku  @             the current context (@ alone: the context itself)
//
// A plain name is one or more Unicode letters, digits, '_' or '-'; any other
// key (one with '.', '$', spaces, ...) is written in brackets. Indexes start
// at 0. A path without an anchor is relative to the current context: the
// document for a root table, the array element for a child table; so "@.x"
// and "x" are the same path, and "$.x" reaches the document from a child
// table.
type Path struct {
	// Document is set when the path starts with $: it is evaluated against the
	// document whatever the context.
	Document bool
	Steps    []PathStep
}

// PathStep is one step of a Path: an object key, or an array index when
// Index >= 0.
type PathStep struct {
	Key   string
	Index int
}

// ParsePath parses the path syntax described on Path.
func ParsePath(s string) (Path, error) {
	var p Path
	rest := s
	switch {
	case s == "":
		return Path{}, errors.New("is empty")
	case s[0] == '$' || s[0] == '@':
		p.Document = s[0] == '$'
		rest = s[1:]
		if rest != "" && rest[0] != '.' && rest[0] != '[' {
			return Path{}, fmt.Errorf("%q: %c must be alone or followed by '.' or '['", s, s[0])
		}
	default:
		// A relative path starts with a name or a bracket.
		if s[0] != '[' {
			rest = "." + s
		}
	}
	for rest != "" {
		var step PathStep
		var err error
		switch rest[0] {
		case '.':
			n := nameLen(rest[1:])
			if n == 0 {
				return Path{}, fmt.Errorf("%q: expected a name after '.' at offset %d (quote other keys as [\"...\"])", s, len(s)-len(rest)+1)
			}
			step, rest = PathStep{Key: rest[1 : 1+n], Index: -1}, rest[1+n:]
		case '[':
			step, rest, err = parseBracket(rest)
			if err != nil {
				return Path{}, fmt.Errorf("%q: %w", s, err)
			}
		default:
			return Path{}, fmt.Errorf("%q: unexpected %q at offset %d", s, rest[0], len(s)-len(rest))
		}
		p.Steps = append(p.Steps, step)
	}
	return p, nil
}

// nameLen returns the length in bytes of the plain name at the start of s.
func nameLen(s string) int {
	n := 0
	for n < len(s) {
		r, size := utf8.DecodeRuneInString(s[n:])
		if !(unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' || r == '-') {
			break
		}
		n += size
	}
	return n
}

// parseBracket parses [123] or ["key"] at the start of s.
func parseBracket(s string) (PathStep, string, error) {
	end := strings.IndexByte(s, ']')
	if len(s) > 1 && s[1] == '"' {
		// The key is a JSON string: find its closing quote, skipping escapes.
		i := 2
		for i < len(s) && s[i] != '"' {
			if s[i] == '\\' {
				i++
			}
			i++
		}
		if i >= len(s) || i+1 >= len(s) || s[i+1] != ']' {
			return PathStep{}, "", errors.New(`unterminated ["..."] key`)
		}
		var key string
		if err := json.Unmarshal([]byte(s[1:i+1]), &key); err != nil {
			return PathStep{}, "", fmt.Errorf("bad quoted key %s: %w", s[1:i+1], err)
		}
		return PathStep{Key: key, Index: -1}, s[i+2:], nil
	}
	if end < 0 {
		return PathStep{}, "", errors.New("unterminated [")
	}
	digits := s[1:end]
	n, err := strconv.Atoi(digits)
	if err != nil || n < 0 || digits == "" || (len(digits) > 1 && digits[0] == '0') || strings.ContainsAny(digits, "+-") {
		return PathStep{}, "", fmt.Errorf("[%s] is not an array index (a non-negative integer) or a quoted key", digits)
	}
	return PathStep{Index: n}, s[end+1:], nil
}

// String returns the path in the syntax ParsePath reads, written the
// canonical way: relative paths without '@' where possible.
func (p Path) String() string {
	var b strings.Builder
	switch {
	case p.Document:
		b.WriteByte('$')
	case len(p.Steps) == 0:
		b.WriteByte('@')
	}
	for i, st := range p.Steps {
		st.write(&b, i == 0 && !p.Document)
	}
	return b.String()
}

// AppendTo returns prefix (a concrete path such as `items[2]`, or "" for the
// document) followed by the steps of p, for naming where a value was found.
func (p Path) AppendTo(prefix string) string {
	if p.Document || prefix == "" {
		return p.String()
	}
	var b strings.Builder
	b.WriteString(prefix)
	for _, st := range p.Steps {
		st.write(&b, false)
	}
	return b.String()
}

func (st PathStep) write(b *strings.Builder, first bool) {
	switch {
	case st.Index >= 0:
		fmt.Fprintf(b, "[%d]", st.Index)
	case st.Key != "" && nameLen(st.Key) == len(st.Key):
		if !first {
			b.WriteByte('.')
		}
		b.WriteString(st.Key)
	default:
		q, _ := json.Marshal(st.Key)
		b.WriteByte('[')
		b.Write(q)
		b.WriteByte(']')
	}
}
