package feed

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
)

func TestDocPathEscaping(t *testing.T) {
	t.Parallel()
	tests := []struct {
		id      string
		wantURI string
	}{
		{id: "plain", wantURI: "/db/plain"},
		{id: "a/b", wantURI: "/db/a%2Fb"},
		{id: "with space", wantURI: "/db/with%20space"},
		{id: "q?x=1", wantURI: "/db/q%3Fx=1"},
		{id: "h#x", wantURI: "/db/h%23x"},
		{id: "pct%41", wantURI: "/db/pct%2541"},
		{id: "a+b", wantURI: "/db/a%2Bb"},
		{id: "ünï/cødé 🚀", wantURI: "/db/%C3%BCn%C3%AF%2Fc%C3%B8d%C3%A9%20%F0%9F%9A%80"},
		{id: "../_all_docs", wantURI: "/db/..%2F_all_docs"},
		{id: "_design/by name", wantURI: "/db/_design/by%20name"},
		{id: "_local/x/y", wantURI: "/db/_local/x%2Fy"},
		// Dots that a URL path would read as relative segments.
		{id: ".", wantURI: "/db/%2E"},
		{id: "..", wantURI: "/db/%2E%2E"},
		{id: "...", wantURI: "/db/%2E%2E%2E"},
		{id: "_design/..", wantURI: "/db/_design/%2E%2E"},
		{id: "_local/.", wantURI: "/db/_local/%2E"},
		{id: "a.b", wantURI: "/db/a.b"},
		{id: "a/../../b", wantURI: "/db/a%2F..%2F..%2Fb"},
		{id: "%2e%2e/", wantURI: "/db/%252e%252e%2F"},
		{id: "+1", wantURI: "/db/%2B1"},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			t.Parallel()
			var decoded string
			f := newFakeSource(t, func(w http.ResponseWriter, r *http.Request) {
				decoded = r.URL.Path
				body, _ := json.Marshal(map[string]string{"_id": tt.id, "_rev": "1-a"})
				reply(200, string(body))(w, r)
			})
			_, rev, err := f.client(nil).Get(t.Context(), tt.id)
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			if rev != "1-a" {
				t.Errorf("rev = %q, want 1-a", rev)
			}
			if got := f.requests()[0].RequestURI; got != tt.wantURI {
				t.Errorf("source saw %s, want %s", got, tt.wantURI)
			}
			if want := "/db/" + tt.id; decoded != want {
				t.Errorf("source decoded the path to %q, want %q", decoded, want)
			}
		})
	}
}

func TestGet(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		step      http.HandlerFunc
		wantDoc   string
		wantRev   string
		notFound  bool
		transient bool
		malformed bool
	}{
		{name: "live", step: reply(200, `{"_id":"a","_rev":"2-b","n":1}`), wantDoc: `{"_id":"a","_rev":"2-b","n":1}`, wantRev: "2-b"},
		{name: "missing", step: reply(404, `{"error":"not_found","reason":"missing"}`), notFound: true},
		{name: "deleted body", step: reply(200, `{"_id":"a","_rev":"3-c","_deleted":true}`), notFound: true},
		{name: "500", step: reply(500, `{"error":"x"}`), transient: true},
		{name: "broken", step: reply(200, `{"_id":"a",`), transient: true, malformed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeSource(t, tt.step)
			doc, rev, err := f.client(nil).Get(t.Context(), "a")
			if string(doc) != tt.wantDoc || rev != tt.wantRev {
				t.Errorf("Get = %s, %q; want %s, %q", doc, rev, tt.wantDoc, tt.wantRev)
			}
			if got := errors.Is(err, ErrNotFound); got != tt.notFound {
				t.Errorf("errors.Is(%v, ErrNotFound) = %t, want %t", err, got, tt.notFound)
			}
			if got := Transient(err); got != tt.transient {
				t.Errorf("Transient(%v) = %t, want %t", err, got, tt.transient)
			}
			if got := errors.Is(err, ErrMalformed); got != tt.malformed {
				t.Errorf("errors.Is(%v, ErrMalformed) = %t, want %t", err, got, tt.malformed)
			}
		})
	}
}

