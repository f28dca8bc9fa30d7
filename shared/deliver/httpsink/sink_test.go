package httpsink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/delivertest"
)

var (
	live    = delivertest.Live
	deleted = delivertest.Deleted
	v       = delivertest.V
)

// receiver is an endpoint that, unlike the sink, can enforce observation
// order: it keeps the version of every document (deleted ones too) and
// ignores a request whose X-Changes-Version is not newer. Run against it, the
// conformance suite's monotonic cases hold end to end, sink plus receiver;
// the sink's part is to send the version and the right method for each change.
type receiver struct {
	mu   sync.Mutex
	docs map[string]held
}

type held struct {
	version change.Version
	rev     string
	deleted bool
}

func newReceiver() *receiver { return &receiver{docs: map[string]held{}} }

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, err := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), "/docs/"))
	if err != nil {
		http.Error(w, "bad id", http.StatusBadRequest)
		return
	}
	var ver change.Version
	if _, err := fmt.Sscanf(r.Header.Get(HeaderVersion), "%d.%d", &ver.Generation, &ver.Counter); err != nil {
		http.Error(w, "bad version", http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	cur, known := rc.docs[id]
	if known && ver.Compare(cur.version) <= 0 {
		w.WriteHeader(http.StatusOK) // already holds this or a newer version
		return
	}
	switch r.Method {
	case http.MethodPut:
		rc.docs[id] = held{version: ver, rev: r.Header.Get(HeaderRev)}
		w.WriteHeader(http.StatusNoContent)
	case http.MethodDelete:
		rc.docs[id] = held{version: ver, rev: r.Header.Get(HeaderRev), deleted: true}
		if !known || cur.deleted {
			w.WriteHeader(http.StatusNotFound) // exercises "404 on DELETE is success"
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
	}
}

func (rc *receiver) state(_ *testing.T, id string) (string, bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	d, ok := rc.docs[id]
	if !ok || d.deleted {
		return "", false
	}
	return d.rev, true
}

func TestConformance(t *testing.T) {
	t.Parallel()
	delivertest.Run(t, delivertest.Harness{
		New: func(t *testing.T) (deliver.Sink, delivertest.StateFunc) {
			rc := newReceiver()
			srv := serve(t, rc)
			return newSink(t, config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}"}, Credentials{}), rc.state
		},
	})
}

func newSink(t *testing.T, out config.HTTPOutput, creds Credentials) *Sink {
	t.Helper()
	s, err := New(out, creds, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// serve starts a test server of h, closed when the test ends.
func serve(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// seen is what a recording server saw of one request.
type seen struct {
	Method, RequestURI, RawPath string
	ID                          string // the id decoded from the escaped path
	Header                      http.Header
	Body                        string
}

type recorder struct {
	mu   sync.Mutex
	reqs []seen
}

func (rec *recorder) handler(status int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		id, _ := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), "/docs/"))
		rec.mu.Lock()
		rec.reqs = append(rec.reqs, seen{Method: r.Method, RequestURI: r.RequestURI, RawPath: r.URL.RawPath, ID: id, Header: r.Header.Clone(), Body: string(b)})
		rec.mu.Unlock()
		w.WriteHeader(status)
	}
}

func (rec *recorder) all() []seen {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]seen(nil), rec.reqs...)
}

func mustApply(t *testing.T, s *Sink, batch ...*change.Envelope) {
	t.Helper()
	for i, err := range s.Apply(t.Context(), batch) {
		if err != nil {
			t.Fatalf("change %d (%s): %v", i, batch[i].DocID, err)
		}
	}
}

func TestRequest(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	srv := serve(t, rec.handler(http.StatusCreated))

	s := newSink(t, config.HTTPOutput{
		URL:     srv.URL + "/docs/{doc_id}",
		Headers: map[string]config.HeaderValue{"X-Api-Team": {Value: "search"}},
	}, Credentials{})
	c := live("doc-1", "2-abc", v(3, 17))
	c.Seq = json.RawMessage(`[ 12, "g1AAAA" ]`)
	mustApply(t, s, c, deleted("doc-2", "5-def", v(3, 18)))

	reqs := rec.all()
	if len(reqs) != 2 {
		t.Fatalf("server saw %d requests, want 2", len(reqs))
	}
	byMethod := map[string]seen{}
	for _, r := range reqs {
		byMethod[r.Method] = r
	}
	put, del := byMethod[http.MethodPut], byMethod[http.MethodDelete]

	if put.RequestURI != "/docs/doc-1" || put.Body != string(c.Doc) {
		t.Errorf("PUT %s with body %s, want /docs/doc-1 with the document", put.RequestURI, put.Body)
	}
	wantHeaders := map[string]string{
		"Content-Type":       "application/json",
		"X-Api-Team":         "search",
		HeaderRev:            "2-abc",
		HeaderSeq:            `[12,"g1AAAA"]`,
		HeaderVersion:        "3.17",
		HeaderJob:            delivertest.Job,
		HeaderOutput:         delivertest.Output,
		HeaderIdempotencyKey: IdempotencyKey(c),
		"Authorization":      "",
	}
	for k, want := range wantHeaders {
		if got := put.Header.Get(k); got != want {
			t.Errorf("PUT header %s = %q, want %q", k, got, want)
		}
	}
	if del.RequestURI != "/docs/doc-2" || del.Body != "" || del.Header.Get(HeaderRev) != "5-def" || del.Header.Get(HeaderVersion) != "3.18" {
		t.Errorf("DELETE %s rev %q version %q body %q, want /docs/doc-2 rev 5-def version 3.18 and no body",
			del.RequestURI, del.Header.Get(HeaderRev), del.Header.Get(HeaderVersion), del.Body)
	}
	if del.Header.Get("Content-Type") != "" {
		t.Errorf("DELETE has Content-Type %q, want none", del.Header.Get("Content-Type"))
	}
}

