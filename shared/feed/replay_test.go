package feed

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
)

// The replay fake answers requests with the exchanges captured from a real
// Sync Gateway in testdata/syncgateway/VERSION/*.txt. Each file holds one
// exchange: a line "### REQUEST: METHOD URL [curl flags: -u user:password,
// -H Header: value, -d body]", a blank line, then the raw answer (status
// line, headers, body) exactly as the server sent it.
//
// A request is matched to a capture by interface (public or admin, from the
// captured port), method, escaped path, query parameters, basic-auth user
// and JSON body. The Accept header is not part of the match; it is judged
// the way Sync Gateway judges it (rest/handler.go, requestAccepts): an answer
// that is multipart is only given to a request whose Accept is empty, names
// "multipart/" or "*/*", and any other request gets the captured 406 "Response
// is multipart" (curl sent "*/*" when a capture shows no Accept flag).

// exchange is one captured request and the answer it got.
type exchange struct {
	file   string
	admin  bool // sent to the admin interface
	method string
	path   string // escaped, as sent
	query  url.Values
	user   string // basic-auth user, "" for none
	accept string // the Accept flag of the capture, "" for curl's */*
	body   string // compact JSON (or the raw text)

	status     int
	header     http.Header
	answer     []byte
	multipart  bool
	annotation string // the capture's free text after the URL, if any
}

var (
	curlUser   = regexp.MustCompile(`(?:^| )-u (\S+)`)
	curlAccept = regexp.MustCompile(`-H Accept: ?(.*?)(?: -[uHd] |$)`)
	noteUser   = regexp.MustCompile(`\((\w+)\)`)
	curlTime   = regexp.MustCompile(`\s*\[curl [^\]]*\]\s*$`)
)

// loadExchanges parses every capture of a Sync Gateway version.
func loadExchanges(t *testing.T, version string) []*exchange {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "syncgateway", version, "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no captures for sync gateway %s (%v)", version, err)
	}
	var out []*exchange
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.HasPrefix(b, []byte("HTTP/")) {
			continue // an answer whose request was not recorded
		}
		x, err := parseExchange(b)
		if err != nil {
			t.Fatalf("capture %s: %v", f, err)
		}
		x.file = filepath.Base(f)
		out = append(out, x)
	}
	return out
}

func parseExchange(b []byte) (*exchange, error) {
	const head = "### REQUEST: "
	if !bytes.HasPrefix(b, []byte(head)) {
		return nil, fmt.Errorf("does not start with %q", head)
	}
	i := bytes.Index(b, []byte("\nHTTP/1.1 "))
	if i < 0 {
		return nil, fmt.Errorf("no answer")
	}
	reqText := strings.TrimSpace(string(b[len(head):i]))
	x := &exchange{}
	method, rest, _ := strings.Cut(reqText, " ")
	target, flags, _ := strings.Cut(rest, " ")
	x.method = method
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("request url: %w", err)
	}
	x.admin = strings.HasSuffix(u.Host, ":4985") || strings.HasSuffix(u.Host, ":4995")
	x.path, x.query = u.EscapedPath(), u.Query()
	if m := curlUser.FindStringSubmatch(flags); m != nil {
		x.user, _, _ = strings.Cut(m[1], ":")
	} else if u.Host == "" {
		// A capture written as "GET /path (user); note".
		if m := noteUser.FindStringSubmatch(flags); m != nil {
			x.user = m[1]
		}
		x.annotation = flags
	}
	if m := curlAccept.FindStringSubmatch(flags); m != nil {
		x.accept = m[1]
	}
	if _, data, ok := strings.Cut(flags, "-d "); ok {
		x.body = compactJSON(data)
	}

	r := bufio.NewReader(bytes.NewReader(b[i+1:]))
	tp := textproto.NewReader(r)
	statusLine, err := tp.ReadLine()
	if err != nil {
		return nil, fmt.Errorf("status line: %w", err)
	}
	fields := strings.Fields(statusLine)
	if len(fields) < 2 {
		return nil, fmt.Errorf("status line %q", statusLine)
	}
	if x.status, err = strconv.Atoi(fields[1]); err != nil {
		return nil, fmt.Errorf("status line %q: %w", statusLine, err)
	}
	h, err := tp.ReadMIMEHeader()
	if err != nil {
		return nil, fmt.Errorf("answer headers: %w", err)
	}
	x.header = http.Header(h)
	rest2, _ := io.ReadAll(r)
	x.answer = curlTime.ReplaceAll(rest2, nil)
	mt, _, _ := mime.ParseMediaType(x.header.Get("Content-Type"))
	x.multipart = strings.HasPrefix(mt, "multipart/")
	if !x.multipart {
		x.answer = bytes.TrimSpace(x.answer)
	}
	return x, nil
}

