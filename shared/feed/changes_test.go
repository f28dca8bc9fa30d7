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
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
)

const emptyFeed = `{"results":[],"last_seq":0}`

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	valid := Options{SourceType: config.SourceCouchDB, URL: "http://127.0.0.1:5984/orders"}
	tests := []struct {
		name string
		edit func(*Options)
		want []string // substrings of the error; none means valid
	}{
		{name: "couchdb", edit: func(*Options) {}},
		{name: "keyspace", edit: func(o *Options) {
			o.SourceType, o.URL, o.Channels = config.SourceSyncGateway, "https://sg:4984/db.scope.coll/", []string{"a"}
		}},
		{name: "everything wrong at once", edit: func(o *Options) { *o = Options{Limit: -1, Fetch: "all", Concurrency: -2} },
			want: []string{"source_type:", "url: required", "limit: -1", "fetch: \"all\"", "concurrency: -2"}},
		{name: "scheme", edit: func(o *Options) { o.URL = "ftp://h/db" }, want: []string{`url: scheme "ftp"`}},
		{name: "credentials in url", edit: func(o *Options) { o.URL = "http://u:secret@h/db" }, want: []string{"url: must not carry credentials"}},
		{name: "no database", edit: func(o *Options) { o.URL = "http://h:5984/" }, want: []string{"url: names no database"}},
		{name: "query", edit: func(o *Options) { o.URL = "http://h/db?x=1" }, want: []string{"url: must not have a query"}},
		{name: "channels on couchdb", edit: func(o *Options) { o.Channels = []string{"a"} }, want: []string{"channels: only a Sync Gateway"}},
		{name: "two auths", edit: func(o *Options) { o.Username, o.Password, o.Token = "u", "secret", "secret" }, want: []string{"auth: set either"}},
		{name: "password alone", edit: func(o *Options) { o.Password = "secret" }, want: []string{"username: required"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := valid
			tt.edit(&o)
			_, err := New(o)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("New: no error, want %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error %q leaks a secret", err)
			}
		})
	}
}

func TestOptionsStringHidesSecrets(t *testing.T) {
	t.Parallel()
	for _, o := range []Options{
		{SourceType: config.SourceCouchDB, URL: "http://h/db", Username: "u", Password: "hunter2"},
		{SourceType: config.SourceCouchDB, URL: "http://u:hunter2@h/db"},
		{SourceType: config.SourceSyncGateway, URL: "http://h/db", Token: "hunter2"},
	} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
			if got := fmt.Sprintf(verb, o); strings.Contains(got, "hunter2") || !strings.Contains(got, "url=http://") {
				t.Errorf("Sprintf(%s) = %q, want the options without the secret", verb, got)
			}
		}
	}
}

