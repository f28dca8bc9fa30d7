package feed

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
)

const (
	sessionUser     = "alice"
	sessionPassword = "pw-Secret-7f3a"
)

// sessionSource is an httptest Sync Gateway that knows one user and hands
// out sessions: POST {db}/_session with the right name and password sets a
// cookie; every other request needs a live session's cookie and is answered
// 401 "Session Invalid" without one. Tests expire sessions at will.
type sessionSource struct {
	t   *testing.T
	srv *httptest.Server
	db  string // the database's path, "/db"
	// cookieName is the cookie the sign-in sets; extra is set beside it.
	cookieName, extra string
	noCookie          bool // the sign-in answers 200 without a cookie
	refuseAll         bool // every session is refused, even a new one

	mu       sync.Mutex
	sessions map[string]bool
	logins   []string // bodies of the sign-ins
	seen     []sessionRequest
}

// sessionRequest is a request other than a sign-in, as the source saw it.
type sessionRequest struct {
	Path, Cookie, Auth string
	Status             int
}

func newSessionSource(t *testing.T, edit func(*sessionSource)) *sessionSource {
	t.Helper()
	s := &sessionSource{t: t, db: "/db", cookieName: "SyncGatewaySession", sessions: map[string]bool{}}
	if edit != nil {
		edit(s)
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *sessionSource) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.Method == http.MethodPost && r.URL.Path == s.db+"/_session" {
		s.signIn(w, r)
		return
	}
	s.mu.Lock()
	c, _ := r.Cookie(s.cookieName)
	ok := c != nil && s.sessions[c.Value] && !s.refuseAll
	status := http.StatusOK
	if !ok {
		status = http.StatusUnauthorized
	}
	s.seen = append(s.seen, sessionRequest{Path: r.URL.Path, Cookie: r.Header.Get("Cookie"), Auth: r.Header.Get("Authorization"), Status: status})
	s.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":"Unauthorized","reason":"Session Invalid"}`)
		return
	}
	switch {
	case strings.HasSuffix(r.URL.Path, "/_changes") && r.URL.Query().Get("feed") == "continuous":
		io.WriteString(w, `{"seq":"1","id":"a","changes":[{"rev":"1-a"}]}`+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	case strings.HasSuffix(r.URL.Path, "/_changes"):
		io.WriteString(w, `{"results":[{"seq":"1","id":"a","changes":[{"rev":"1-a"}]}],"last_seq":"1"}`)
	case r.Method == http.MethodPost:
		b, _ := io.ReadAll(r.Body)
		w.Write(b) // echoes the body: a resent request must carry it whole
	default:
		io.WriteString(w, `{"_id":"a","_rev":"1-a","n":1}`)
	}
}

func (s *sessionSource) signIn(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var in struct{ Name, Password string }
	_ = json.Unmarshal(b, &in)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.logins = append(s.logins, string(b))
	if in.Name != sessionUser || in.Password != sessionPassword {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":"Unauthorized","reason":"Invalid login"}`)
		return
	}
	id := fmt.Sprintf("sess-%d-c0ffee", len(s.logins))
	s.sessions[id] = true
	if !s.noCookie {
		http.SetCookie(w, &http.Cookie{Name: s.cookieName, Value: id, Path: s.db, Expires: time.Now().Add(24 * time.Hour), HttpOnly: true})
		if s.extra != "" {
			http.SetCookie(w, &http.Cookie{Name: s.extra, Value: "lb-1", Path: "/"})
		}
	}
	io.WriteString(w, `{"authentication_handlers":["default","cookie"],"ok":true,"userCtx":{"channels":{"orders":1},"name":"alice"}}`)
}

// expire forgets every session, as Sync Gateway does when an administrator
// deletes a user's sessions or one reaches its time to live.
func (s *sessionSource) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.sessions)
}

func (s *sessionSource) loginCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.logins)
}

func (s *sessionSource) requests() []sessionRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sessionRequest(nil), s.seen...)
}

// requestLog records what Options.OnRequest is told.
type requestLog struct {
	mu  sync.Mutex
	ops []string
}

func (l *requestLog) note(op string, status int, _ time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ops = append(l.ops, fmt.Sprintf("%s %d", op, status))
}

func (l *requestLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ops...)
}

