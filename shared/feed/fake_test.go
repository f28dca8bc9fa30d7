package feed

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
)

// fakeSource is an httptest source whose answers a test scripts request by
// request, with helpers that inject faults. It records what it was sent.
type fakeSource struct {
	t   *testing.T
	srv *httptest.Server

	mu    sync.Mutex
	seen  []seenRequest
	steps []http.HandlerFunc // answers in order; the last repeats
}

// seenRequest is what the fake was sent.
type seenRequest struct {
	Method     string
	RequestURI string // the raw path and query, exactly as sent
	Auth       string
	Body       string
}

func newFakeSource(t *testing.T, steps ...http.HandlerFunc) *fakeSource {
	t.Helper()
	f := &fakeSource{t: t, steps: steps}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeSource) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	n := len(f.seen)
	f.seen = append(f.seen, seenRequest{Method: r.Method, RequestURI: r.RequestURI, Auth: r.Header.Get("Authorization"), Body: string(b)})
	step := f.steps[min(n, len(f.steps)-1)]
	f.mu.Unlock()
	step(w, r)
}

// requests returns what the fake has been sent so far.
func (f *fakeSource) requests() []seenRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seenRequest(nil), f.seen...)
}

// db is the database URL of the fake.
func (f *fakeSource) db() string { return f.srv.URL + "/db" }

// client returns a Client on the fake; edit adjusts the options.
func (f *fakeSource) client(edit func(*Options)) *Client {
	f.t.Helper()
	return mustNew(f.t, Options{SourceType: config.SourceCouchDB, URL: f.db(), Slack: time.Second, RequestTimeout: 5 * time.Second}, edit)
}

// checkBatch fails the test when Changes failed (err), and reports how its
// batch differs from want.
func checkBatch(t *testing.T, got *Batch, err error, want *Batch) {
	t.Helper()
	if err != nil {
		t.Fatalf("Changes: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("batch (-want +got):\n%s", diff)
	}
}

// mustNew returns New(o) once the edits that are not nil adjusted o,
// failing the test when New refuses the options.
func mustNew(t testing.TB, o Options, edits ...func(*Options)) *Client {
	t.Helper()
	for _, edit := range edits {
		if edit != nil {
			edit(&o)
		}
	}
	c, err := New(o)
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	return c
}

// reply answers with a status and a body.
func reply(status int, body string) http.HandlerFunc {
	return replyType(status, "application/json", body)
}

func replyType(status int, contentType, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// hangUp drops the connection without an answer.
func hangUp(w http.ResponseWriter, _ *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, "cannot hijack: "+err.Error(), http.StatusTeapot)
		return
	}
	conn.Close()
}

// truncate promises a longer body than it sends, then drops the connection.
func truncate(body string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, "cannot hijack: "+err.Error(), http.StatusTeapot)
			return
		}
		defer conn.Close()
		buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10000\r\n\r\n")
		buf.WriteString(body)
		buf.Flush()
	}
}

// stall answers nothing until the client gives up or d passes.
func stall(d time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(d):
			reply(http.StatusOK, `{"results":[],"last_seq":0}`)(w, r)
		}
	}
}

// route answers by path (the raw, escaped path), 404 for any other.
func route(routes map[string]http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h, ok := routes[r.URL.EscapedPath()]; ok {
			h(w, r)
			return
		}
		reply(http.StatusNotFound, `{"error":"not_found","reason":"missing"}`)(w, r)
	}
}

// byRev answers a document GET by its rev query ("" for none).
func byRev(revs map[string]http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h, ok := revs[r.URL.Query().Get("rev")]; ok {
			h(w, r)
			return
		}
		reply(http.StatusNotFound, `{"error":"not_found","reason":"missing"}`)(w, r)
	}
}