func TestChangesRequest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		edit    func(*Options)
		since   json.RawMessage
		timeout time.Duration
		want    url.Values
	}{
		{
			name:    "couchdb from the start",
			timeout: 10 * time.Second,
			want:    url.Values{"feed": {"longpoll"}, "timeout": {"10000"}, "limit": {"500"}, "include_docs": {"true"}},
		},
		{
			name:    "couchdb number since, bulk_get, active_only applied locally",
			edit:    func(o *Options) { o.Fetch, o.ActiveOnly, o.Limit = config.FetchBulkGet, true, 3 },
			since:   json.RawMessage(`42`),
			timeout: 1500 * time.Millisecond,
			want:    url.Values{"feed": {"longpoll"}, "timeout": {"1500"}, "limit": {"3"}, "since": {"42"}},
		},
		{
			name:    "couchdb 2 opaque string since",
			since:   json.RawMessage(`"13-g1AAAAB_eJzLYWBg4MhgTmHgz8tPSTV0MDQy"`),
			timeout: time.Second,
			want: url.Values{"feed": {"longpoll"}, "timeout": {"1000"}, "limit": {"500"}, "include_docs": {"true"},
				"since": {"13-g1AAAAB_eJzLYWBg4MhgTmHgz8tPSTV0MDQy"}},
		},
		{
			name: "sync gateway compound string since, channels, active_only",
			edit: func(o *Options) {
				o.SourceType, o.ActiveOnly, o.Channels = config.SourceSyncGateway, true, []string{"orders", "eu"}
			},
			since:   json.RawMessage(`"12:34"`),
			timeout: time.Second,
			want: url.Values{"feed": {"longpoll"}, "timeout": {"1000"}, "limit": {"500"}, "include_docs": {"true"},
				"since": {"12:34"}, "active_only": {"true"}, "filter": {"sync_gateway/bychannel"}, "channels": {"orders,eu"},
				"revocations": {"true"}},
		},
		{
			name:    "app services",
			edit:    func(o *Options) { o.SourceType, o.ActiveOnly = config.SourceAppServices, true },
			since:   json.RawMessage(`"7"`),
			timeout: time.Second,
			want: url.Values{"feed": {"longpoll"}, "timeout": {"1000"}, "limit": {"500"}, "include_docs": {"true"},
				"since": {"7"}, "active_only": {"true"}, "revocations": {"true"}},
		},
		{
			name:    "edge server bulk_get",
			edit:    func(o *Options) { o.SourceType, o.Fetch = config.SourceEdgeServer, config.FetchBulkGet },
			since:   json.RawMessage(` 9 `),
			timeout: time.Second,
			want:    url.Values{"feed": {"longpoll"}, "timeout": {"1000"}, "limit": {"500"}, "since": {"9"}},
		},
		{
			name:  "no timeout is a normal feed, null since",
			since: json.RawMessage(`null`),
			want:  url.Values{"feed": {"normal"}, "limit": {"500"}, "include_docs": {"true"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeSource(t, reply(http.StatusOK, emptyFeed))
			c := f.client(tt.edit)
			if _, err := c.Changes(t.Context(), tt.since, tt.timeout); err != nil {
				t.Fatalf("Changes: %v", err)
			}
			seen := f.requests()
			if len(seen) != 1 {
				t.Fatalf("source saw %d requests, want 1", len(seen))
			}
			u, err := url.ParseRequestURI(seen[0].RequestURI)
			if err != nil {
				t.Fatalf("parse request URI: %v", err)
			}
			if got, want := seen[0].Method+" "+u.Path, "GET /db/_changes"; got != want {
				t.Errorf("request = %s, want %s", got, want)
			}
			if diff := cmp.Diff(tt.want, u.Query()); diff != "" {
				t.Errorf("query (-want +got):\n%s", diff)
			}
		})
	}
}

func TestChangesInvalidSince(t *testing.T) {
	t.Parallel()
	f := newFakeSource(t, reply(http.StatusOK, emptyFeed))
	_, err := f.client(nil).Changes(t.Context(), json.RawMessage(`12-abc`), time.Second)
	if err == nil || Transient(err) {
		t.Fatalf("Changes(since=12-abc) = %v, want a permanent error", err)
	}
	if n := len(f.requests()); n != 0 {
		t.Errorf("source saw %d requests, want none", n)
	}
}

func TestChangesParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		edit func(*Options)
		body string
		want *Batch
	}{
		{
			name: "couchdb numbers, docs, tombstone, pending",
			body: `{"results":[` +
				`{"seq":1,"id":"a","changes":[{"rev":"1-a"}],"doc":{"_id":"a","_rev":"1-a","n":1}},` +
				`{"seq":12345678901234567890123,"id":"b","changes":[{"rev":"3-b"}],"deleted":true,"doc":{"_id":"b","_rev":"3-b","_deleted":true}},` +
				`{"seq":7,"id":"c","changes":[{"rev":"2-c"},{"rev":"2-x"}],"doc":null}` +
				`],"last_seq":12345678901234567890124,"pending":17}`,
			want: &Batch{
				Rows: []Row{
					{Seq: raw(`1`), ID: "a", Rev: "1-a", Doc: raw(`{"_id":"a","_rev":"1-a","n":1}`)},
					{Seq: raw(`12345678901234567890123`), ID: "b", Rev: "3-b", Deleted: true},
					{Seq: raw(`7`), ID: "c", Rev: "2-c"},
				},
				LastSeq: raw(`12345678901234567890124`),
				Pending: 17,
			},
		},
		{
			name: "couchdb 2 string seqs",
			body: `{"results":[{"seq":"2-g1AAAA","id":"a","changes":[{"rev":"1-a"}]}],"last_seq":"2-g1AAAA","pending":0}`,
			want: &Batch{Rows: []Row{{Seq: raw(`"2-g1AAAA"`), ID: "a", Rev: "1-a"}}, LastSeq: raw(`"2-g1AAAA"`), Pending: 0},
		},
		{
			name: "sync gateway: string seqs, removed, principal rows, no pending",
			edit: func(o *Options) { o.SourceType = config.SourceSyncGateway },
			body: `{"results":[` +
				`{"seq":"1","id":"_user/","changes":[]},` +
				`{"seq":"5","id":"a","changes":[{"rev":"2-a"}],"doc":{"_id":"a","_rev":"2-a"}},` +
				`{"seq":"6:3","id":"b","removed":["eu"],"changes":[{"rev":"4-b"}],"doc":{"_id":"b","_rev":"4-b","_removed":true}}` +
				`],"last_seq":"6:3"}`,
			want: &Batch{
				Rows: []Row{
					{Seq: raw(`"5"`), ID: "a", Rev: "2-a", Doc: raw(`{"_id":"a","_rev":"2-a"}`)},
					{Seq: raw(`"6:3"`), ID: "b", Rev: "4-b", Removed: true},
				},
				LastSeq: raw(`"6:3"`),
				Pending: -1,
			},
		},
		{
			name: "couchdb active_only drops tombstones but keeps last_seq",
			edit: func(o *Options) { o.ActiveOnly = true },
			body: `{"results":[{"seq":3,"id":"a","changes":[{"rev":"1-a"}]},{"seq":4,"id":"b","deleted":true,"changes":[{"rev":"2-b"}]}],"last_seq":4}`,
			want: &Batch{Rows: []Row{{Seq: raw(`3`), ID: "a", Rev: "1-a"}}, LastSeq: raw(`4`), Pending: -1},
		},
		{
			name: "nothing new",
			body: `{"results":[],"last_seq":"9"}` + "\n",
			want: &Batch{Rows: []Row{}, LastSeq: raw(`"9"`), Pending: -1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeSource(t, reply(http.StatusOK, tt.body))
			got, err := f.client(tt.edit).Changes(t.Context(), nil, time.Second)
			checkBatch(t, got, err, tt.want)
		})
	}
}

// TestSeqRoundTrip checks that a seq returned by the source goes back to it
// unchanged as the next since.
func TestSeqRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		lastSeq   string
		wantSince string
	}{
		{name: "number", lastSeq: `98765432109876543210`, wantSince: "98765432109876543210"},
		{name: "string", lastSeq: `"98765432109876543210"`, wantSince: "98765432109876543210"},
		{name: "compound string", lastSeq: `"120::135"`, wantSince: "120::135"},
		{name: "couchdb opaque", lastSeq: `"35-g1AAAAJAeJyN0E+7bU8Ua/KdbDz+XPb6"`, wantSince: "35-g1AAAAJAeJyN0E+7bU8Ua/KdbDz+XPb6"},
		{name: "unicode escape", lastSeq: `"a\u00e9b"`, wantSince: "aéb"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeSource(t, reply(http.StatusOK, `{"results":[],"last_seq":`+tt.lastSeq+`}`))
			c := f.client(nil)
			b, err := c.Changes(t.Context(), nil, time.Second)
			if err != nil {
				t.Fatalf("first Changes: %v", err)
			}
			if got := string(b.LastSeq); got != tt.lastSeq {
				t.Errorf("LastSeq = %s, want %s exactly", got, tt.lastSeq)
			}
			if _, err := c.Changes(t.Context(), b.LastSeq, time.Second); err != nil {
				t.Fatalf("second Changes: %v", err)
			}
			u, err := url.ParseRequestURI(f.requests()[1].RequestURI)
			if err != nil {
				t.Fatalf("parse request URI: %v", err)
			}
			if got := u.Query().Get("since"); got != tt.wantSince {
				t.Errorf("since = %q, want %q", got, tt.wantSince)
			}
		})
	}
}

func TestChangesFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		step       http.HandlerFunc
		edit       func(*Options)
		timeout    time.Duration
		status     int // of the *StatusError; 0 means none
		transient  bool
		malformed  bool
		wantErr    string // substring
		within     time.Duration
		secretFree bool
	}{
		{name: "401", step: reply(401, `{"error":"unauthorized","reason":"Name or password is incorrect."}`),
			edit:   func(o *Options) { o.Username, o.Password = "reader", "hunter2" },
			status: 401, wantErr: "changes: source answered 401 unauthorized: Name or password is incorrect.", secretFree: true},
		{name: "401 bearer", step: reply(401, `{"error":"Unauthorized","reason":"Invalid login"}`),
			edit:   func(o *Options) { o.SourceType, o.Token = config.SourceAppServices, "hunter2" },
			status: 401, wantErr: "changes: source answered 401 Unauthorized: Invalid login", secretFree: true},
		{name: "403", step: reply(403, `{"error":"forbidden","reason":"You are not allowed to access this db."}`), status: 403,
			wantErr: "changes: source answered 403 forbidden"},
		{name: "404 missing database", step: reply(404, `{"error":"not_found","reason":"Database does not exist."}`), status: 404,
			wantErr: "changes: source answered 404 not_found: Database does not exist."},
		{name: "400", step: reply(400, `{"error":"bad_request","reason":"Malformed since"}`), status: 400},
		{name: "302 is not followed", step: func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/login", http.StatusFound)
		}, status: 302, wantErr: "changes: source answered 302 found"},
		{name: "408", step: reply(408, ``), status: 408, transient: true, wantErr: "source answered 408 request timeout"},
		{name: "429", step: reply(429, `{"error":"too_many_requests","reason":"slow down"}`), status: 429, transient: true},
		{name: "500", step: reply(500, `{"error":"unknown_error","reason":"function_clause"}`), status: 500, transient: true,
			wantErr: "changes: source answered 500 unknown_error: function_clause"},
		{name: "502 html from a proxy", step: replyType(502, "text/html", "<html><body>Bad Gateway</body></html>"), status: 502,
			transient: true, wantErr: "changes: source answered 502 bad gateway"},
		{name: "503", step: reply(503, `{"error":"service_unavailable"}`), status: 503, transient: true},
		{name: "broken json", step: reply(200, `{"results":[{"seq":1,"id":"a","chan`), transient: true, malformed: true,
			wantErr: "changes: malformed response"},
		{name: "html 200 from a captive proxy", step: replyType(200, "text/html", "<html>log in</html>"), transient: true, malformed: true},
		{name: "no last_seq", step: reply(200, `{"results":[]}`), transient: true, malformed: true, wantErr: "no last_seq"},
		{name: "no results", step: reply(200, `{"last_seq":3}`), transient: true, malformed: true, wantErr: "no results"},
		{name: "empty last_seq", step: reply(200, `{"results":[],"last_seq":""}`), transient: true, malformed: true,
			wantErr: `changes: malformed response: last_seq is empty ("")`},
		{name: "dropped connection", step: hangUp, transient: true, wantErr: "changes: "},
		{name: "body cut short", step: truncate(`{"results":[{"seq":1,"id":"a"`), transient: true, wantErr: "read answer"},
		{name: "slower than timeout plus slack", step: stall(30 * time.Second),
			edit:    func(o *Options) { o.Slack = 200 * time.Millisecond },
			timeout: 100 * time.Millisecond, transient: true, within: 3 * time.Second, wantErr: "deadline exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeSource(t, tt.step)
			timeout := tt.timeout
			if timeout == 0 {
				timeout = time.Second
			}
			start := time.Now()
			b, err := f.client(tt.edit).Changes(t.Context(), nil, timeout)
			if err == nil {
				t.Fatalf("Changes = %+v, want an error", b)
			}
			t.Logf("error: %v", err)
			if tt.within > 0 && time.Since(start) > tt.within {
				t.Errorf("Changes took %s, want at most %s", time.Since(start), tt.within)
			}
			if got := Transient(err); got != tt.transient {
				t.Errorf("Transient(%v) = %t, want %t", err, got, tt.transient)
			}
			if got := errors.Is(err, ErrMalformed); got != tt.malformed {
				t.Errorf("errors.Is(%v, ErrMalformed) = %t, want %t", err, got, tt.malformed)
			}
			var se *StatusError
			switch {
			case tt.status == 0 && errors.As(err, &se):
				t.Errorf("error %v is a *StatusError, want none", err)
			case tt.status != 0 && !errors.As(err, &se):
				t.Errorf("error %v (%T) is not a *StatusError", err, err)
			case tt.status != 0 && (se.Status != tt.status || se.Op != "changes"):
				t.Errorf("StatusError = %+v, want op changes, status %d", se, tt.status)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q does not contain %q", err, tt.wantErr)
			}
			if tt.secretFree && (strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "cmVhZGVy")) {
				t.Errorf("error %q leaks credentials", err)
			}
			if n := len(f.requests()); n != 1 {
				t.Errorf("source saw %d requests, want 1 (no retries, no redirects followed)", n)
			}
		})
	}
}