func (s *sessionSource) client(t *testing.T, path, password string, log *requestLog) *Client {
	t.Helper()
	o := Options{
		SourceType: config.SourceSyncGateway, URL: s.srv.URL + path, Username: sessionUser, Password: password,
		Session: true, Slack: time.Second, RequestTimeout: 5 * time.Second,
	}
	if log != nil {
		o.OnRequest = log.note
	}
	c, err := New(o)
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	return c
}

// noSecrets fails the test when err's text holds the password or a
// session id.
func noSecrets(t *testing.T, what string) {
	t.Helper()
	for _, secret := range []string{sessionPassword, "c0ffee"} {
		if strings.Contains(what, secret) {
			t.Errorf("%q shows a secret", what)
		}
	}
}

func TestSessionSignsInOnceAndSendsItsCookie(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, db, url string
		cookieName    string
		extra         string
		wantCookie    string
	}{
		{name: "database", db: "/db", url: "/db", cookieName: "SyncGatewaySession", wantCookie: "SyncGatewaySession=sess-1-c0ffee"},
		{name: "keyspace", db: "/db", url: "/db.inventory.orders/", cookieName: "SyncGatewaySession", wantCookie: "SyncGatewaySession=sess-1-c0ffee"},
		{name: "behind a path prefix", db: "/apps/db", url: "/apps/db", cookieName: "SyncGatewaySession", wantCookie: "SyncGatewaySession=sess-1-c0ffee"},
		{name: "the cookie the server names, and another it sets", db: "/db", url: "/db", cookieName: "AppSession", extra: "AWSALB", wantCookie: "AppSession=sess-1-c0ffee; AWSALB=lb-1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			src := newSessionSource(t, func(s *sessionSource) { s.db, s.cookieName, s.extra = tc.db, tc.cookieName, tc.extra })
			var log requestLog
			c := src.client(t, tc.url, sessionPassword, &log)
			ctx := t.Context()
			for range 2 {
				b, err := c.Changes(ctx, nil, time.Second)
				if err != nil {
					t.Fatalf("changes: %v", err)
				}
				if len(b.Rows) != 1 || b.Rows[0].ID != "a" {
					t.Fatalf("changes: rows %+v, want document a", b.Rows)
				}
			}
			if _, _, err := c.Get(ctx, "a"); err != nil {
				t.Fatalf("get: %v", err)
			}
			if got := src.loginCount(); got != 1 {
				t.Errorf("%d sign-ins, want 1", got)
			}
			var sent map[string]string
			if err := json.Unmarshal([]byte(src.logins[0]), &sent); err != nil {
				t.Fatalf("sign-in body %q: %v", src.logins[0], err)
			}
			if d := cmp.Diff(map[string]string{"name": sessionUser, "password": sessionPassword}, sent); d != "" {
				t.Errorf("sign-in body (-want +got):\n%s", d)
			}
			reqs := src.requests()
			if len(reqs) != 3 {
				t.Fatalf("%d requests after the sign-in, want 3: %+v", len(reqs), reqs)
			}
			for _, r := range reqs {
				if r.Cookie != tc.wantCookie || r.Auth != "" || r.Status != http.StatusOK {
					t.Errorf("%s sent Cookie %q, Authorization %q (status %d); want Cookie %q and no Authorization", r.Path, r.Cookie, r.Auth, r.Status, tc.wantCookie)
				}
			}
			if d := cmp.Diff([]string{"session 200", "changes 200", "changes 200", "get 200"}, log.list()); d != "" {
				t.Errorf("OnRequest (-want +got):\n%s", d)
			}
			noSecrets(t, c.o.String())
			noSecrets(t, fmt.Sprintf("%#v %v", c.o, c.o))
		})
	}
}