func TestMethods(t *testing.T) {
	t.Parallel()
	tests := []struct {
		method  string
		change  *change.Envelope
		want    string
		removed bool
	}{
		{method: "", change: live("a", "1-a", v(1, 1)), want: http.MethodPut},
		{method: "post", change: live("a", "1-a", v(1, 1)), want: http.MethodPost},
		{method: "PATCH", change: live("a", "1-a", v(1, 1)), want: http.MethodPatch},
		{method: "POST", change: deleted("a", "2-a", v(1, 2)), want: http.MethodDelete},
		{method: "PUT", change: delivertest.Removed("a", "1-a", v(1, 2)), want: http.MethodDelete},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.want, func(t *testing.T) {
			t.Parallel()
			rec := &recorder{}
			srv := serve(t, rec.handler(http.StatusOK))
			mustApply(t, newSink(t, config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}", Method: tt.method}, Credentials{}), tt.change)
			if reqs := rec.all(); len(reqs) != 1 || reqs[0].Method != tt.want {
				t.Errorf("server saw %+v, want one %s", reqs, tt.want)
			}
		})
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		auth  *config.Auth
		creds Credentials
		want  string
	}{
		{name: "basic", auth: &config.Auth{Type: "basic", Username: "cfg-user"}, creds: Credentials{Password: "s3cret"},
			want: "Basic " + b64("cfg-user:s3cret")},
		{name: "basic with resolved username", auth: &config.Auth{Type: "basic", Username: "cfg-user"}, creds: Credentials{Username: "u", Password: "p"},
			want: "Basic " + b64("u:p")},
		{name: "bearer", auth: &config.Auth{Type: "bearer"}, creds: Credentials{Token: "tok-123"}, want: "Bearer tok-123"},
		{name: "none", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := &recorder{}
			srv := serve(t, rec.handler(http.StatusOK))
			mustApply(t, newSink(t, config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}", Auth: tt.auth}, tt.creds), live("a", "1-a", v(1, 1)))
			if got := rec.all()[0].Header.Get("Authorization"); got != tt.want {
				t.Errorf("Authorization = %q, want %q", got, tt.want)
			}
		})
	}
}

func b64(s string) string {
	r := &http.Request{Header: http.Header{}}
	user, pass, _ := strings.Cut(s, ":")
	r.SetBasicAuth(user, pass)
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic ")
}

func TestEscaping(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	srv := serve(t, rec.handler(http.StatusNoContent))
	s := newSink(t, config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}"}, Credentials{})

	tests := []struct {
		id      string
		wantURI string
	}{
		{"plain", "/docs/plain"},
		{"a/b", "/docs/a%2Fb"},
		{"_design/view", "/docs/_design%2Fview"},
		{"../../etc/passwd", "/docs/..%2F..%2Fetc%2Fpasswd"},
		{"a.b", "/docs/a.b"},
		{"é✓日本", "/docs/%C3%A9%E2%9C%93%E6%97%A5%E6%9C%AC"},
		{"a?b=c", "/docs/a%3Fb=c"},
		{"a#frag", "/docs/a%23frag"},
		{"100%", "/docs/100%25"},
		{"%2F", "/docs/%252F"},
		{"a b+c", "/docs/a%20b%2Bc"}, // '+' escaped: some servers read it as a space
		{"...", "/docs/%2E%2E%2E"},
		{"semi;colon,comma", "/docs/semi%3Bcolon%2Ccomma"},
		{"tab\there\nnl", "/docs/tab%09here%0Anl"},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			t.Parallel()
			mustApply(t, s, live(tt.id, "1-a", v(1, 1)))
			var got *seen
			for _, r := range rec.all() {
				if r.RequestURI == tt.wantURI {
					got = &r
				}
			}
			if got == nil {
				t.Fatalf("no request for %q reached %s; server saw %v", tt.id, tt.wantURI, uris(rec.all()))
			}
			if got.ID != tt.id {
				t.Errorf("server decoded the id as %q, want %q", got.ID, tt.id)
			}
		})
	}
}