// TestChangesSourceIgnoresTimeout covers a source that holds a long-poll
// open past its timeout, as pouchdb-server does: an answer with no row yet is
// an empty batch at the same position; one cut off inside a row is an error.
func TestChangesSourceIgnoresTimeout(t *testing.T) {
	t.Parallel()
	holdOpen := func(prefix string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, prefix)
			rc := http.NewResponseController(w)
			rc.Flush()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-r.Context().Done():
					return
				case <-tick.C:
					io.WriteString(w, "\n") // heartbeat
					rc.Flush()
				}
			}
		}
	}
	tests := []struct {
		name    string
		prefix  string
		since   json.RawMessage
		timeout time.Duration
		want    *Batch
		wantErr string
	}{
		{name: "nothing new", prefix: "{\"results\":[\n", since: raw(`"17"`), timeout: 100 * time.Millisecond,
			want: &Batch{Rows: []Row{}, LastSeq: raw(`"17"`), Pending: -1}},
		{name: "nothing new from the start", prefix: "{\"results\":[\n", since: nil, timeout: 100 * time.Millisecond,
			want: &Batch{Rows: []Row{}, Pending: -1}},
		{name: "nothing at all (compressed, unflushed)", prefix: "", since: raw(`17`), timeout: 100 * time.Millisecond,
			want: &Batch{Rows: []Row{}, LastSeq: raw(`17`), Pending: -1}},
		{name: "cut inside a row", prefix: `{"results":[{"seq":18,"id":"a"`, since: raw(`17`), timeout: 100 * time.Millisecond,
			wantErr: "changes: read answer (status 200): answer not complete within 300ms"},
		{name: "a normal feed is never idle", prefix: `{"results":[`, since: raw(`17`), timeout: 0,
			wantErr: "changes: read answer (status 200): answer not complete within 200ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeSource(t, holdOpen(tt.prefix))
			c := f.client(func(o *Options) { o.Slack = 200 * time.Millisecond })
			start := time.Now()
			got, err := c.Changes(t.Context(), tt.since, tt.timeout)
			if d, min := time.Since(start), tt.timeout+c.o.Slack; d < min || d > min+3*time.Second {
				t.Errorf("Changes returned after %s, want about timeout+slack (%s)", d, min)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !Transient(err) {
					t.Fatalf("Changes = %v, want a transient error containing %q", err, tt.wantErr)
				}
				return
			}
			checkBatch(t, got, err, tt.want)
		})
	}
}

