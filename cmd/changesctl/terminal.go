package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// textWriter escapes what a terminal would act on rather than print, so
// that text from the source or an output (document ids, revisions, error
// texts, raw rows) cannot move the cursor, erase lines, set the clipboard or
// reorder what the operator reads. Control characters other than newline
// and tab, DEL and the C1 controls become \u00XX, the bidirectional
// overrides and isolates \u20XX (both valid escapes inside a JSON string,
// so JSON output decodes to the same values), and a byte that is not UTF-8
// \xNN. Everything else passes through unchanged. Each Write is escaped on
// its own: a rune split across two writes is escaped byte by byte.
// Safe for concurrent use when w is.
type textWriter struct {
	w io.Writer
}

// safeText returns w wrapped in a textWriter; w itself when it is one.
func safeText(w io.Writer) io.Writer {
	if _, ok := w.(*textWriter); ok {
		return w
	}
	return &textWriter{w: w}
}

// raw returns the writer under a textWriter, for the CLI's own escape
// sequences (progress bars, clearing the screen); w itself otherwise.
func raw(w io.Writer) io.Writer {
	if t, ok := w.(*textWriter); ok {
		return t.w
	}
	return w
}

func (t *textWriter) Write(p []byte) (int, error) {
	clean := true
	for i := 0; i < len(p); {
		r, n := utf8.DecodeRune(p[i:])
		if acts(r, n) {
			clean = false
			break
		}
		i += n
	}
	if clean {
		return t.w.Write(p)
	}
	buf := make([]byte, 0, len(p)+16)
	for i := 0; i < len(p); {
		r, n := utf8.DecodeRune(p[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			buf = fmt.Appendf(buf, `\x%02x`, p[i])
		case acts(r, n):
			buf = fmt.Appendf(buf, `\u%04x`, r)
		default:
			buf = append(buf, p[i:i+n]...)
		}
		i += n
	}
	if _, err := t.w.Write(buf); err != nil {
		return 0, err
	}
	return len(p), nil
}

// acts reports whether the rune r, n bytes long, is one a terminal acts on
// (or a byte that is not UTF-8).
func acts(r rune, n int) bool {
	switch {
	case r == utf8.RuneError && n == 1:
		return true
	case r == '\n' || r == '\t':
		return false
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// printable returns s as it is when every character of it prints (no
// newline, tab or other control, no bidirectional override, valid UTF-8),
// and Go-quoted otherwise, so that a value from the source stays on its line
// and in its column.
func printable(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) < 0 {
		return s
	}
	return strconv.Quote(s)
}

// printables is printable of each of ss.
func printables(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = printable(s)
	}
	return out
}