func uris(reqs []seen) []string {
	var out []string
	for _, r := range reqs {
		out = append(out, r.RequestURI)
	}
	return out
}

func TestQueryTemplate(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got url.Values
	var path string
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got, path = r.URL.Query(), r.URL.EscapedPath()
		mu.Unlock()
	}))
	s := newSink(t, config.HTTPOutput{URL: srv.URL + "/ingest/{doc_id}?id={doc_id}&source=couch"}, Credentials{})
	id := "a&b=c d/é?#"
	mustApply(t, s, live(id, "1-a", v(1, 1)))
	mu.Lock()
	defer mu.Unlock()
	if got.Get("id") != id || got.Get("source") != "couch" || len(got) != 2 {
		t.Errorf("query = %v, want id=%q and source=couch only", got, id)
	}
	if want := "/ingest/" + url.PathEscape(id); path != want {
		t.Errorf("path = %s, want %s", path, want)
	}
}

func TestStatusClassification(t *testing.T) {
	t.Parallel()
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The document id is the status to answer with.
		status, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/docs/"))
		if err != nil {
			status = http.StatusTeapot
		}
		w.Header().Set("Location", "/elsewhere")
		w.WriteHeader(status)
		fmt.Fprint(w, "secret body the error must not quote")
	}))
	s := newSink(t, config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}"}, Credentials{})

	tests := []struct {
		status    int
		tombstone bool
		want      deliver.Class // "" for success
	}{
		{status: 200}, {status: 201}, {status: 202}, {status: 204},
		{status: 500, want: deliver.Transient},
		{status: 502, want: deliver.Transient},
		{status: 503, want: deliver.Transient},
		{status: 429, want: deliver.Transient},
		{status: 408, want: deliver.Transient},
		{status: 400, want: deliver.Permanent},
		{status: 401, want: deliver.Permanent},
		{status: 403, want: deliver.Permanent},
		{status: 404, want: deliver.Permanent},
		{status: 409, want: deliver.Permanent},
		{status: 422, want: deliver.Permanent},
		{status: 301, want: deliver.Permanent},
		{status: 308, want: deliver.Permanent},
		{status: 404, tombstone: true},
		{status: 410, tombstone: true},
		{status: 500, tombstone: true, want: deliver.Transient},
		{status: 400, tombstone: true, want: deliver.Permanent},
	}
	for _, tt := range tests {
		name := strconv.Itoa(tt.status)
		if tt.tombstone {
			name = "DELETE " + name
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := live(strconv.Itoa(tt.status), "1-a", v(1, 1))
			if tt.tombstone {
				c = deleted(strconv.Itoa(tt.status), "2-a", v(1, 2))
			}
			err := s.Apply(t.Context(), []*change.Envelope{c})[0]
			if tt.want == "" {
				if err != nil {
					t.Fatalf("got %v, want success", err)
				}
				return
			}
			var e *deliver.Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v, want a *deliver.Error", err)
			}
			got := deliver.Error{Class: e.Class, Reason: e.Reason, HTTPStatus: e.HTTPStatus}
			want := deliver.Error{Class: tt.want, Reason: "http_status", HTTPStatus: tt.status}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("error %v (-want +got):\n%s", err, diff)
			}
			if strings.Contains(err.Error(), "secret body") {
				t.Errorf("error quotes the response body: %v", err)
			}
		})
	}
}

func TestRedirects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		follow    bool
		status    int
		want      deliver.Class
		wantMoved string // method the redirect target saw, "" for none
	}{
		{name: "301 not followed", status: 301, want: deliver.Permanent},
		{name: "307 not followed", status: 307, want: deliver.Permanent},
		{name: "307 followed", follow: true, status: 307, wantMoved: http.MethodPut},
		{name: "308 followed", follow: true, status: 308, wantMoved: http.MethodPut},
		// Go would turn the PUT into a GET; never count that as delivered.
		{name: "301 never followed", follow: true, status: 301, want: deliver.Permanent},
		{name: "303 never followed", follow: true, status: 303, want: deliver.Permanent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var moved []string
			var movedBody string
			mux := http.NewServeMux()
			mux.HandleFunc("/docs/", func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "/moved/"+strings.TrimPrefix(r.URL.Path, "/docs/"), tt.status)
			})
			mux.HandleFunc("/moved/", func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				moved = append(moved, r.Method)
				movedBody = string(b)
				mu.Unlock()
			})
			srv := serve(t, mux)

			c := live("a", "1-a", v(1, 1))
			err := newSink(t, config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}", FollowRedirects: tt.follow}, Credentials{}).
				Apply(t.Context(), []*change.Envelope{c})[0]
			if got := deliver.Classify(err); (err == nil) != (tt.want == "") || (err != nil && (got.Class != tt.want || got.HTTPStatus != tt.status)) {
				t.Errorf("got %v, want class %q with status %d", err, tt.want, tt.status)
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case tt.wantMoved == "" && len(moved) > 0:
				t.Errorf("redirect target saw %v, want no request", moved)
			case tt.wantMoved != "" && (len(moved) != 1 || moved[0] != tt.wantMoved || movedBody != string(c.Doc)):
				t.Errorf("redirect target saw %v with body %q, want one %s with the document", moved, movedBody, tt.wantMoved)
			}
		})
	}
}

