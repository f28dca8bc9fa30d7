package feed

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// decoderRead reads a _changes answer as pageReader.read did with
// json.Decoder (each row found, then decoded into a RawMessage): the
// reference the valueScanner's reading must agree with.
func decoderRead(p *pageReader, st *stream) (*Batch, error) {
	p.b = &Batch{Rows: []Row{}, Pending: -1}
	dec := json.NewDecoder(st.body)
	err := decoderAnswer(p, dec)
	switch {
	case errors.Is(err, errPageFull):
		return p.cut("page_bytes"), nil
	case err != nil && p.pos != nil:
		return p.cut(st.fail(err, "").Error()), nil
	case err != nil:
		if st.body.over {
			return nil, st.fail(err, "its first row")
		}
		if ferr := st.fail(err, ""); ferr != err {
			return nil, ferr
		}
		return nil, malformed("changes", "%v", err)
	}
	return p.whole()
}

func decoderAnswer(p *pageReader, dec *json.Decoder) error {
	if err := delim(dec, '{'); err != nil {
		return err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case "results":
			if err := decoderRows(p, dec); err != nil {
				return err
			}
		case "last_seq":
			p.hasLast = true
			if err := dec.Decode(&p.lastSeq); err != nil {
				return err
			}
		case "pending":
			var n json.RawMessage
			if err := dec.Decode(&n); err != nil {
				return err
			}
			if v, err := strconv.ParseInt(string(n), 10, 64); err == nil && v >= 0 {
				p.b.Pending = v
			}
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return err
			}
		}
	}
	return delim(dec, '}')
}

func decoderRows(p *pageReader, dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		return nil
	}
	if tok != json.Delim('[') {
		return fmt.Errorf("results is %v, not a list", tok)
	}
	p.results = true
	var raw json.RawMessage
	for dec.More() {
		raw = nil
		if err := dec.Decode(&raw); err != nil {
			return err
		}
		p.row(raw)
		if p.budget > 0 && dec.InputOffset() >= p.budget && p.pos != nil && dec.More() {
			return errPageFull
		}
	}
	return delim(dec, ']')
}

// checkAsDecoder reads body both ways, whole and a byte per read, and fails
// unless they agree: the same rows, malformed rows, position, pending count,
// fullness and cut, or errors of the same kind.
func checkAsDecoder(t *testing.T, body []byte) {
	t.Helper()
	for _, limit := range []int64{1 << 20, 256} {
		for _, budget := range []int64{0, 128} {
			for _, oneByte := range []bool{false, true} {
				stream := func(oneByte bool) *stream {
					st := bytesStream(body, limit)
					if oneByte {
						st.body.r = iotest.OneByteReader(st.body.r)
					}
					return st
				}
				// The decoder reads a byte at a time: it then reads no
				// further than it must to tell a broken answer from one
				// over its limit, which is how the scanner tells them.
				want, wantErr := decoderRead(&pageReader{limit: 10, budget: budget}, stream(true))
				got, gotErr := (&pageReader{limit: 10, budget: budget}).read(stream(oneByte))
				where := fmt.Sprintf("limit %d, budget %d, a byte a read %t, answer %.200q", limit, budget, oneByte, body)
				if (wantErr == nil) != (gotErr == nil) {
					t.Fatalf("%s: error %v, the decoder's %v", where, gotErr, wantErr)
				}
				if wantErr != nil {
					var wl, gl *LimitError
					if errors.Is(gotErr, ErrMalformed) != errors.Is(wantErr, ErrMalformed) || errors.As(gotErr, &gl) != errors.As(wantErr, &wl) {
						t.Fatalf("%s: error %v, the decoder's %v", where, gotErr, wantErr)
					}
					continue
				}
				if (got.Cut == "") != (want.Cut == "") {
					t.Fatalf("%s: cut %q, the decoder's %q", where, got.Cut, want.Cut)
				}
				got.Cut, want.Cut = "", ""
				if d := cmp.Diff(want, got); d != "" {
					t.Fatalf("%s: batch (-decoder +scanner):\n%s", where, d)
				}
			}
		}
	}
}

