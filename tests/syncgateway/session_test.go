package syncgateway

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/feed"
)

// exchange is one request a client sent, as its transport saw it: never
// the cookie's value, only whether one was sent.
type exchange struct {
	Method, Path string
	Cookie       bool // a session cookie (see recorder.cookie)
	Auth         bool // an Authorization header
	Status       int
}

func (e exchange) String() string {
	return fmt.Sprintf("%s %s cookie=%t auth=%t %d", e.Method, e.Path, e.Cookie, e.Auth, e.Status)
}

// recorder is a transport that records every exchange.
type recorder struct {
	next   http.RoundTripper
	cookie string // the session cookie's name
	mu     sync.Mutex
	log    []exchange
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	e := exchange{Method: req.Method, Path: req.URL.Path, Auth: req.Header.Get("Authorization") != ""}
	c, _ := req.Cookie(r.cookie)
	e.Cookie = c != nil && c.Value != ""
	if err == nil {
		e.Status = resp.StatusCode
	}
	r.mu.Lock()
	r.log = append(r.log, e)
	r.mu.Unlock()
	return resp, err
}

// take returns the exchanges recorded since the last call.
func (r *recorder) take() []exchange {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.log
	r.log = nil
	return out
}

// sessionClient is a feed client on url signing in as user (password
// user+"pw"), whose exchanges rec records.
func sessionClient(t *testing.T, url, user string, edit func(*feed.Options)) (*feed.Client, *recorder) {
	t.Helper()
	rec := &recorder{next: http.DefaultTransport.(*http.Transport).Clone(), cookie: "SyncGatewaySession"}
	return client(t, url, user, func(o *feed.Options) {
		o.Session, o.HTTPClient = true, &http.Client{Transport: rec}
		if edit != nil {
			edit(o)
		}
	}), rec
}

// signIns counts the sign-ins among exchanges, and checks that every other
// request carried the session's cookie and no Authorization header.
func signIns(t *testing.T, db string, log []exchange) int {
	t.Helper()
	n := 0
	for _, e := range log {
		switch {
		case e.Method == http.MethodPost && e.Path == "/"+db+"/_session":
			n++
			if e.Cookie || e.Auth {
				t.Errorf("sign-in %s sent credentials besides its body", e)
			}
		case !e.Cookie || e.Auth:
			t.Errorf("%s: want the session cookie and no Authorization", e)
		}
	}
	return n
}