// compactJSON returns s as compact JSON, or s trimmed when it is not JSON.
func compactJSON(s string) string {
	s = strings.TrimSpace(s)
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		return s
	}
	return b.String()
}

// key is what a request must match.
func (x *exchange) key() string {
	return fmt.Sprintf("%t %s %s?%s user=%s body=%s", x.admin, x.method, x.path, x.query.Encode(), x.user, x.body)
}

// acceptsMultipart is Sync Gateway's test of an Accept header.
func acceptsMultipart(accept string) bool {
	return accept == "" || strings.Contains(accept, "multipart/") || strings.Contains(accept, "*/*")
}

// replay is a fake Sync Gateway serving captured exchanges.
type replay struct {
	t             *testing.T
	public, admin *httptest.Server
	byKey         map[string][]*exchange
	// ignore lists query parameters left out of the match; a test names
	// them only where it knows the parameter cannot change the captured
	// answer (for example revocations=true before any revocation).
	ignore []string

	mu   sync.Mutex
	seen []replaySeen
}

// replaySeen is a request the replay was sent and the capture it got.
type replaySeen struct {
	Method, RequestURI, Accept, File string
}

// newReplay serves the captures of a Sync Gateway version whose file names
// start with one of prefixes (all of them when none is given).
func newReplay(t *testing.T, version string, prefixes ...string) *replay {
	t.Helper()
	r := &replay{t: t, byKey: map[string][]*exchange{}}
	for _, x := range loadExchanges(t, version) {
		if len(prefixes) > 0 && !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(x.file, p) }) {
			continue
		}
		r.byKey[x.key()] = append(r.byKey[x.key()], x)
	}
	r.public = httptest.NewServer(r.handler(false))
	r.admin = httptest.NewServer(r.handler(true))
	t.Cleanup(r.public.Close)
	t.Cleanup(r.admin.Close)
	return r
}

// ignoring leaves query parameters out of the match (see replay.ignore).
func (r *replay) ignoring(params ...string) *replay {
	r.ignore = append(r.ignore, params...)
	r.byKey = rekey(r.byKey, r.ignore)
	return r
}

func rekey(m map[string][]*exchange, ignore []string) map[string][]*exchange {
	out := map[string][]*exchange{}
	for _, xs := range m {
		for _, x := range xs {
			for _, p := range ignore {
				x.query.Del(p)
			}
			out[x.key()] = append(out[x.key()], x)
		}
	}
	return out
}

func (r *replay) handler(admin bool) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		in := &exchange{admin: admin, method: req.Method, path: req.URL.EscapedPath(), query: req.URL.Query(), body: compactJSON(string(body))}
		for _, p := range r.ignore {
			in.query.Del(p)
		}
		if user, _, ok := req.BasicAuth(); ok {
			in.user = user
		}
		accept := req.Header.Get("Accept")
		x := r.pick(r.byKey[in.key()], accept)
		r.mu.Lock()
		s := replaySeen{Method: req.Method, RequestURI: req.RequestURI, Accept: accept}
		if x != nil {
			s.File = x.file
		}
		r.seen = append(r.seen, s)
		r.mu.Unlock()
		if x == nil {
			r.t.Errorf("replay: no capture for %s %s (user %q, body %s)", req.Method, req.RequestURI, in.user, in.body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotImplemented)
			io.WriteString(w, `{"error":"no_capture","reason":"the replay has no capture for this request"}`)
			return
		}
		for k, vs := range x.header {
			switch k {
			case "Content-Length", "Transfer-Encoding", "Date":
				continue
			}
			w.Header()[k] = vs
		}
		w.WriteHeader(x.status)
		w.Write(x.answer)
	}
}

// pick chooses among the captures of one request by the request's Accept
// header, as Sync Gateway would.
func (r *replay) pick(xs []*exchange, accept string) *exchange {
	if len(xs) == 0 {
		return nil
	}
	var multi, notAcceptable, other *exchange
	for _, x := range xs {
		switch {
		case x.multipart:
			multi = x
		case x.status == http.StatusNotAcceptable:
			notAcceptable = x
		default:
			other = x
		}
	}
	switch {
	case multi != nil && acceptsMultipart(accept):
		return multi
	case multi != nil || notAcceptable != nil:
		if notAcceptable == nil {
			// The capture of this request was made with curl's */*; Sync
			// Gateway answers every other Accept with this 406.
			return &exchange{file: multi.file + " (406)", status: http.StatusNotAcceptable,
				header: http.Header{"Content-Type": {"application/json"}},
				answer: []byte(`{"error":"Not Acceptable","reason":"Response is multipart"}`)}
		}
		return notAcceptable
	default:
		return other
	}
}