func TestSessionExpiredSignsInAgainOnce(t *testing.T) {
	t.Parallel()
	src := newSessionSource(t, nil)
	var log requestLog
	c := src.client(t, "/db", sessionPassword, &log)
	ctx := t.Context()
	if _, err := c.Changes(ctx, nil, time.Second); err != nil {
		t.Fatalf("changes: %v", err)
	}
	src.expire()
	if _, err := c.Changes(ctx, nil, time.Second); err != nil {
		t.Fatalf("changes after the session expired: %v", err)
	}
	if _, _, err := c.Get(ctx, "a"); err != nil {
		t.Fatalf("get on the new session: %v", err)
	}
	got := []string{}
	for _, r := range src.requests() {
		got = append(got, fmt.Sprintf("%s %s %d", r.Path, r.Cookie, r.Status))
	}
	want := []string{
		"/db/_changes SyncGatewaySession=sess-1-c0ffee 200",
		"/db/_changes SyncGatewaySession=sess-1-c0ffee 401",
		"/db/_changes SyncGatewaySession=sess-2-c0ffee 200",
		"/db/a SyncGatewaySession=sess-2-c0ffee 200",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("requests (-want +got):\n%s", d)
	}
	// The refused request is resent, not reported: only its outcome is.
	if d := cmp.Diff([]string{"session 200", "changes 200", "session 200", "changes 200", "get 200"}, log.list()); d != "" {
		t.Errorf("OnRequest (-want +got):\n%s", d)
	}
}

func TestSessionRefusedTwiceIsAnAuthError(t *testing.T) {
	t.Parallel()
	src := newSessionSource(t, func(s *sessionSource) { s.refuseAll = true })
	c := src.client(t, "/db", sessionPassword, nil)
	_, err := c.Changes(t.Context(), nil, time.Second)
	var se *StatusError
	if !errors.As(err, &se) || se.Op != "changes" || se.Status != http.StatusUnauthorized {
		t.Fatalf("changes: %v, want a 401 StatusError of changes", err)
	}
	if Transient(err) {
		t.Errorf("Transient(%v) = true, want false", err)
	}
	if got := src.loginCount(); got != 2 {
		t.Errorf("%d sign-ins, want 2 (the first and one more after the 401)", got)
	}
	if got := len(src.requests()); got != 2 {
		t.Errorf("%d changes requests, want 2", got)
	}
	noSecrets(t, err.Error())
}

func TestSessionSignInRefused(t *testing.T) {
	t.Parallel()
	src := newSessionSource(t, nil)
	var log requestLog
	wrong := "not-" + sessionPassword
	c := src.client(t, "/db", wrong, &log)
	ctx := t.Context()
	_, err := c.Changes(ctx, nil, time.Second)
	var se *StatusError
	if !errors.As(err, &se) || se.Op != "session" || se.Status != http.StatusUnauthorized || se.Reason != "Unauthorized: Invalid login" {
		t.Fatalf("changes: %v, want the sign-in's 401 StatusError", err)
	}
	if Transient(err) {
		t.Errorf("Transient(%v) = true, want false", err)
	}
	_, _, getErr := c.Get(ctx, "a")
	if !errors.As(getErr, &se) || se.Op != "session" {
		t.Errorf("get: %v, want the sign-in's StatusError", getErr)
	}
	if len(src.requests()) != 0 {
		t.Errorf("requests without a session reached the source: %+v", src.requests())
	}
	if d := cmp.Diff([]string{"session 401", "changes 0", "session 401", "get 0"}, log.list()); d != "" {
		t.Errorf("OnRequest (-want +got):\n%s", d)
	}
	for _, e := range []error{err, getErr} {
		noSecrets(t, e.Error())
		if strings.Contains(e.Error(), wrong) {
			t.Errorf("%q shows the password", e)
		}
	}
}

func TestSessionAnswerWithoutCookie(t *testing.T) {
	t.Parallel()
	src := newSessionSource(t, func(s *sessionSource) { s.noCookie = true })
	c := src.client(t, "/db", sessionPassword, nil)
	_, err := c.Changes(t.Context(), nil, time.Second)
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "session: malformed response: status 200 without a session cookie") {
		t.Fatalf("changes: %v, want a malformed session answer", err)
	}
	if len(src.requests()) != 0 {
		t.Errorf("requests without a session reached the source: %+v", src.requests())
	}
}