// slowServer answers only when the client gives up; started receives one
// value per request that reached the handler.
func slowServer(t *testing.T) (*httptest.Server, <-chan struct{}) {
	started := make(chan struct{}, 16)
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Reading the body to the end lets the server notice a client that
		// goes away, which cancels r.Context.
		_, _ = io.Copy(io.Discard, r.Body)
		started <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}))
	return srv, started
}

func TestTimeoutAndCancellation(t *testing.T) {
	t.Parallel()
	t.Run("request timeout", func(t *testing.T) {
		t.Parallel()
		srv, _ := slowServer(t)
		s := newSink(t, config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}", Timeout: config.Duration(100 * time.Millisecond)}, Credentials{})
		begin := time.Now()
		err := s.Apply(t.Context(), []*change.Envelope{live("slow", "1-a", v(1, 1))})[0]
		if e := deliver.Classify(err); err == nil || e.Class != deliver.Transient || e.Reason != "timeout" {
			t.Errorf("got %v, want a transient timeout", err)
		}
		if took := time.Since(begin); took > 3*time.Second {
			t.Errorf("Apply took %s with a 100ms timeout", took)
		}
	})

	t.Run("context cancelled mid-request", func(t *testing.T) {
		t.Parallel()
		srv, started := slowServer(t)
		s := newSink(t, config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}"}, Credentials{})
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			<-started
			cancel()
		}()
		begin := time.Now()
		errs := s.Apply(ctx, []*change.Envelope{live("a", "1-a", v(1, 1)), deleted("b", "1-b", v(1, 2))})
		for i, err := range errs {
			if e := deliver.Classify(err); err == nil || e.Class != deliver.Transient {
				t.Errorf("change %d: got %v, want transient", i, err)
			}
		}
		if took := time.Since(begin); took > 3*time.Second {
			t.Errorf("Apply took %s after cancellation", took)
		}
	})
}

func TestConnectionRefused(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	addr := l.Addr().String()
	l.Close()
	s := newSink(t, config.HTTPOutput{URL: "http://" + addr + "/docs/{doc_id}?api_key=k-123"}, Credentials{})
	err = s.Apply(t.Context(), []*change.Envelope{live("a", "1-a", v(1, 1))})[0]
	if e := deliver.Classify(err); err == nil || e.Class != deliver.Transient || e.Reason != "connection" {
		t.Errorf("got %v, want a transient connection error", err)
	}
	if err != nil && strings.Contains(err.Error(), "k-123") {
		t.Errorf("error quotes the URL query: %v", err)
	}
}

// gauge counts the requests a test server is handling and keeps the highest
// count seen.
type gauge struct {
	mu        sync.Mutex
	now, most int
}

func (g *gauge) enter() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.now++
	g.most = max(g.most, g.now)
}

func (g *gauge) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.now--
}

// peak returns the highest number of requests handled at once.
func (g *gauge) peak() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.most
}

func TestParallelism(t *testing.T) {
	t.Parallel()
	var inFlight gauge
	var mu sync.Mutex
	order := map[string][]string{}
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inFlight.enter()
		defer inFlight.leave()
		mu.Lock()
		id := strings.TrimPrefix(r.URL.Path, "/docs/")
		order[id] = append(order[id], r.Header.Get(HeaderVersion))
		mu.Unlock()
		time.Sleep(30 * time.Millisecond)
	}))
	s := newSink(t, config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}"}, Credentials{})

	var batch []*change.Envelope
	for i := range 30 {
		batch = append(batch, live(fmt.Sprintf("doc-%d", i), "1-a", v(1, int64(100+i))))
	}
	// Three changes of one document, newest first (ordering none): sent one
	// at a time, oldest first.
	batch = append(batch, live("same", "3-c", v(1, 3)), live("same", "1-a", v(1, 1)), deleted("same", "2-b", v(1, 2)))
	mustApply(t, s, batch...)

	if p := inFlight.peak(); p > Parallelism || p < 2 {
		t.Errorf("peak concurrency %d, want between 2 and %d", p, Parallelism)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]string{"1.1", "1.2", "1.3"}, order["same"]); diff != "" {
		t.Errorf("versions of one document in send order (-want +got):\n%s", diff)
	}
}