// feedRows are the rows FetchDocs tests start from: four to fetch, three it
// must leave alone.
func feedRows() []Row {
	return []Row{
		{Seq: raw(`1`), ID: "a", Rev: "1-a"},
		{Seq: raw(`2`), ID: "b/1", Rev: "2-b"},                        // rev gone; winner is 3-b
		{Seq: raw(`3`), ID: "c", Rev: "1-c"},                          // rev gone; document deleted since
		{Seq: raw(`4`), ID: "d", Rev: "4-d", Deleted: true},           // tombstone: nothing to fetch
		{Seq: raw(`5`), ID: "e", Rev: "1-e", Removed: true},           // removal: nothing to fetch
		{Seq: raw(`6`), ID: "f", Rev: "1-f", Doc: raw(`{"_id":"f"}`)}, // include_docs already did it
		{Seq: raw(`7`), ID: "g", Rev: "2-g"},                          // the revision is a tombstone
	}
}

// fetchedRows is what feedRows become.
func fetchedRows() []Row {
	return []Row{
		{Seq: raw(`1`), ID: "a", Rev: "1-a", Doc: raw(`{"_id":"a","_rev":"1-a","v":1}`)},
		{Seq: raw(`2`), ID: "b/1", Rev: "3-b", Doc: raw(`{"_id":"b/1","_rev":"3-b","v":3}`)},
		{Seq: raw(`3`), ID: "c", Rev: "1-c", Deleted: true},
		{Seq: raw(`4`), ID: "d", Rev: "4-d", Deleted: true},
		{Seq: raw(`5`), ID: "e", Rev: "1-e", Removed: true},
		{Seq: raw(`6`), ID: "f", Rev: "1-f", Doc: raw(`{"_id":"f"}`)},
		{Seq: raw(`7`), ID: "g", Rev: "2-g", Deleted: true},
	}
}

// winnerRoutes answer the fallback GETs of feedRows.
func winnerRoutes() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		"/db/b%2F1": byRev(map[string]http.HandlerFunc{"": reply(200, `{"_id":"b/1","_rev":"3-b","v":3}`)}),
		"/db/c":     reply(404, `{"error":"not_found","reason":"deleted"}`),
	}
}

const wantBulkRequest = `{"docs":[{"id":"a","rev":"1-a"},{"id":"b/1","rev":"2-b"},{"id":"c","rev":"1-c"},{"id":"g","rev":"2-g"}]}`

// TestFetchDocsBulkGet: _bulk_get answered as JSON (CouchDB's error for
// b, pouchdb-server's "missing" for c) or as multipart/mixed (Sync
// Gateway's) fills the rows the same way, with a GET of the winner for each
// revision gone.
func TestFetchDocsBulkGet(t *testing.T) {
	t.Parallel()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, content := range []string{
		`{"_id":"a","_rev":"1-a","v":1}`,
		`{"error":"not_found","id":"b/1","reason":"missing","rev":"2-b","status":404}`,
		`{"error":"not_found","id":"c","reason":"missing","rev":"1-c","status":404}`,
		`{"_id":"g","_rev":"2-g","_deleted":true}`,
	} {
		w, err := mw.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/json"}})
		if err != nil {
			t.Fatalf("create part: %v", err)
		}
		w.Write([]byte(content))
	}
	mw.Close()
	tests := []struct {
		name string
		bulk http.HandlerFunc
		edit func(*Options)
	}{
		{
			name: "json",
			bulk: reply(200, `{"results":[`+
				`{"id":"a","docs":[{"ok":{"_id":"a","_rev":"1-a","v":1}}]},`+
				`{"id":"b/1","docs":[{"error":{"id":"b/1","rev":"2-b","error":"not_found","reason":"missing"}}]},`+
				`{"id":"c","docs":[{"missing":"1-c"}]},`+
				`{"id":"g","docs":[{"ok":{"_id":"g","_rev":"2-g","_deleted":true}}]}]}`),
			edit: func(o *Options) { o.Fetch = config.FetchBulkGet },
		},
		{
			name: "multipart",
			bulk: replyType(200, "multipart/mixed; boundary="+mw.Boundary(), body.String()),
			edit: func(o *Options) { o.SourceType, o.Fetch = config.SourceSyncGateway, config.FetchBulkGet },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			routes := winnerRoutes()
			routes["/db/_bulk_get"] = tt.bulk
			f := newFakeSource(t, route(routes))
			rows := feedRows()
			if err := f.client(tt.edit).FetchDocs(t.Context(), rows); err != nil {
				t.Fatalf("FetchDocs: %v", err)
			}
			if diff := cmp.Diff(fetchedRows(), rows); diff != "" {
				t.Errorf("rows (-want +got):\n%s", diff)
			}
			checkFetchRequests(t, f.requests(), []string{"POST /db/_bulk_get?revs=false", "GET /db/b%2F1", "GET /db/c"})
		})
	}
}