func TestSessionSharedByConcurrentRequests(t *testing.T) {
	t.Parallel()
	src := newSessionSource(t, nil)
	c := src.client(t, "/db", sessionPassword, nil)
	ctx := t.Context()
	getAll := func() {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for range 16 {
			wg.Go(func() {
				if _, _, err := c.Get(ctx, "a"); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("get: %v", err)
		}
	}
	getAll()
	if got := src.loginCount(); got != 1 {
		t.Errorf("%d sign-ins for 16 concurrent first requests, want 1", got)
	}
	src.expire()
	getAll()
	if got := src.loginCount(); got != 2 {
		t.Errorf("%d sign-ins after the session expired under 16 concurrent requests, want 2", got)
	}
}

// TestSessionResendsTheBody checks that a request refused for its session
// is resent with its whole body (the _bulk_get POST).
func TestSessionResendsTheBody(t *testing.T) {
	t.Parallel()
	src := newSessionSource(t, nil)
	c := src.client(t, "/db", sessionPassword, nil)
	ctx := t.Context()
	post := func() string {
		t.Helper()
		body := []byte(`{"docs":[{"id":"a"}]}`)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, src.srv.URL+"/db/_bulk_get", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.hc.Do(req)
		if err != nil {
			t.Fatalf("post: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("post: %d %s", resp.StatusCode, b)
		}
		return string(b)
	}
	post()
	src.expire()
	if got, want := post(), `{"docs":[{"id":"a"}]}`; got != want {
		t.Errorf("resent body %q, want %q", got, want)
	}
	if got := src.loginCount(); got != 2 {
		t.Errorf("%d sign-ins, want 2", got)
	}
}

func TestSessionStreamSignsInAgain(t *testing.T) {
	t.Parallel()
	src := newSessionSource(t, nil)
	c := src.client(t, "/db", sessionPassword, nil)
	ctx := t.Context()
	if _, err := c.Changes(ctx, nil, time.Second); err != nil {
		t.Fatalf("changes: %v", err)
	}
	src.expire()
	st, err := c.Stream(ctx, nil, StreamOptions{Mode: config.ModeContinuous, Heartbeat: time.Minute})
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	defer st.Close()
	b, err := st.Next(ctx, 5*time.Second)
	if err != nil || len(b.Rows) != 1 || b.Rows[0].ID != "a" {
		t.Fatalf("stream next: %+v, %v; want document a", b, err)
	}
	reqs := src.requests()
	if last := reqs[len(reqs)-1]; last.Cookie != "SyncGatewaySession=sess-2-c0ffee" || last.Status != http.StatusOK {
		t.Errorf("the stream was opened with %+v, want the second session", last)
	}
}

func TestSessionOptions(t *testing.T) {
	t.Parallel()
	base := Options{SourceType: config.SourceSyncGateway, URL: "http://sg:4984/db", Username: "alice", Password: sessionPassword, Session: true}
	tests := []struct {
		name string
		edit func(*Options)
		want string // a part of the error; "" when valid
	}{
		{name: "sync gateway", edit: func(*Options) {}},
		{name: "app services", edit: func(o *Options) { o.SourceType = config.SourceAppServices }},
		{name: "couchdb", edit: func(o *Options) { o.SourceType = config.SourceCouchDB }, want: `session: only a sync_gateway or app_services source has sessions, not "couchdb"`},
		{name: "edge server", edit: func(o *Options) { o.SourceType = config.SourceEdgeServer }, want: `not "edge_server"`},
		{name: "no username", edit: func(o *Options) { o.Username = "" }, want: "username: required for a session"},
		{name: "no password", edit: func(o *Options) { o.Password = "" }, want: "password: required for a session"},
		{name: "and a token", edit: func(o *Options) { o.Token = "tok" }, want: "auth: set either username/password or token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := base
			tc.edit(&o)
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate: %v, want %q", err, tc.want)
			}
			if err != nil {
				noSecrets(t, err.Error())
			}
		})
	}
	if got, want := base.String(), "auth=session alice:[redacted]"; !strings.Contains(got, want) {
		t.Errorf("String() = %q, want it to hold %q", got, want)
	}
}

func TestSessionURL(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"http://sg:4984/db", "http://sg:4984/db/_session"},
		{"http://sg:4984/db/", "http://sg:4984/db/_session"},
		{"https://x.apps.cloud.example:4984/endpoint.scope.coll", "https://x.apps.cloud.example:4984/endpoint/_session"},
		{"http://h/prefix/my%2Fdb.s.c", "http://h/prefix/my%2Fdb/_session"},
	}
	for _, tc := range tests {
		got, err := sessionURL(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("sessionURL(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