func TestCredentialsNeverShown(t *testing.T) {
	t.Parallel()
	creds := Credentials{Username: "user", Password: "pa55word", Token: "t0ken"}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("resolved", "creds", creds)
	for _, text := range []string{fmt.Sprint(creds), fmt.Sprintf("%+v", creds), fmt.Sprintf("%#v", creds), logged.String()} {
		if strings.Contains(text, "pa55word") || strings.Contains(text, "t0ken") {
			t.Errorf("credentials shown: %s", text)
		}
	}

	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
	}))
	s := newSink(t, config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}", Auth: &config.Auth{Type: "bearer"}}, Credentials{Token: "t0ken"})
	err := s.Apply(t.Context(), []*change.Envelope{live("a", "1-a", v(1, 1))})[0]
	if err == nil || strings.Contains(fmt.Sprintf("%+v", err), "t0ken") {
		t.Errorf("got %v, want a 401 failure that does not show the token", err)
	}
	if _, err := New(config.HTTPOutput{URL: "ftp://x/{doc_id}", Auth: &config.Auth{Type: "basic"}}, creds, nil); err == nil || strings.Contains(err.Error(), "pa55word") {
		t.Errorf("New error %v: want an error that does not show the password", err)
	}
}

// New refuses a bad output or bad credentials, and its error never shows a
// secret.
func TestNewRejects(t *testing.T) {
	t.Parallel()
	ref := &config.SecretRef{Env: "X"}
	tests := []struct {
		name  string
		out   config.HTTPOutput
		creds Credentials
		want  string
	}{
		{name: "no url", want: "url is empty"},
		{name: "not http", out: config.HTTPOutput{URL: "ftp://h/{doc_id}"}, want: "http://"},
		{name: "id in host", out: config.HTTPOutput{URL: "http://{doc_id}.example.com/x"}, want: "host"},
		{name: "fragment", out: config.HTTPOutput{URL: "http://h/docs/{doc_id}#x"}, want: "fragment"},
		{name: "credentials in url", out: config.HTTPOutput{URL: "http://u:p@h/{doc_id}"}, want: "credentials"},
		{name: "unescaped path", out: config.HTTPOutput{URL: "http://h/my docs/{doc_id}"}, want: "percent-encoded"},
		{name: "dot-dot segment", out: config.HTTPOutput{URL: "http://h/docs/../{doc_id}"}, want: `"." or ".." segment`},
		{name: "dot segment at the end", out: config.HTTPOutput{URL: "http://h/docs/{doc_id}/."}, want: `"." or ".." segment`},
		{name: "method", out: config.HTTPOutput{URL: "http://h/{doc_id}", Method: "DELETE"}, want: "method"},
		{name: "reserved header", out: config.HTTPOutput{URL: "http://h/{doc_id}", Headers: map[string]config.HeaderValue{"x-changes-version": {Value: "1"}}}, want: "x-changes-version"},
		{name: "authorization header", out: config.HTTPOutput{URL: "http://h/{doc_id}", Headers: map[string]config.HeaderValue{"Authorization": {Value: "Bearer x"}}}, want: "Authorization"},
		{name: "basic without password", out: config.HTTPOutput{URL: "http://h/{doc_id}", Auth: &config.Auth{Type: "basic", Username: "u"}}, want: "basic auth"},
		{name: "bearer without token", out: config.HTTPOutput{URL: "http://h/{doc_id}", Auth: &config.Auth{Type: "bearer"}}, want: "bearer auth"},
		{name: "credentials without auth", out: config.HTTPOutput{URL: "http://h/{doc_id}"}, creds: Credentials{Token: "x"}, want: "without auth"},
		{name: "unresolved header", out: config.HTTPOutput{URL: "http://h/{doc_id}", Headers: map[string]config.HeaderValue{"X-Api-Key": {Ref: ref}}},
			want: "header X-Api-Key: its secret reference is not resolved"},
		{name: "resolved header splitting lines", out: config.HTTPOutput{URL: "http://h/{doc_id}", Headers: map[string]config.HeaderValue{"X-Api-Key": {Ref: ref}}},
			creds: Credentials{Headers: map[string]string{"X-Api-Key": "S3CR3T\r\nX-Evil: 1"}}, want: "header X-Api-Key: the resolved value holds control characters"},
		{name: "unresolved url secret", out: config.HTTPOutput{URL: "http://h/{secret}/{doc_id}", URLSecret: ref}, want: "url_secret is not resolved"},
		{name: "url secret not path-safe", out: config.HTTPOutput{URL: "http://h/{secret}/{doc_id}", URLSecret: ref},
			creds: Credentials{URLSecret: "S3CR3T?x=1"}, want: "url_secret in the path"},
		{name: "url secret as a dot segment", out: config.HTTPOutput{URL: "http://h/{secret}/{doc_id}", URLSecret: ref},
			creds: Credentials{URLSecret: "S3CR3T/.."}, want: "url_secret in the path"},
		{name: "placeholder without url_secret", out: config.HTTPOutput{URL: "http://h/{secret}/{doc_id}"}, creds: Credentials{URLSecret: "S3CR3T"},
			want: "{secret} needs url_secret"},
		{name: "placeholder in host", out: config.HTTPOutput{URL: "http://{secret}.h/{doc_id}", URLSecret: ref}, creds: Credentials{URLSecret: "S3CR3T"},
			want: "host"},
		{name: "fragment after a literal query", out: config.HTTPOutput{URL: "http://h/{doc_id}?key=S3CR3T#frag"}, want: "fragment"},
		{name: "bad scheme with a literal query", out: config.HTTPOutput{URL: "ftp://h/{doc_id}?key=S3CR3T"}, want: "http://"},
		{name: "bad scheme with credentials", out: config.HTTPOutput{URL: "ftp://u:S3CR3T@h/{doc_id}"}, want: "http://"},
		{name: "fragment with credentials", out: config.HTTPOutput{URL: "http://u:S3CR3T@h/{doc_id}#x"}, want: "fragment"},
		{name: "no scheme, credentials", out: config.HTTPOutput{URL: "u:S3CR3T@h/{doc_id}"}, want: "http://"},
		{name: "credentials with a '/' in the password", out: config.HTTPOutput{URL: "http://u:123/S3CR3T@h/{doc_id}"}, want: "credentials"},
		{name: "credentials with a '?' in the password", out: config.HTTPOutput{URL: "http://u:123?S3CR3T@h/{doc_id}"}, want: "credentials"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := New(tt.out, tt.creds, nil)
			delivertest.CheckNew(t, err, tt.want)
			if err != nil && strings.Contains(err.Error(), "S3CR3T") {
				t.Errorf("New error shows the secret: %v", err)
			}
		})
	}
}