// requests returns what the replay was sent so far.
func (r *replay) requests() []replaySeen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

// client returns a client for the captured database db1 as user (password
// "<user>pw", as in the captures); edit adjusts the options.
func (r *replay) client(user string, edit func(*Options)) *Client {
	r.t.Helper()
	o := Options{
		SourceType: config.SourceSyncGateway, URL: r.public.URL + "/db1", Limit: 100,
		Slack: time.Second, RequestTimeout: 5 * time.Second,
	}
	if user != "" {
		o.Username, o.Password = user, user+"pw"
	}
	return mustNew(r.t, o, edit)
}

// TestReplayParsesEveryCapture keeps the captures and their parser honest:
// every file parses, and wherever one request was captured both with and
// without an Accept that allows multipart, the captures show Sync Gateway's
// rule: 406 for the first, multipart for the second.
func TestReplayParsesEveryCapture(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"3.1.0", "4.0.2"} {
		byKey := map[string][]*exchange{}
		for _, x := range loadExchanges(t, v) {
			if x.status < 100 {
				t.Errorf("%s %s: status %d", v, x.file, x.status)
			}
			if x.method == http.MethodPost && x.body == "" {
				t.Errorf("%s %s: POST without a body", v, x.file)
			}
			byKey[x.key()] = append(byKey[x.key()], x)
		}
		pairs := 0
		for _, xs := range byKey {
			var multi, jsonOnly []*exchange
			for _, x := range xs {
				if acceptsMultipart(x.accept) {
					multi = append(multi, x)
				} else {
					jsonOnly = append(jsonOnly, x)
				}
			}
			if len(multi) == 0 || len(jsonOnly) == 0 {
				continue
			}
			pairs++
			for _, x := range jsonOnly {
				if x.status != http.StatusNotAcceptable || multi[0].multipart != true {
					t.Errorf("%s: %s (Accept %s) answered %d and %s answered multipart=%t",
						v, x.file, x.accept, x.status, multi[0].file, multi[0].multipart)
				}
			}
		}
		if v == "4.0.2" && pairs < 2 { // 40/45 (alice) and 41/46 (bob)
			t.Errorf("%s: no request captured with both kinds of Accept", v)
		}
	}
}

// TestReplayAcceptRule checks the replay's Accept handling against the
// captures: _bulk_get is multipart, so Accept: application/json alone gets
// 406, as captures 40 and 41 show, and the other Accepts get the answer.
func TestReplayAcceptRule(t *testing.T) {
	t.Parallel()
	r := newReplay(t, "4.0.2", "40", "45")
	body := `{"docs":[{"id":"o1","rev":"3-d57282ac9782b3e27fedac41b910f19c"},{"id":"o1","rev":"1-b84aa47d1e4e5253f5995e28b21a4a18"},` +
		`{"id":"o2","rev":"2-10d659680c479e409bb487da4fd9877b"},{"id":"o2","rev":"1-3decf7109ea6f9d69ae54b1608d21b1f"},` +
		`{"id":"o3","rev":"2-640d473a677e83ef0a2684c8f7d63dbd"},{"id":"att1","rev":"1-b08981faaf5977c18e4612f9fa22a107"},` +
		`{"id":"a/b c+dé","rev":"1-57efedb8cf56edf401502d12c96aad80"},{"id":"nosuchdoc","rev":"1-abc"},{"id":"o4","rev":"9-ffff"}]}`
	tests := []struct {
		accept string
		status int
	}{
		{accept: "application/json", status: http.StatusNotAcceptable},
		{accept: "", status: http.StatusOK},
		{accept: "*/*", status: http.StatusOK},
		{accept: "multipart/mixed, application/json", status: http.StatusOK},
	}
	for _, tt := range tests {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, r.public.URL+"/db1/_bulk_get?revs=false", strings.NewReader(body))
		req.SetBasicAuth("alice", "alicepw")
		req.Header.Set("Content-Type", "application/json")
		if tt.accept != "" {
			req.Header.Set("Accept", tt.accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status {
			t.Errorf("Accept %q: status %d (%.80s), want %d", tt.accept, resp.StatusCode, b, tt.status)
		}
		if tt.status == http.StatusNotAcceptable && !strings.Contains(string(b), "Response is multipart") {
			t.Errorf("Accept %q: body %s, want Sync Gateway's reason", tt.accept, b)
		}
	}
}