// TestFetchDocsBulkGetMatchesByRevision answers the way pouchdb-server does:
// grouped by document, not in request order. Repeated rows are asked once.
func TestFetchDocsBulkGetMatchesByRevision(t *testing.T) {
	t.Parallel()
	f := newFakeSource(t, route(map[string]http.HandlerFunc{
		"/db/_bulk_get": reply(200, `{"results":[`+
			`{"id":"a","docs":[{"ok":{"_id":"a","_rev":"1-a","v":1}},{"missing":"2-a"}]},`+
			`{"id":"b","docs":[{"ok":{"_id":"b","_rev":"1-b","v":1}}]}]}`),
		"/db/a": reply(200, `{"_id":"a","_rev":"3-a","v":3}`),
	}))
	rows := []Row{
		{Seq: raw(`1`), ID: "a", Rev: "1-a"},
		{Seq: raw(`2`), ID: "b", Rev: "1-b"},
		{Seq: raw(`3`), ID: "a", Rev: "2-a"},
		{Seq: raw(`4`), ID: "a", Rev: "1-a"},
	}
	if err := f.client(nil).FetchDocs(t.Context(), rows); err != nil {
		t.Fatalf("FetchDocs: %v", err)
	}
	want := []Row{
		{Seq: raw(`1`), ID: "a", Rev: "1-a", Doc: raw(`{"_id":"a","_rev":"1-a","v":1}`)},
		{Seq: raw(`2`), ID: "b", Rev: "1-b", Doc: raw(`{"_id":"b","_rev":"1-b","v":1}`)},
		{Seq: raw(`3`), ID: "a", Rev: "3-a", Doc: raw(`{"_id":"a","_rev":"3-a","v":3}`)},
		{Seq: raw(`4`), ID: "a", Rev: "1-a", Doc: raw(`{"_id":"a","_rev":"1-a","v":1}`)},
	}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	if got, want := f.requests()[0].Body, `{"docs":[{"id":"a","rev":"1-a"},{"id":"b","rev":"1-b"},{"id":"a","rev":"2-a"}]}`; got != want {
		t.Errorf("_bulk_get body = %s, want %s", got, want)
	}
}