func TestNewKeepsCallerClient(t *testing.T) {
	t.Parallel()
	client := &http.Client{Timeout: time.Minute}
	if _, err := New(config.HTTPOutput{URL: "http://h/{doc_id}"}, Credentials{}, client); err != nil {
		t.Fatalf("New: %v", err)
	}
	if client.CheckRedirect != nil {
		t.Error("New changed the caller's client")
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	base := live("a", "1-a", v(2, 7))
	tests := []struct {
		name string
		c    *change.Envelope
		same bool
	}{
		{name: "redelivery", c: live("a", "1-a", v(2, 7)), same: true},
		{name: "same version as a tombstone", c: deleted("a", "9-z", v(2, 7)), same: true},
		{name: "other counter", c: live("a", "1-a", v(2, 8))},
		{name: "other generation", c: live("a", "1-a", v(3, 7))},
		{name: "other document", c: live("b", "1-a", v(2, 7))},
		{name: "other output", c: func() *change.Envelope { c := live("a", "1-a", v(2, 7)); c.Output = "out-2"; return c }()},
		{name: "fields do not run together", c: func() *change.Envelope {
			c := live("a", "1-a", v(2, 7))
			c.Job, c.Output = base.Job+base.Output[:1], base.Output[1:]
			return c
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := IdempotencyKey(tt.c) == IdempotencyKey(base); got != tt.same {
				t.Errorf("same key = %v, want %v", got, tt.same)
			}
		})
	}
}

func TestHeaderValue(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"2-abc", "2-abc"},
		{"a\r\nX-Evil: 1", `a\u000d\u000aX-Evil: 1`},
		{"é", `\u00e9`},
		{"😀", `\ud83d\ude00`},
	}
	for _, tt := range tests {
		if got := headerValue(tt.in); got != tt.want {
			t.Errorf("headerValue(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestRedirectsStayOnOrigin follows a redirect only to the same scheme, host
// and port: anywhere else the credentials, the custom headers and the body
// would go to a peer the output never named. Such a change fails for good,
// with a reason, and the other peer sees nothing.
func TestRedirectsStayOnOrigin(t *testing.T) {
	t.Parallel()
	// hit is what the other peer received; never the values themselves.
	type hit struct {
		Authorization, Custom bool
		BodyBytes             int
	}
	// elsewhere records every request it gets.
	elsewhere := func(t *testing.T) (*httptest.Server, func() []hit) {
		var mu sync.Mutex
		var hits []hit
		srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			hits = append(hits, hit{Authorization: r.Header.Get("Authorization") != "", Custom: r.Header.Get("X-Api-Key") != "", BodyBytes: len(b)})
			mu.Unlock()
		}))
		return srv, func() []hit {
			mu.Lock()
			defer mu.Unlock()
			return append([]hit(nil), hits...)
		}
	}
	redirector := func(target string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", target+r.URL.EscapedPath())
			w.WriteHeader(http.StatusTemporaryRedirect)
		})
	}
	port := func(srv *httptest.Server) string {
		u, _ := url.Parse(srv.URL)
		return u.Port()
	}
	tests := []struct {
		name  string
		start func(t *testing.T, target *httptest.Server) *httptest.Server
	}{
		{
			name: "https to http on another port",
			start: func(t *testing.T, target *httptest.Server) *httptest.Server {
				srv := httptest.NewTLSServer(redirector("http://127.0.0.1:" + port(target)))
				t.Cleanup(srv.Close)
				return srv
			},
		},
		{
			name: "same scheme and host, another port",
			start: func(t *testing.T, target *httptest.Server) *httptest.Server {
				return serve(t, redirector("http://127.0.0.1:"+port(target)))
			},
		},
		{
			name: "another host",
			start: func(t *testing.T, target *httptest.Server) *httptest.Server {
				return serve(t, redirector("http://localhost:"+port(target)))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			other, hits := elsewhere(t)
			origin := tt.start(t, other)
			out := config.HTTPOutput{
				URL: origin.URL + "/docs/{doc_id}", FollowRedirects: true,
				Auth:    &config.Auth{Type: "bearer"},
				Headers: map[string]config.HeaderValue{"X-Api-Key": {Ref: &config.SecretRef{Env: "API_KEY"}}},
			}
			s, err := New(out, Credentials{Token: "t0ken", Headers: map[string]string{"X-Api-Key": "k-1"}}, origin.Client())
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			c := live("a", "1-a", v(1, 1))
			err = s.Apply(t.Context(), []*change.Envelope{c})[0]
			e := deliver.Classify(err)
			if err == nil || e.Class != deliver.Permanent || e.Reason != "redirect_refused" || e.HTTPStatus != http.StatusTemporaryRedirect {
				t.Errorf("got %v, want a permanent redirect_refused failure with status 307", err)
			}
			if err != nil && !strings.Contains(err.Error(), "same scheme, host and port") {
				t.Errorf("error %q does not say which redirects are followed", err)
			}
			if got := hits(); len(got) > 0 {
				t.Errorf("the redirect target received %d request(s), first %+v; want none", len(got), got[0])
			}
		})
	}
}