// TestSessionAuth reads a channel-restricted user's feed with a Sync
// Gateway session: one sign-in, the cookie on every request (changes,
// bulk_get, GET, continuous and websocket streams), a new sign-in after an
// administrator deletes the user's sessions, and a permanent 401 for a
// wrong password.
func TestSessionAuth(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := sg.CreateDB(t, "")
	db.PutUser("alice", "alicepw", "orders")
	revs := map[string]string{}
	put := func(id string, body map[string]any) { revs[id] = db.Put(id, revs[id], body) }
	put("o1", orders(1, "orders"))
	put("o2 ü/é", orders(2, "orders"))
	put("e1", orders(3, "eu"))
	db.WaitCached()

	for _, url := range []string{db.URL(), db.URL() + "._default._default"} {
		for _, fetch := range fetchModes {
			c, rec := sessionClient(t, url, "alice", func(o *feed.Options) { o.Fetch = fetch })
			got, _, _, _ := readAll(t, c, nil)
			if d := cmp.Diff([]string{"o1", "o2 ü/é"}, keys(got)); d != "" || got["o1"].Body == nil {
				t.Errorf("%s %s: documents (-want +got):\n%s", url, fetch, d)
			}
			if _, rev, err := c.Get(ctx, "o2 ü/é"); err != nil || rev != revs["o2 ü/é"] {
				t.Errorf("%s %s: Get: %s, %v", url, fetch, rev, err)
			}
			log := rec.take()
			if n := signIns(t, db.Name, log); n != 1 {
				t.Errorf("%s %s: %d sign-ins, want 1: %v", url, fetch, n, log)
			}
			if fetch == config.FetchBulkGet && !slices.ContainsFunc(log, func(e exchange) bool { return strings.HasSuffix(e.Path, "/_bulk_get") && e.Status == 200 }) {
				t.Errorf("%s %s: no _bulk_get answered 200 on the session: %v", url, fetch, log)
			}
		}
	}

	// The administrator deletes alice's sessions: the next request is
	// refused, the client signs in again once and goes on.
	c, rec := sessionClient(t, db.URL(), "alice", func(o *feed.Options) { o.Fetch = config.FetchBulkGet })
	_, _, since, _ := readAll(t, c, nil)
	rec.take()
	db.Admin(http.MethodDelete, "/_user/alice/_session", nil)
	put("o3", orders(4, "orders"))
	db.WaitCached()
	got, _, since, _ := readAll(t, c, since)
	if got["o3"].Rev != revs["o3"] || got["o3"].Body == nil {
		t.Errorf("after the sessions were deleted: %+v, want o3 at %s", got, revs["o3"])
	}
	log := rec.take()
	if len(log) < 3 || log[0].Status != http.StatusUnauthorized || log[1].Method != http.MethodPost || log[1].Status != http.StatusOK || log[2].Path != log[0].Path || log[2].Status != http.StatusOK {
		t.Errorf("after the sessions were deleted: %v, want a 401, a sign-in, the same request again answered 200", log)
	}
	if n := signIns(t, db.Name, log); n != 1 {
		t.Errorf("%d sign-ins after the sessions were deleted, want 1: %v", n, log)
	}

	// Streams open on the session, and sign in again when it is gone.
	for _, mode := range []string{config.ModeContinuous, config.ModeWebSocket} {
		db.Admin(http.MethodDelete, "/_user/alice/_session", nil)
		s, err := c.Stream(ctx, since, feed.StreamOptions{Mode: mode})
		if err != nil {
			t.Fatalf("%s stream: %v", mode, err)
		}
		id := "s-" + mode
		put(id, orders(5, "orders"))
		db.WaitCached()
		seen := drain(t, s, c, func(m map[string]state) bool { return m[id].Rev == revs[id] })
		s.Close()
		if seen[id].Body == nil {
			t.Errorf("%s stream: %s without its body", mode, id)
		}
		log := rec.take()
		if len(log) < 3 || log[0].Status != http.StatusUnauthorized || log[1].Method != http.MethodPost || log[2].Path != log[0].Path {
			t.Errorf("%s stream after the sessions were deleted: %v, want a 401, a sign-in, the stream again", mode, log)
		}
		if n := signIns(t, db.Name, log); n != 1 {
			t.Errorf("%s stream: %d sign-ins, want 1: %v", mode, n, log)
		}
	}

	// A wrong password: the sign-in's 401, permanent, without the password.
	bad, rec := sessionClient(t, db.URL(), "alice", func(o *feed.Options) { o.Password = "wrong-Pw-93kd" })
	_, err := bad.Changes(ctx, nil, 0)
	var se *feed.StatusError
	if !errors.As(err, &se) || se.Op != "session" || se.Status != http.StatusUnauthorized || feed.Transient(err) {
		t.Errorf("wrong password: %v, want the sign-in's permanent 401", err)
	}
	if strings.Contains(fmt.Sprint(err), "wrong-Pw-93kd") {
		t.Error("the error shows the password")
	}
	if log := rec.take(); len(log) != 1 || log[0].Method != http.MethodPost {
		t.Errorf("wrong password: %v, want one sign-in and nothing else", log)
	}
}

// TestSessionCookieName: a database with its own session_cookie_name
// sets that cookie, and the client sends it back.
func TestSessionCookieName(t *testing.T) {
	t.Parallel()
	db := sg.CreateDBConfig(t, map[string]any{"session_cookie_name": "OrdersSession"})
	db.PutUser("alice", "alicepw", "orders")
	o1 := db.Put("o1", "", orders(1, "orders"))
	db.WaitCached()
	c, rec := sessionClient(t, db.URL(), "alice", nil)
	rec.cookie = "OrdersSession"
	got, _, _, _ := readAll(t, c, nil)
	if got["o1"].Rev != o1 || len(got) != 1 {
		t.Errorf("documents %+v, want o1 at %s", got, o1)
	}
	log := rec.take()
	if n := signIns(t, db.Name, log); n != 1 {
		t.Errorf("%d sign-ins, want 1: %v", n, log)
	}
}