// answersToCompare are answers well formed and not: every kind of row,
// members in any order, cut short, trailing bytes, broken JSON.
func answersToCompare() []string {
	var rows []string
	for i, id := range testenv.HostileIDs() {
		rows = append(rows, hostileRow(i+1, id))
	}
	answers := []string{
		`{"results":[` + strings.Join(rows, ",") + `],"last_seq":"99-g1AAAA","pending":0}`,
		string(benchPage(30, 300)),
		`{"results":[],"last_seq":""}`,
		`{ "results" : [ ] , "last_seq" : 7 }`,
		`{"results":[{"seq":9,"id":"a","changes":[{"rev":"1-a"}]}],"last_seq":3}`,
		`{"results":[{"seq":"4:9","id":"a","changes":[{"rev":"1-a"}]},{"seq":null,"changes":[]},{"seq":5,"id":""},[1],7],"last_seq":"3::10"}`,
		`{"results":[{"seq":1,"id":"_user/alice","changes":[]},{"seq":2,"id":"b","removed":["x"],"revoked":true,"doc":{"_removed":true}}],"last_seq":2}`,
		`{"results":[{"seq":1,"id":"a","changes":"x","doc":5}],"last_seq":null}`,
		`{"results":[{"seq":1,"id":"a","chan`,
		`{"last_seq":3,"results":null}`,
		`{"results":[{"seq":1,"id":"a","changes":[{"rev":"1-a"}]}],"last_seq":1,"pending":"many"} trailing`,
		`{"results":[{"seq":1,"id":"a","changes":[{"rev":"1-a"}]}],"last_seq":1,"pending":12}`,
		`{"results":[{"seq":1,"id":"a\"]},{","changes":[{"rev":"1-a"}]}],"last_seq":1}`,
		`{"results":[{"seq":1,"id":"a\\","changes":[{"rev":"1-a"}]}],"last_seq":1}`,
		`{"results":[{"seq":1,"id":"a"}x{"seq":2,"id":"b"}],"last_seq":2}`,
		`{"results":[{"seq":1,"id":"a"},{"seq":2,"id":"b"],"last_seq":2}`,
		`{"results":[{"seq":1,"id":"a"},,{"seq":2,"id":"b"}],"last_seq":2}`,
		`{"results":[{"seq":1,"id":"a"}],"last_seq":2,}`,
		`{"results":[{"seq":1,"id":"a"}] "last_seq":2}`,
		`{"results":[{"seq":1,"id":"a"}],"last_seq":2`,
		`{"results":[{"seq":1,"id":"a"}],"last_seq":tru}`,
		`{"results":[{"seq":1,"id":"a"}],"last_seq":-}`,
		`{"results":[{"seq":1,"id":"a"}],"last_seq":12`,
		`{"results":[1,2,3],"last_seq":12}`,
		`{"results":[}`, `{"results":]`, `{"results":{}}`, `{"results":true}`, `{"results":"x"}`,
		`{"result\u0073":[{"seq":1,"id":"a"}],"last_seq":1}`,
		`{"Results":[{"seq":1,"id":"a"}],"last_seq":1}`,
		`{"other":{"results":[1]},"results":[{"seq":1,"id":"a"}],"last_seq":1}`,
		`{"results":[{"seq":1,"id":"a"}],"results":[{"seq":2,"id":"b"}],"last_seq":2}`,
		`{5:1}`, `{"a"}`, `{"a":}`, `{,}`, `{}`, `[]`, ``, `{`, ` `, `null`, `"x"`,
		"{\"results\":[{\"seq\":1,\"id\":\"\xff\"}],\"last_seq\":1}",
		"{\"results\":[{\"seq\":1,\"id\":\"a\x01\"}],\"last_seq\":1}",
	}
	return answers
}

// TestChangesReadAsDecoder: the _changes reader reads every answer as
// json.Decoder did before it, row for row, whatever the reads' sizes.
func TestChangesReadAsDecoder(t *testing.T) {
	for _, a := range answersToCompare() {
		checkAsDecoder(t, []byte(a))
		// Every answer cut short: the short ones at every length, the
		// long ones at a hundred.
		step := max(1, len(a)/100)
		for n := 0; n < len(a); n += step {
			checkAsDecoder(t, []byte(a[:n]))
		}
	}
}

// FuzzChangesReadAsDecoder: the same on arbitrary answers.
func FuzzChangesReadAsDecoder(f *testing.F) {
	for _, a := range answersToCompare() {
		f.Add([]byte(a))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkAsDecoder(t, body)
	})
}

// TestValueScannerReadsError: a read error in the middle of a value is the
// scanner's error, the data before it read first.
func TestValueScannerReadsError(t *testing.T) {
	boom := errors.New("connection reset")
	s := &valueScanner{r: io.MultiReader(strings.NewReader(`["ab","c`), iotest.ErrReader(boom))}
	if err := s.expect('['); err != nil {
		t.Fatal(err)
	}
	if v, err := s.value(); err != nil || string(v) != `"ab"` {
		t.Fatalf("first value %q, %v", v, err)
	}
	if err := s.expect(','); err != nil {
		t.Fatal(err)
	}
	if v, err := s.value(); !errors.Is(err, boom) {
		t.Fatalf("second value %q, %v; want the read's error", v, err)
	}
}
