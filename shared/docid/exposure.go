package docid

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Exposure is how document ids appear where the pipeline writes about a
// document rather than delivering it: its logs, the failure attributes of
// DLQ messages, and the halt and quarantine records. Document ids are often
// personal data (an e-mail address, a customer number). Messages on the
// queues and the outputs themselves always carry the real id.
type Exposure string

const (
	// Plain shows the id as it is (the default).
	Plain Exposure = "plain"
	// Hashed shows "sha256:" and the first 16 hex digits of the id's
	// SHA-256: lines about one document still go together, and whoever
	// knows an id can find its lines (changesctl docid hash ID), but the
	// logs do not hold it. Pseudonymous, not anonymous: an id that can be
	// guessed can be recognised.
	Hashed Exposure = "hash"
	// Off shows no trace of the id.
	Off Exposure = "off"
)

// hidden stands for an id under Off.
const hidden = "(doc id hidden)"

// Hash is the hashed form of id that Hashed shows.
func Hash(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// Show returns id as e shows it. The zero Exposure is Plain.
func (e Exposure) Show(id string) string {
	switch e {
	case Hashed:
		return Hash(id)
	case Off:
		return hidden
	}
	return id
}

// Key returns what stands for id in a record's key: the id itself under
// Plain, its hash otherwise (Off too: keys must stay apart).
func (e Exposure) Key(id string) string {
	if e == "" || e == Plain {
		return id
	}
	return Hash(id)
}

// Scrub returns text with every occurrence of each of ids replaced by what
// e shows for it: as written and as Go quotes it (%q), wherever it stands
// on its own (not inside a longer word), so that an error that names a
// document can be logged or recorded under any exposure. Under Plain it
// returns text unchanged.
func (e Exposure) Scrub(text string, ids ...string) string {
	if e == "" || e == Plain {
		return text
	}
	for _, id := range ids {
		if id == "" {
			continue
		}
		shown := e.Show(id)
		forms := []string{id}
		if q := strconv.Quote(id); q[1:len(q)-1] != id {
			forms = append(forms, q[1:len(q)-1])
		}
		for _, f := range forms {
			text = replaceWhole(text, f, shown)
		}
	}
	return text
}

// replaceWhole replaces each occurrence of old in s that is not part of a
// longer word (the characters either side, if any, are neither letters,
// digits, '-' nor '_') with repl.
func replaceWhole(s, old, repl string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, old)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		before, _ := utf8.DecodeLastRuneInString(s[:i])
		after, _ := utf8.DecodeRuneInString(s[i+len(old):])
		if (i > 0 && wordRune(before)) || (i+len(old) < len(s) && wordRune(after)) {
			b.WriteString(s[:i+len(old)])
		} else {
			b.WriteString(s[:i])
			b.WriteString(repl)
		}
		s = s[i+len(old):]
	}
}

func wordRune(r rune) bool {
	return r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r)
}

// AttrKey is the log attribute that names a document.
const AttrKey = "doc_id"

// Logger returns log with a handler that shows document ids as e does: the
// value of every AttrKey attribute, and each of those ids wherever it
// appears in the message and the other string attributes of the same
// record (an error that names the document). Under Plain it returns log.
func Logger(log *slog.Logger, e Exposure) *slog.Logger {
	if e == "" || e == Plain {
		return log
	}
	return slog.New(&logHandler{next: log.Handler(), e: e})
}

// logHandler is Logger's handler. ids are the documents named by attributes
// added with WithAttrs.
type logHandler struct {
	next slog.Handler
	e    Exposure
	ids  []string
}

func (h *logHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	ids := h.ids
	for _, a := range attrs {
		if a.Key == AttrKey {
			ids = append(ids[:len(ids):len(ids)], a.Value.Resolve().String())
		}
	}
	out := &logHandler{next: nil, e: h.e, ids: ids}
	out.next = h.next.WithAttrs(h.scrubAll(attrs, ids))
	return out
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	return &logHandler{next: h.next.WithGroup(name), e: h.e, ids: h.ids}
}

func (h *logHandler) Handle(ctx context.Context, r slog.Record) error {
	ids := h.ids
	var attrs []slog.Attr
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == AttrKey {
			ids = append(ids[:len(ids):len(ids)], a.Value.Resolve().String())
		}
		attrs = append(attrs, a)
		return true
	})
	out := slog.NewRecord(r.Time, r.Level, h.e.Scrub(r.Message, ids...), r.PC)
	out.AddAttrs(h.scrubAll(attrs, ids)...)
	return h.next.Handle(ctx, out)
}

// scrubAll returns attrs with the document ids shown as h shows them.
func (h *logHandler) scrubAll(attrs []slog.Attr, ids []string) []slog.Attr {
	out := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		out[i] = h.scrub(a, ids)
	}
	return out
}

func (h *logHandler) scrub(a slog.Attr, ids []string) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindGroup:
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(h.scrubAll(v.Group(), ids)...)}
	case slog.KindString:
		if a.Key == AttrKey {
			return slog.String(a.Key, h.e.Show(v.String()))
		}
		return slog.String(a.Key, h.e.Scrub(v.String(), ids...))
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			return slog.String(a.Key, h.e.Scrub(err.Error(), ids...))
		}
		if s, ok := v.Any().(interface{ String() string }); ok {
			return slog.String(a.Key, h.e.Scrub(s.String(), ids...))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// ScrubError returns err with its text scrubbed of ids (Scrub), still
// wrapping err for errors.Is and errors.As. Under Plain, and for a nil
// err, it returns err.
func (e Exposure) ScrubError(err error, ids ...string) error {
	if err == nil || e == "" || e == Plain {
		return err
	}
	text := e.Scrub(err.Error(), ids...)
	if text == err.Error() {
		return err
	}
	return &scrubbed{text: text, err: err}
}

// scrubbed is an error whose text was scrubbed of document ids.
type scrubbed struct {
	text string
	err  error
}

func (s *scrubbed) Error() string { return s.text }
func (s *scrubbed) Unwrap() error { return s.err }