// TestSessionExpiresDuringConcurrentFetches deletes the session while
// per-document GETs run concurrently: they share one new sign-in.
func TestSessionExpiresDuringConcurrentFetches(t *testing.T) {
	t.Parallel()
	db := sg.CreateDB(t, "")
	db.PutUser("alice", "alicepw", "orders")
	for i := range 40 {
		db.Put(fmt.Sprintf("d%02d", i), "", orders(i, "orders"))
	}
	db.WaitCached()
	c, rec := sessionClient(t, db.URL(), "alice", func(o *feed.Options) { o.Concurrency = 8 })
	b, err := c.Changes(t.Context(), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	db.Admin(http.MethodDelete, "/_user/alice/_session", nil)
	rec.take()
	var wg sync.WaitGroup
	errs := make(chan error, len(b.Rows))
	for _, r := range b.Rows {
		if strings.HasPrefix(r.ID, "_user/") {
			continue
		}
		wg.Go(func() {
			if _, _, err := c.Get(t.Context(), r.ID); err != nil {
				errs <- fmt.Errorf("get %s: %w", r.ID, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	log := rec.take()
	if n := signIns(t, db.Name, log); n != 1 {
		t.Errorf("%d sign-ins for concurrent requests refused together, want 1", n)
	}
	refused := 0
	for _, e := range log {
		if e.Status == http.StatusUnauthorized {
			refused++
		}
	}
	t.Logf("%d requests, %d refused with the deleted session, 1 sign-in", len(log), refused)
	if refused == 0 {
		t.Error("no request was refused: the session was not deleted")
	}
}

// TestPipelineWithSession runs the whole pipeline with session auth: the
// output ends with exactly what the user can read, also after an
// administrator deleted the user's sessions between two runs (the cached
// poller's client signs in again), and the logs show neither the password
// nor the cookie.
func TestPipelineWithSession(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := sg.CreateDB(t, "")
	db.PutUser("alice", "alicepw", "orders")
	s := newPipelineStackAuth(t, db, config.AuthSession, "alice", "alicepw", config.FetchBulkGet, 7)
	revs := map[string]string{}
	put := func(id string, body map[string]any) { revs[id] = db.Put(id, revs[id], body) }
	check := func(phase string) {
		t.Helper()
		if want, _ := s.converge(ctx, db, "alice", "alicepw", phase); len(want) == 0 {
			t.Errorf("%s: alice can read nothing; the check proves nothing", phase)
		}
	}

	for i := range 10 {
		put(fmt.Sprintf("o-%02d", i), orders(i, "orders"))
	}
	for i := range 3 {
		put(fmt.Sprintf("e-%d", i), orders(i, "eu"))
	}
	put(unicodeIDs[0], orders(1, "orders"))
	check("initial load")
	first, firstRefused := sessionLog(db.Name)

	db.Admin(http.MethodDelete, "/_user/alice/_session", nil)
	put("o-00", orders(100, "orders"))
	db.Delete("o-01", revs["o-01"])
	put("o-02", orders(2, "eu"))          // moved out
	put("e-0", orders(0, "eu", "orders")) // moved in
	put(unicodeIDs[0], orders(2, "orders"))
	check("after the sessions were deleted")
	second, secondRefused := sessionLog(db.Name)

	t.Logf("in the Sync Gateway log: %d sign-ins and %d refused sessions after the first run, %d and %d after the second",
		first, firstRefused, second, secondRefused)
	if first < 1 || second <= first || firstRefused != 0 || secondRefused < 1 {
		t.Error("want a sign-in in the first run; in the second, the cached poller's session refused and a new sign-in")
	}
	logs := s.Logs().String()
	for _, secret := range []string{"alicepw", "SyncGatewaySession"} {
		if strings.Contains(logs, secret) {
			t.Errorf("the pipeline log shows %q", secret)
		}
	}
}

// sessionLog counts, in the server's log, the sign-ins to db and the
// requests it refused for their session.
func sessionLog(db string) (signIns, refused int) {
	for _, l := range strings.Split(sg.LogTail(1<<30), "\n") {
		switch {
		case strings.Contains(l, "POST /"+db+"/_session "):
			signIns++
		case strings.Contains(l, "db:"+db+" ") && strings.Contains(l, "--> 401 Session"):
			refused++
		}
	}
	return signIns, refused
}