// TestFetchDocsSyncGatewayAccess covers revisions the reader can no longer
// see: a "_removed" stub from _bulk_get, and 403 on the fallback GET.
func TestFetchDocsSyncGatewayAccess(t *testing.T) {
	t.Parallel()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, p := range []string{
		`{"_id":"a","_rev":"1-a","_removed":true}`,
		`{"error":"not_found","id":"b","reason":"missing","rev":"2-b","status":404}`,
	} {
		w, _ := mw.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/json"}})
		w.Write([]byte(p))
	}
	// A document with attachments arrives as a nested multipart/related.
	var related bytes.Buffer
	nested := multipart.NewWriter(&related)
	w, _ := nested.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/json"}})
	w.Write([]byte(`{"_id":"c","_rev":"1-c","_attachments":{"x":{"stub":true}}}`))
	w, _ = nested.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/octet-stream"}})
	w.Write([]byte("attachment bytes"))
	nested.Close()
	w, _ = mw.CreatePart(textproto.MIMEHeader{"Content-Type": {"multipart/related; boundary=" + nested.Boundary()}})
	w.Write(related.Bytes())
	mw.Close()

	f := newFakeSource(t, route(map[string]http.HandlerFunc{
		"/db/_bulk_get": replyType(200, "multipart/mixed; boundary="+mw.Boundary(), body.String()),
		// As Sync Gateway: the winner is hidden (403), and its leaf, read
		// with open_revs=all, is a removal stub, not a tombstone.
		"/db/b": func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("open_revs") == "all" {
				reply(200, `[{"ok":{"_id":"b","_removed":true,"_rev":"3-b"}}]`)(w, r)
				return
			}
			reply(403, `{"error":"forbidden","reason":"missing channel access"}`)(w, r)
		},
	}))
	rows := []Row{{Seq: raw(`"1"`), ID: "a", Rev: "1-a"}, {Seq: raw(`"2"`), ID: "b", Rev: "2-b"}, {Seq: raw(`"3"`), ID: "c", Rev: "1-c"}}
	c := f.client(func(o *Options) { o.SourceType, o.Fetch = config.SourceAppServices, config.FetchBulkGet })
	if err := c.FetchDocs(t.Context(), rows); err != nil {
		t.Fatalf("FetchDocs: %v", err)
	}
	want := []Row{
		{Seq: raw(`"1"`), ID: "a", Rev: "1-a", Removed: true},
		{Seq: raw(`"2"`), ID: "b", Rev: "2-b", Removed: true},
		{Seq: raw(`"3"`), ID: "c", Rev: "1-c", Doc: raw(`{"_id":"c","_rev":"1-c","_attachments":{"x":{"stub":true}}}`)},
	}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
}

func TestFetchDocsEdgeServer(t *testing.T) {
	t.Parallel()
	var inFlight, peak atomic.Int32
	slow := func(h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			time.Sleep(20 * time.Millisecond)
			h(w, r)
		}
	}
	routes := map[string]http.HandlerFunc{
		"/db/a": slow(byRev(map[string]http.HandlerFunc{"1-a": reply(200, `{"_id":"a","_rev":"1-a","v":1}`)})),
		"/db/b%2F1": slow(byRev(map[string]http.HandlerFunc{
			"":    reply(200, `{"_id":"b/1","_rev":"3-b","v":3}`),
			"2-b": reply(404, `{"error":"not_found","reason":"missing"}`),
		})),
		"/db/c": slow(reply(404, `{"error":"not_found","reason":"deleted"}`)),
		"/db/g": slow(byRev(map[string]http.HandlerFunc{"2-g": reply(200, `{"_id":"g","_rev":"2-g","_deleted":true}`)})),
	}
	var rows, want []Row
	var wantRequests []string
	for range 5 { // many rows so that concurrency shows
		rows, want = append(rows, feedRows()...), append(want, fetchedRows()...)
		wantRequests = append(wantRequests, "GET /db/a?rev=1-a", "GET /db/b%2F1?rev=2-b", "GET /db/b%2F1",
			"GET /db/c?rev=1-c", "GET /db/c", "GET /db/g?rev=2-g")
	}
	f := newFakeSource(t, route(routes))
	c := f.client(func(o *Options) {
		o.SourceType, o.Fetch, o.Concurrency = config.SourceEdgeServer, config.FetchBulkGet, 3
	})
	if err := c.FetchDocs(t.Context(), rows); err != nil {
		t.Fatalf("FetchDocs: %v", err)
	}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	checkFetchRequests(t, f.requests(), wantRequests)
	if p := peak.Load(); p > 3 || p < 2 {
		t.Errorf("peak concurrent GETs = %d, want 2 or 3 (Concurrency 3)", p)
	}
}

