package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/docid"
	"github.com/changes-worker/changes-worker/shared/statetable/halt"
	"github.com/changes-worker/changes-worker/shared/statetable/quarantine"
)

// Text a source writer controls, holding what a terminal acts on: an OSC 52
// clipboard write, an erase-line, a carriage return, an 8-bit CSI (U+009B),
// a right-to-left override.
const (
	hostileID    = "ord-1\x1b]52;c;ZXZpbA==\x07\x1b[2K"
	hostileRev   = "1-\x1b[31mred"
	hostileError = "endpoint said: \x1b[1A\x1b[2Kall good\r\u009b31m\u202eeulav"
)

// acted returns the first byte sequence in out that a terminal would act on
// rather than print: a control character other than newline and tab, DEL,
// a C1 control, a bidirectional override or isolate, invalid UTF-8.
func acted(out string) (string, bool) {
	for i, r := range out {
		switch {
		case r == utf8.RuneError:
			if _, n := utf8.DecodeRuneInString(out[i:]); n == 1 {
				return out[i : i+1], true
			}
		case r == '\n' || r == '\t':
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f),
			r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
			return string(r), true
		}
	}
	return "", false
}

func assertTerminalSafe(t *testing.T, what, out string) {
	t.Helper()
	if seq, bad := acted(out); bad {
		t.Errorf("%s printed %q, which a terminal acts on:\n%q", what, seq, out)
	}
}

// TestTerminalSafeOutput: document ids, revisions and error texts come from
// the source and the outputs; whatever changesctl prints of them (DLQ, halt
// records, quarantine) reaches the operator's terminal escaped, in text and
// in JSON, while the JSON still decodes to the original values.
func TestTerminalSafeOutput(t *testing.T) {
	ctx, s := parallelStack(t, outPG)
	q := s.queues(outPG)
	e := envelope("pg", hostileID, hostileRev, 4, 1)
	doc, err := json.Marshal(map[string]string{"_id": hostileID, "_rev": hostileRev, "note": hostileError})
	if err != nil {
		t.Fatal(err)
	}
	e.Doc = doc
	s.enqueue(q, e)
	failure := &deliver.Error{Class: deliver.Permanent, Reason: "http_status", HTTPStatus: 422, Err: errors.New(hostileError)}
	if n := s.failThroughWriter(q, failure); n != 1 {
		t.Fatalf("writer handled %d messages, want 1", n)
	}
	for _, args := range [][]string{
		{"dlq", "list", "--output", "pg"},
		{"dlq", "list", "--output", "pg", "--json"},
		{"dlq", "show", "--output", "pg"},
		{"dlq", "show", "--output", "pg", "--body"},
	} {
		assertTerminalSafe(t, strings.Join(args, " "), s.mustCLI(ctx, args...))
	}
	out := s.mustCLI(ctx, "dlq", "show", "--output", "pg", "--json")
	assertTerminalSafe(t, "dlq show --json", out)
	var shown []dlqShown
	if err := json.Unmarshal([]byte(out), &shown); err != nil {
		t.Fatalf("dlq show --json: %v\n%s", err, out)
	}
	if len(shown) != 1 || shown[0].Envelope == nil || shown[0].Envelope.DocID != hostileID || shown[0].Envelope.Rev != hostileRev ||
		!strings.Contains(shown[0].Failure.Error, "all good") {
		t.Errorf("dlq show --json does not decode to the message's values: %+v", shown)
	}

	qs := quarantine.Store{DB: s.Deps.DynamoDB, Table: s.Config.TableName()}
	if err := qs.Record(ctx, quarantine.Entry{Job: "orders", Kind: quarantine.Row, Seq: json.RawMessage(`"7"`),
		Reason: "row names no document: " + hostileError, Raw: []byte(`{"seq":"7","id":"` + hostileID + `"}`), Attempts: 3}); err != nil {
		t.Fatal(err)
	}
	assertTerminalSafe(t, "status", s.mustCLI(ctx, "status"))
}

// TestTerminalSafeHaltShow: halt show prints the halted change's id,
// revision, group and error escaped.
func TestTerminalSafeHaltShow(t *testing.T) {
	t.Parallel()
	s := newHaltStack(t, &haltReceiver{refuse: map[string]bool{}})
	ctx := t.Context()
	hs := halt.Store{DB: s.Deps.DynamoDB, Table: s.Config.TableName()}
	now := time.Now()
	if _, err := hs.Record(ctx, halt.State{Job: "orders", Output: "ledger", Group: hostileID, MessageID: "m-1", DocID: hostileID, Rev: hostileRev,
		Seq: `"5"`, Class: "permanent", Reason: "http_status", HTTPStatus: 400, Error: hostileError, Since: now, LastAt: now, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"halt", "show", "--output", "ledger"}, {"halt", "show", "--output", "ledger", "--json"}} {
		assertTerminalSafe(t, strings.Join(args, " "), s.mustCLI(ctx, args...))
	}
}

// TestSafeText: the writer escapes what a terminal acts on as \u escapes
// (valid inside JSON strings) and passes everything else through.
func TestSafeText(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"plain ascii, tabs\tand\nnewlines\n", "plain ascii, tabs\tand\nnewlines\n"},
		{"été ✓ 日本", "été ✓ 日本"},
		{"a\x1b[2Kb", `a\u001b[2Kb`},
		{"bell\x07 del\x7f cr\r", `bell\u0007 del\u007f cr\u000d`},
		{"c1 \u009b31m", `c1 \u009b31m`},
		{"rlo \u202e iso \u2066", `rlo \u202e iso \u2066`},
		{"bad \xff utf8", `bad \xff utf8`},
	}
	for _, tt := range tests {
		var b bytes.Buffer
		w := safeText(&b)
		if n, err := w.Write([]byte(tt.in)); err != nil || n != len(tt.in) {
			t.Errorf("Write(%q) = %d, %v", tt.in, n, err)
		}
		if b.String() != tt.want {
			t.Errorf("Write(%q) wrote %q, want %q", tt.in, b.String(), tt.want)
		}
	}
}

// TestPrintable: a value that would break its line or column is quoted.
func TestPrintable(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"order-1":       "order-1",
		"été ✓":         "été ✓",
		"two\nlines":    `"two\nlines"`,
		"tab\tbed":      `"tab\tbed"`,
		"rlo\u202e":     `"rlo\u202e"`,
		"bad\xffutf8":   `"bad\xffutf8"`,
		`"quoted" text`: `"quoted" text`,
		"":              "",
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestDocIDHash: docid hash prints the form stack.doc_ids hash gives each id.
func TestDocIDHash(t *testing.T) {
	t.Parallel()
	var out, errb strings.Builder
	if err := realMain(t.Context(), &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, lookup: func(string) (string, bool) { return "", false }},
		[]string{"docid", "hash", "order-1", "alice@example.com"}); err != nil {
		t.Fatal(err)
	}
	want := docid.Hash("order-1") + "\torder-1\n" + docid.Hash("alice@example.com") + "\talice@example.com\n"
	if out.String() != want {
		t.Errorf("docid hash printed %q, want %q", out.String(), want)
	}
}
