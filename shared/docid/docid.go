// Package docid escapes document ids where they become part of a URL path:
// the source's per-document GETs and the HTTP output's URL template.
package docid

import (
	"net/url"
	"strings"
)

// PathSegment returns id as one URL path segment that a server reads back as
// exactly id: url.PathEscape (which escapes '/', '?', '#', '%', spaces,
// control characters and every non-ASCII byte), '+' as %2B (some servers
// read a '+' in a path as a space), and, for an id made only of dots ("." and
// ".." above all), every dot as %2E, so that Go's URL handling keeps the
// segment. That does not make "." and ".." safe: RFC 3986 §6.2.2.2 makes %2E
// equal to '.', and a server or proxy that normalises the path resolves the
// segment; a caller whose server may do so must refuse such ids (the HTTP
// output does). url.PathUnescape of the result is id, so distinct ids get
// distinct segments.
func PathSegment(id string) string {
	if id != "" && strings.Trim(id, ".") == "" {
		return strings.Repeat("%2E", len(id))
	}
	return strings.ReplaceAll(url.PathEscape(id), "+", "%2B")
}