func TestFetchDocsFailures(t *testing.T) {
	t.Parallel()
	rows := func() []Row { return []Row{{Seq: raw(`1`), ID: "a/1", Rev: "1-a"}} }
	tests := []struct {
		name      string
		source    string
		routes    map[string]http.HandlerFunc
		status    int
		transient bool
		malformed bool
		wantErr   string
	}{
		{name: "bulk_get 500", routes: map[string]http.HandlerFunc{"/db/_bulk_get": reply(500, `{"error":"x"}`)},
			status: 500, transient: true, wantErr: "bulk_get: source answered 500 x"},
		{name: "bulk_get 401", routes: map[string]http.HandlerFunc{"/db/_bulk_get": reply(401, `{"error":"unauthorized"}`)},
			status: 401, wantErr: "bulk_get: source answered 401 unauthorized"},
		{name: "bulk_get broken", routes: map[string]http.HandlerFunc{"/db/_bulk_get": reply(200, `{"results":[{"id":"a/1","docs":[`)},
			transient: true, malformed: true, wantErr: "bulk_get: malformed response"},
		{name: "bulk_get broken after an answer for another doc",
			routes:    map[string]http.HandlerFunc{"/db/_bulk_get": reply(200, `{"results":[{"id":"z","docs":[{"ok":{"_id":"z","_rev":"1-z"}}]},{"id":"a/1","docs":[`)},
			transient: true, malformed: true, wantErr: `bulk_get: malformed response: the answer broke before answering "a/1" rev 1-a`},
		{name: "bulk_get too few answers", routes: map[string]http.HandlerFunc{"/db/_bulk_get": reply(200, `{"results":[]}`)},
			transient: true, malformed: true, wantErr: `bulk_get: malformed response: no answer for "a/1" rev 1-a`},
		{name: "bulk_get answers another doc",
			routes:    map[string]http.HandlerFunc{"/db/_bulk_get": reply(200, `{"results":[{"id":"z","docs":[{"ok":{"_id":"z","_rev":"1-z"}}]}]}`)},
			transient: true, malformed: true, wantErr: `no answer for "a/1"`},
		{name: "bulk_get answers another rev",
			routes:    map[string]http.HandlerFunc{"/db/_bulk_get": reply(200, `{"results":[{"id":"a/1","docs":[{"ok":{"_id":"a/1","_rev":"2-a"}}]}]}`)},
			transient: true, malformed: true, wantErr: `no answer for "a/1" rev 1-a`},
		{name: "bulk_get body without _rev",
			routes:    map[string]http.HandlerFunc{"/db/_bulk_get": reply(200, `{"results":[{"id":"a/1","docs":[{"ok":{"_id":"a/1"}}]}]}`)},
			transient: true, malformed: true, wantErr: `document without _id or _rev`},
		{name: "bulk_get empty doc entry (pouchdb bad rev)",
			routes:    map[string]http.HandlerFunc{"/db/_bulk_get": reply(200, `{"results":[{"id":"a/1","docs":[{}]}]}`)},
			transient: true, malformed: true},
		{name: "bulk_get forbidden doc",
			routes: map[string]http.HandlerFunc{"/db/_bulk_get": reply(200,
				`{"results":[{"id":"a/1","docs":[{"error":{"id":"a/1","rev":"1-a","error":"forbidden","reason":"no"}}]}]}`)},
			status: 403, wantErr: `fetch doc "a/1" rev 1-a: bulk_get: source answered 403 forbidden: no`},
		{name: "bulk_get unknown doc error",
			routes: map[string]http.HandlerFunc{"/db/_bulk_get": reply(200,
				`{"results":[{"id":"a/1","docs":[{"error":{"id":"a/1","rev":"1-a","error":"badarg"}}]}]}`)},
			status: 502, transient: true},
		{name: "bulk_get multipart without boundary",
			routes:    map[string]http.HandlerFunc{"/db/_bulk_get": replyType(200, "multipart/mixed", "x")},
			transient: true, malformed: true},
		{name: "bulk_get dropped", routes: map[string]http.HandlerFunc{"/db/_bulk_get": hangUp}, transient: true},
		{name: "winner 500", routes: map[string]http.HandlerFunc{
			"/db/_bulk_get": reply(200, `{"results":[{"id":"a/1","docs":[{"missing":"1-a"}]}]}`),
			"/db/a%2F1":     reply(500, `{"error":"boom"}`),
		}, status: 500, transient: true, wantErr: `fetch doc "a/1" winner: get: source answered 500 boom`},
		{name: "winner 403 on couchdb is not a removal", routes: map[string]http.HandlerFunc{
			"/db/_bulk_get": reply(200, `{"results":[{"id":"a/1","docs":[{"missing":"1-a"}]}]}`),
			"/db/a%2F1":     reply(403, `{"error":"forbidden"}`),
		}, status: 403},
		{name: "edge get 503", source: config.SourceEdgeServer, routes: map[string]http.HandlerFunc{"/db/a%2F1": reply(503, `{}`)},
			status: 503, transient: true, wantErr: `fetch doc "a/1" rev 1-a: get: source answered 503 service unavailable`},
		{name: "edge get broken", source: config.SourceEdgeServer, routes: map[string]http.HandlerFunc{"/db/a%2F1": reply(200, `{"_id"`)},
			transient: true, malformed: true, wantErr: `get: malformed response: document "a/1" is not JSON`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeSource(t, route(tt.routes))
			c := f.client(func(o *Options) {
				if tt.source != "" {
					o.SourceType = tt.source
				}
			})
			err := c.FetchDocs(t.Context(), rows())
			if err == nil {
				t.Fatal("FetchDocs returned no error")
			}
			if got := Transient(err); got != tt.transient {
				t.Errorf("Transient(%v) = %t, want %t", err, got, tt.transient)
			}
			if got := errors.Is(err, ErrMalformed); got != tt.malformed {
				t.Errorf("errors.Is(%v, ErrMalformed) = %t, want %t", err, got, tt.malformed)
			}
			var se *StatusError
			if got := 0; errors.As(err, &se) {
				got = se.Status
				if got != tt.status {
					t.Errorf("status = %d, want %d (%v)", got, tt.status, err)
				}
			} else if tt.status != 0 {
				t.Errorf("error %v is not a *StatusError", err)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q does not contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestFetchDocsCancelled(t *testing.T) {
	t.Parallel()
	f := newFakeSource(t, stall(30*time.Second))
	c := f.client(func(o *Options) { o.SourceType = config.SourceEdgeServer })
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	time.AfterFunc(50*time.Millisecond, cancel)
	rows := feedRows()
	start := time.Now()
	err := c.FetchDocs(ctx, rows)
	if err == nil || Transient(err) {
		t.Fatalf("FetchDocs = %v, want a permanent (cancelled) error", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("FetchDocs returned after %s, want soon after cancel", d)
	}
}

func TestFetchDocsNothingToDo(t *testing.T) {
	t.Parallel()
	f := newFakeSource(t, reply(500, `{}`))
	rows := []Row{{ID: "d", Rev: "2-d", Deleted: true}, {ID: "f", Rev: "1-f", Doc: raw(`{}`)}}
	if err := f.client(nil).FetchDocs(t.Context(), rows); err != nil {
		t.Fatalf("FetchDocs: %v", err)
	}
	if n := len(f.requests()); n != 0 {
		t.Errorf("source saw %d requests, want none", n)
	}
}

// checkFetchRequests compares the requests, ignoring the order of the
// concurrent GETs, and checks the _bulk_get body when there is one.
func checkFetchRequests(t *testing.T, seen []seenRequest, want []string) {
	t.Helper()
	var got []string
	for _, r := range seen {
		got = append(got, r.Method+" "+r.RequestURI)
		if r.Method == http.MethodPost && r.Body != wantBulkRequest {
			t.Errorf("_bulk_get body = %s, want %s", r.Body, wantBulkRequest)
		}
	}
	slices.Sort(got)
	want = slices.Clone(want)
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}