func TestChangesRecoversAfter500(t *testing.T) {
	t.Parallel()
	f := newFakeSource(t,
		reply(500, `{"error":"internal_server_error"}`),
		reply(200, `{"results":[{"seq":"1","id":"a","changes":[{"rev":"1-a"}]}],"last_seq":"1"}`),
	)
	c := f.client(nil)
	if _, err := c.Changes(t.Context(), nil, time.Second); !Transient(err) {
		t.Fatalf("first Changes = %v, want a transient error", err)
	}
	b, err := c.Changes(t.Context(), nil, time.Second)
	if err != nil {
		t.Fatalf("second Changes: %v", err)
	}
	want := &Batch{Rows: []Row{{Seq: raw(`"1"`), ID: "a", Rev: "1-a"}}, LastSeq: raw(`"1"`), Pending: -1}
	if diff := cmp.Diff(want, b); diff != "" {
		t.Errorf("batch (-want +got):\n%s", diff)
	}
}

func TestChangesHonoursContext(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		ctx       func(context.Context) (context.Context, context.CancelFunc)
		transient bool
	}{
		{name: "cancelled", transient: false, ctx: func(ctx context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(ctx)
			time.AfterFunc(100*time.Millisecond, cancel)
			return ctx, cancel
		}},
		{name: "deadline", transient: true, ctx: func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 100*time.Millisecond)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeSource(t, stall(30*time.Second))
			ctx, cancel := tt.ctx(t.Context())
			defer cancel()
			start := time.Now()
			_, err := f.client(nil).Changes(ctx, nil, 20*time.Second)
			if err == nil {
				t.Fatal("Changes returned no error")
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("Changes returned after %s, want soon after the context ended", d)
			}
			if got := Transient(err); got != tt.transient {
				t.Errorf("Transient(%v) = %t, want %t", err, got, tt.transient)
			}
		})
	}
}

func TestAuthHeader(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		edit func(*Options)
		want string
	}{
		{name: "none", edit: func(*Options) {}, want: ""},
		{name: "basic", edit: func(o *Options) { o.Username, o.Password = "reader", "p@ss:word" }, want: "Basic cmVhZGVyOnBAc3M6d29yZA=="},
		{name: "bearer", edit: func(o *Options) { o.SourceType, o.Token = config.SourceAppServices, "tok.en" }, want: "Bearer tok.en"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeSource(t, route(map[string]http.HandlerFunc{
				"/db/_changes":  reply(200, emptyFeed),
				"/db/_bulk_get": reply(200, `{"results":[{"id":"a","docs":[{"ok":{"_id":"a","_rev":"1-a"}}]}]}`),
				"/db/_all_docs": reply(200, `{"rows":[]}`),
				"/db/a":         reply(200, `{"_id":"a","_rev":"1-a"}`),
			}))
			c := f.client(tt.edit)
			ctx := t.Context()
			if _, err := c.Changes(ctx, nil, time.Second); err != nil {
				t.Fatalf("Changes: %v", err)
			}
			if err := c.FetchDocs(ctx, []Row{{ID: "a", Rev: "1-a"}}); err != nil {
				t.Fatalf("FetchDocs: %v", err)
			}
			if err := c.Winners(ctx, 10, func([]DocRev) error { return nil }); err != nil {
				t.Fatalf("Winners: %v", err)
			}
			if _, _, err := c.Get(ctx, "a"); err != nil {
				t.Fatalf("Get: %v", err)
			}
			for _, r := range f.requests() {
				if r.Auth != tt.want {
					t.Errorf("%s %s sent Authorization %q, want %q", r.Method, r.RequestURI, r.Auth, tt.want)
				}
			}
		})
	}
}

func raw(s string) json.RawMessage { return json.RawMessage(s) }