// TestErrorsNameTheTemplate: errors (which become DLQ attributes and log
// lines) show the configured URL template without its query, never the URL
// a change was sent to.
func TestErrorsNameTheTemplate(t *testing.T) {
	t.Parallel()
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	}))
	s := newSink(t, config.HTTPOutput{URL: srv.URL + "/hooks/team-1/{doc_id}?sig=q-1"}, Credentials{})
	err := s.Apply(t.Context(), []*change.Envelope{live("the-doc", "1-a", v(1, 1))})[0]
	if err == nil {
		t.Fatal("Apply succeeded against a 500")
	}
	if want := "PUT " + srv.URL + "/hooks/team-1/{doc_id}: status 500"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not contain %q", err, want)
	}
	for _, built := range []string{"/hooks/team-1/the-doc", "q-1"} {
		if strings.Contains(err.Error(), built) {
			t.Errorf("error %q shows %q of the URL the change was sent to", err, built)
		}
	}
}

// TestSecretHeadersAndURL: header values and the {secret} part of the URL
// come resolved in Credentials; they reach the endpoint and never an error.
func TestSecretHeadersAndURL(t *testing.T) {
	t.Parallel()
	const pathSecret, keySecret = "T0S3CR3T/B0S3CR3T", "k-S3CR3T"
	var mu sync.Mutex
	var paths, keys, sources []string
	status := http.StatusOK
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		paths = append(paths, r.URL.EscapedPath()+"?"+r.URL.RawQuery)
		keys = append(keys, r.Header.Get("X-Api-Key"))
		sources = append(sources, r.Header.Get("X-Source"))
		w.WriteHeader(status)
	}))
	out := config.HTTPOutput{
		URL:       srv.URL + "/hooks/{secret}/{doc_id}?id={doc_id}",
		URLSecret: &config.SecretRef{Env: "HOOK"},
		Headers: map[string]config.HeaderValue{
			"X-Api-Key": {Ref: &config.SecretRef{Env: "API_KEY"}},
			"X-Source":  {Value: "test"},
		},
	}
	creds := Credentials{URLSecret: pathSecret, Headers: map[string]string{"X-Api-Key": keySecret}}
	s, err := New(out, creds, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	mustApply(t, s, live("a b", "1-a", v(1, 1)))
	mu.Lock()
	got := []string{paths[0], keys[0], sources[0]}
	status = http.StatusBadRequest
	mu.Unlock()
	if diff := cmp.Diff([]string{"/hooks/" + pathSecret + "/a%20b?id=a+b", keySecret, "test"}, got); diff != "" {
		t.Errorf("request path, X-Api-Key, X-Source (-want +got):\n%s", diff)
	}

	err = s.Apply(t.Context(), []*change.Envelope{live("a b", "2-a", v(1, 2))})[0]
	if err == nil {
		t.Fatal("Apply succeeded against a 400")
	}
	for _, secret := range []string{"S3CR3T", keySecret} {
		if strings.Contains(fmt.Sprintf("%+v", err), secret) {
			t.Errorf("error %q shows a secret", err)
		}
	}
	if want := srv.URL + "/hooks/{secret}/{doc_id}"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name the template %s", err, want)
	}
	if text := fmt.Sprintf("%v %+v %#v", creds, creds, creds); strings.Contains(text, "S3CR3T") {
		t.Errorf("credentials formatted show a secret: %s", text)
	}
}

