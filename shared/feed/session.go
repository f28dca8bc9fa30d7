package feed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
)

// sessionURL returns the URL of the session endpoint of the database a Sync
// Gateway family URL names: {prefix}/{db}/_session, also for a keyspace
// (db.scope.collection: database names have no dots).
func sessionURL(raw string) (string, error) {
	u, err := url.Parse(strings.TrimRight(raw, "/"))
	if err != nil {
		return "", errors.New("not a valid URL")
	}
	p := u.EscapedPath()
	i := strings.LastIndexByte(p, '/')
	db, _, _ := strings.Cut(p[i+1:], ".")
	if db == "" {
		return "", errors.New("names no database")
	}
	s := *u
	s.RawPath, s.Path = "", ""
	return s.String() + p[:i+1] + db + "/_session", nil
}

// session is an http.RoundTripper that authenticates every request with a
// Sync Gateway session: it signs in with a username and password (POST
// {db}/_session), keeps the cookies the answer sets and sends them with
// every request. When the source answers 401 (the session expired or was
// deleted) it signs in again, once per request, and resends the request;
// a second 401 is returned as it came. Concurrent requests share one
// sign-in. It is safe for concurrent use.
//
// The cookies and the password are never part of an error: a refused
// sign-in is a *StatusError with Op "session" and the source's reason.
type session struct {
	next    http.RoundTripper
	url     string // {db}/_session
	form    []byte // the sign-in body: name and password
	timeout time.Duration
	// report, when set, is told of every sign-in (Options.OnRequest).
	report func(op string, status int, d time.Duration)

	mu      sync.Mutex
	cookie  string   // the Cookie header; "" before the first sign-in
	gen     uint64   // counts sign-ins; a request remembers the one it used
	pending *signing // the sign-in in flight, nil when none
}

// signing is one sign-in in flight: done is closed when it ends, after err
// is set (nil on success, or when the context of the request that started
// it ended first, so that the others try again themselves).
type signing struct {
	done chan struct{}
	err  error
}

var _ http.RoundTripper = (*session)(nil)

func newSession(next http.RoundTripper, sessionURL, username, password string, timeout time.Duration, report func(string, int, time.Duration)) (*session, error) {
	form, err := json.Marshal(struct {
		Name     string `json:"name"`
		Password string `json:"password"`
	}{username, password})
	if err != nil {
		return nil, fmt.Errorf("encode session request: %w", err)
	}
	return &session{next: next, url: sessionURL, form: form, timeout: timeout, report: report}, nil
}

// RoundTrip sends req with the session's cookie, signing in first when
// there is no session yet, and again once when the source answers 401.
func (s *session) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	cookie, gen, err := s.current(ctx, 0)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	resp, err := s.next.RoundTrip(withCookie(req, cookie))
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		return resp, err
	}
	body, ok := rewind(req)
	if !ok {
		return resp, nil
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, errorBodyMax))
	resp.Body.Close()
	if cookie, _, err = s.current(ctx, gen); err != nil {
		if body != nil {
			body.Close()
		}
		return nil, err
	}
	again := withCookie(req, cookie)
	again.Body = body
	return s.next.RoundTrip(again)
}

// current returns the session's cookie and the sign-in it came from. With
// refused set, the source refused that sign-in's cookie: a newer one is
// returned, signing in when there is none.
func (s *session) current(ctx context.Context, refused uint64) (string, uint64, error) {
	for {
		s.mu.Lock()
		if s.gen != 0 && s.gen != refused {
			cookie, gen := s.cookie, s.gen
			s.mu.Unlock()
			return cookie, gen, nil
		}
		if p := s.pending; p != nil {
			s.mu.Unlock()
			select {
			case <-p.done:
				if p.err != nil {
					return "", 0, p.err
				}
				continue
			case <-ctx.Done():
				return "", 0, fmt.Errorf("session: wait for the sign-in: %w", ctx.Err())
			}
		}
		p := &signing{done: make(chan struct{})}
		s.pending = p
		s.mu.Unlock()

		cookie, err := s.signIn(ctx)
		s.mu.Lock()
		s.pending = nil
		if err == nil {
			s.cookie = cookie
			s.gen++
		} else if ctx.Err() == nil {
			p.err = err
		}
		gen := s.gen
		s.mu.Unlock()
		close(p.done)
		if err != nil {
			return "", 0, err
		}
		return cookie, gen, nil
	}
}

// signIn creates a session and returns the Cookie header that carries it:
// every cookie the answer sets.
func (s *session) signIn(parent context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(parent, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, strings.NewReader(string(s.form)))
	if err != nil {
		return "", fmt.Errorf("session: build request: %w", err)
	}
	req.Header.Set("Accept", acceptJSON)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", userAgent)
	start := time.Now()
	resp, err := s.next.RoundTrip(req)
	status := 0
	if err == nil {
		status = resp.StatusCode
	}
	if s.report != nil {
		defer func() { s.report("session", status, time.Since(start)) }()
	}
	if err != nil {
		if parent.Err() == nil && ctx.Err() != nil {
			err = fmt.Errorf("no answer within %s: %w", s.timeout, err)
		}
		return "", &transportError{op: "session", err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, errorBodyMax))
	if err != nil {
		return "", &transportError{op: "session", status: status, err: fmt.Errorf("read answer (status %d): %w", status, err)}
	}
	if status < 200 || status > 299 {
		return "", newStatusError("session", status, b)
	}
	var parts []string
	for _, c := range resp.Cookies() {
		if c.Value != "" && c.MaxAge >= 0 {
			parts = append(parts, c.Name+"="+c.Value)
		}
	}
	if len(parts) == 0 {
		// Not the Sync Gateway the options name (or a proxy in between):
		// retried like any answer that is not what it should be.
		return "", malformed("session", "status %d without a session cookie", status)
	}
	return strings.Join(parts, "; "), nil
}

// withCookie returns a copy of req that carries cookie (and no other).
func withCookie(req *http.Request, cookie string) *http.Request {
	r := req.Clone(req.Context())
	r.Header.Set("Cookie", cookie)
	return r
}

// rewind returns a fresh copy of req's body, to send it again; ok is false
// when the body cannot be read again.
func rewind(req *http.Request) (body io.ReadCloser, ok bool) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, true
	}
	if req.GetBody == nil {
		return nil, false
	}
	b, err := req.GetBody()
	if err != nil {
		return nil, false
	}
	return b, true
}

// closeBody closes the body of a request that will not be sent, as a
// RoundTripper must.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// validateSession reports the problems of session authentication.
func (o Options) validateSession() []error {
	var errs []error
	switch o.SourceType {
	case config.SourceSyncGateway, config.SourceAppServices:
	default:
		errs = append(errs, fmt.Errorf("session: only a %s or %s source has sessions, not %q",
			config.SourceSyncGateway, config.SourceAppServices, o.SourceType))
	}
	if o.Username == "" {
		errs = append(errs, errors.New("username: required for a session"))
	}
	if o.Password == "" {
		errs = append(errs, errors.New("password: required for a session"))
	}
	return errs
}

// withSession returns a copy of hc whose requests carry the session of
// Username (see session).
func (o Options) withSession(hc *http.Client) (*http.Client, error) {
	u, err := sessionURL(o.URL)
	if err != nil {
		return nil, fmt.Errorf("url: %w", err)
	}
	next := hc.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	s, err := newSession(next, u, o.Username, o.Password, o.RequestTimeout, o.OnRequest)
	if err != nil {
		return nil, err
	}
	c := *hc
	c.Transport = s
	return &c, nil
}
