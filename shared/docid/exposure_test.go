package docid

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestShow(t *testing.T) {
	t.Parallel()
	id := "alice@example.com"
	if got := Plain.Show(id); got != id {
		t.Errorf("plain: %q", got)
	}
	if got := Exposure("").Show(id); got != id {
		t.Errorf("zero: %q", got)
	}
	h := Hashed.Show(id)
	if !strings.HasPrefix(h, "sha256:") || len(h) != len("sha256:")+16 || strings.Contains(h, "alice") || h != Hash(id) || h == Hash("bob@example.com") {
		t.Errorf("hash: %q", h)
	}
	if got := Off.Show(id); strings.Contains(got, "alice") || got == "" {
		t.Errorf("off: %q", got)
	}
	if Off.Key(id) != Hash(id) || Plain.Key(id) != id {
		t.Errorf("keys: off %q, plain %q", Off.Key(id), Plain.Key(id))
	}
}

func TestScrub(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, text string
		ids        []string
		want       string
	}{
		{"as written", `send change order-1: connection refused`, []string{"order-1"}, `send change ` + Hash("order-1") + `: connection refused`},
		{"quoted", `copy attachment "a.bin" of "order-1" rev 2-x`, []string{"order-1"}, `copy attachment "a.bin" of "` + Hash("order-1") + `" rev 2-x`},
		{"escaped by %q", fmt.Sprintf("fetch doc %q: 404", "tab\there"), []string{"tab\there"}, `fetch doc "` + Hash("tab\there") + `": 404`},
		{"not inside a longer word", `reorder-1 and order-10, but order-1.`, []string{"order-1"}, `reorder-1 and order-10, but ` + Hash("order-1") + `.`},
		{"a one-letter id", `send change a: a timeout`, []string{"a"}, `send change ` + Hash("a") + `: ` + Hash("a") + ` timeout`},
		{"several", `a=x b=y`, []string{"x", "y"}, `a=` + Hash("x") + ` b=` + Hash("y")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Hashed.Scrub(tt.text, tt.ids...); got != tt.want {
				t.Errorf("Scrub(%q) = %q, want %q", tt.text, got, tt.want)
			}
			if got := Plain.Scrub(tt.text, tt.ids...); got != tt.text {
				t.Errorf("plain Scrub changed %q to %q", tt.text, got)
			}
		})
	}
}

type marker struct{ error }

func TestScrubError(t *testing.T) {
	t.Parallel()
	base := marker{errors.New("put order-7: refused")}
	err := Off.ScrubError(fmt.Errorf("copy: %w", base), "order-7")
	if strings.Contains(err.Error(), "order-7") {
		t.Errorf("error still names the document: %v", err)
	}
	var m marker
	if !errors.As(err, &m) {
		t.Errorf("scrubbed error does not wrap the original")
	}
	if Plain.ScrubError(base, "order-7") != error(base) || Off.ScrubError(nil, "x") != nil {
		t.Errorf("plain or nil errors must come back as they are")
	}
}

// TestLogger: under hash and off no log line holds the document's id,
// whether it is the doc_id attribute (on the record or added with With),
// or inside the message, an error or another string attribute; under plain
// the logger is the one given.
func TestLogger(t *testing.T) {
	t.Parallel()
	const id = "customer-4711"
	for _, e := range []Exposure{Hashed, Off} {
		t.Run(string(e), func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			log := Logger(slog.New(slog.NewJSONHandler(&buf, nil)), e)
			log.Warn("moved to dlq", "doc_id", id, "error", fmt.Errorf("send change %s: 400", id))
			lg := log.With("doc_id", id, "group", id)
			lg.Error("output halted for "+id, "reason", "http_status "+id, slog.Group("g", "inner", id))
			lg.With("attempt", 2).Info("retry", "error", errors.New(`fetch doc "`+id+`" failed`))
			out := buf.String()
			if strings.Contains(out, id) {
				t.Errorf("log holds the id:\n%s", out)
			}
			if e == Hashed && strings.Count(out, Hash(id)) < 8 {
				t.Errorf("log does not show the hash for each mention:\n%s", out)
			}
			if strings.Count(out, "\n") != 3 {
				t.Errorf("want 3 lines:\n%s", out)
			}
		})
	}
	base := slog.New(slog.DiscardHandler)
	if Logger(base, Plain) != base || Logger(base, "") != base {
		t.Error("plain: want the logger given")
	}
}