func TestBackpressureSignals(t *testing.T) {
	t.Parallel()
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The document id is "status" or "status-retryafter".
		status, after, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/docs/"), "-")
		code, _ := strconv.Atoi(status)
		if after != "" {
			w.Header().Set("Retry-After", after)
		}
		w.WriteHeader(code)
	}))
	s := newSink(t, config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}"}, Credentials{})
	tests := []struct {
		id       string
		backoff  bool
		retryIn  time.Duration
		wantFail bool
	}{
		{id: "429-7", backoff: true, retryIn: 7 * time.Second, wantFail: true},
		{id: "503-2", backoff: true, retryIn: 2 * time.Second, wantFail: true},
		{id: "429", backoff: true, wantFail: true},
		{id: "500-9", wantFail: true},
		{id: "502", wantFail: true},
		{id: "200-5"},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			t.Parallel()
			err := s.Apply(t.Context(), []*change.Envelope{live(tt.id, "1-a", v(1, 1))})[0]
			if (err != nil) != tt.wantFail {
				t.Fatalf("got %v, want failure %v", err, tt.wantFail)
			}
			if err == nil {
				return
			}
			var e *deliver.Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v, want a *deliver.Error", err)
			}
			if e.Backpressure != tt.backoff || e.RetryAfter != tt.retryIn || e.Class != deliver.Transient {
				t.Errorf("got backpressure %v retry after %v class %s, want %v %v transient", e.Backpressure, e.RetryAfter, e.Class, tt.backoff, tt.retryIn)
			}
		})
	}
}

// limitPacer caps parallelism and counts observations.
type limitPacer struct {
	limit int
	seen  atomic.Int32
}

func (p *limitPacer) Limit(int) int                { return p.limit }
func (p *limitPacer) Observe(time.Duration, error) { p.seen.Add(1) }

func TestPacerLowersParallelism(t *testing.T) {
	t.Parallel()
	var inFlight gauge
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inFlight.enter()
		defer inFlight.leave()
		time.Sleep(20 * time.Millisecond)
	}))
	s := newSink(t, config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}"}, Credentials{})
	var batch []*change.Envelope
	for i := range 12 {
		batch = append(batch, live(fmt.Sprintf("doc-%d", i), "1-a", v(1, 1)))
	}
	p := &limitPacer{limit: 2}
	ctx := deliver.WithPacer(t.Context(), p)
	for i, err := range s.Apply(ctx, batch) {
		if err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
	}
	if got := inFlight.peak(); got != 2 {
		t.Errorf("peak concurrency %d with a pacer limit of 2", got)
	}
	if got := p.seen.Load(); got != 12 {
		t.Errorf("pacer observed %d requests, want 12", got)
	}
}

// TestDotSegmentIDRefused: a document id that would make a whole path
// segment "." or ".." fails permanently and nothing is sent: RFC 3986
// §6.2.2.2 makes %2E equal to '.', so a normalising server or proxy would
// resolve the segment and reach the collection (".") or its parent ("..").
// Ids that only contain dots elsewhere, or in the query, are sent.
func TestDotSegmentIDRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, tmpl, id string
		refused        bool
	}{
		{"dot", "/docs/{doc_id}", ".", true},
		{"dot-dot", "/docs/{doc_id}", "..", true},
		{"dot-dot deleted", "/docs/{doc_id}", "..", true},
		{"two ids make dot-dot", "/docs/{doc_id}{doc_id}/x", ".", true},
		{"three dots", "/docs/{doc_id}", "...", false},
		{"dot with a suffix", "/docs/{doc_id}.json", ".", false},
		{"dot-dot in the query", "/docs?id={doc_id}", "..", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := &recorder{}
			srv := serve(t, rec.handler(http.StatusNoContent))
			s := newSink(t, config.HTTPOutput{URL: srv.URL + tt.tmpl}, Credentials{})
			c := live(tt.id, "1-a", v(1, 1))
			if strings.HasSuffix(tt.name, "deleted") {
				c = deleted(tt.id, "2-b", v(1, 2))
			}
			err := s.Apply(t.Context(), []*change.Envelope{c})[0]
			if !tt.refused {
				if err != nil || len(rec.all()) != 1 {
					t.Fatalf("id %q: error %v, %d requests; want it sent", tt.id, err, len(rec.all()))
				}
				return
			}
			var de *deliver.Error
			if !errors.As(err, &de) || de.Class != deliver.Permanent || de.Reason != "dot_segment_id" {
				t.Fatalf("id %q: error %v; want a permanent dot_segment_id error", tt.id, err)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", tt.id)) {
				t.Errorf("error %q does not name the id %q", err, tt.id)
			}
			if got := uris(rec.all()); len(got) != 0 {
				t.Errorf("id %q reached the server: %v", tt.id, got)
			}
		})
	}
}
