package feed

import (
	"bytes"
	"encoding/json"
	"errors"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// cjkIDs are ids pouchdb-server's _all_docs leaves out.
var cjkIDs = []string{"注文-1", "注文-2"}

// TestListCouch lists a pouchdb-server database in pages of three: every
// document once, at its last state, ids _all_docs skips included.
func TestListCouch(t *testing.T) {
	t.Parallel()
	db := testenv.CouchDB(t)
	want := fixture(t, db)
	for i, rev := range bulkDocs(t, db, true, map[string]any{"_id": cjkIDs[0], "v": "1"}, map[string]any{"_id": cjkIDs[1], "v": "1"}) {
		want[cjkIDs[i]] = docState{Rev: rev, V: "1"}
	}
	// A conflict: the feed lists the winner.
	bulkDocs(t, db, false,
		map[string]any{"_id": "conflicted", "_rev": revA, "_revisions": map[string]any{"start": 2, "ids": []string{revA[2:], revRoot[2:]}}, "v": "a"},
		map[string]any{"_id": "conflicted", "_rev": revF, "_revisions": map[string]any{"start": 2, "ids": []string{revF[2:], revRoot[2:]}}, "v": "f"})
	want["conflicted"] = docState{Rev: revF, V: "f"}

	c := mustNew(t, Options{SourceType: config.SourceCouchDB, URL: db, Limit: 500, Fetch: config.FetchIncludeDocs})
	got := map[string]docState{}
	pages := 0
	err := c.List(t.Context(), 3, func(rows []Row) error {
		pages++
		if len(rows) > 3 {
			t.Errorf("page of %d rows, asked for 3", len(rows))
		}
		for _, r := range rows {
			if r.Doc != nil {
				t.Errorf("%s: a body was read", r.ID)
			}
			got[r.ID] = docState{Rev: r.Rev, Deleted: r.Deleted, V: want[r.ID].V}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}
	if wantPages := (len(want) + 2) / 3; pages != wantPages {
		t.Errorf("%d pages, want %d", pages, wantPages)
	}
}

// TestCurrentCouch reads the current state of documents of pouchdb-server.
func TestCurrentCouch(t *testing.T) {
	t.Parallel()
	db := testenv.CouchDB(t)
	want := fixture(t, db)
	revs := bulkDocs(t, db, true, map[string]any{"_id": cjkIDs[0], "v": "1"})
	want[cjkIDs[0]] = docState{Rev: revs[0], V: "1"}
	bulkDocs(t, db, false,
		map[string]any{"_id": "conflicted", "_rev": revA, "_revisions": map[string]any{"start": 2, "ids": []string{revA[2:], revRoot[2:]}}, "v": "a"},
		map[string]any{"_id": "conflicted", "_rev": revF, "_revisions": map[string]any{"start": 2, "ids": []string{revF[2:], revRoot[2:]}}, "v": "f"})
	want["conflicted"] = docState{Rev: revF, V: "f"}
	want["never-written"] = docState{Deleted: true}

	var ids []string
	for id := range want {
		ids = append(ids, id)
	}
	ids = append(ids, ids[0]) // asked twice, answered twice
	c := mustNew(t, Options{SourceType: config.SourceCouchDB, URL: db})
	rows, err := c.Current(t.Context(), ids)
	if err != nil {
		t.Fatalf("Current: %v", err)
	}
	if len(rows) != len(ids) {
		t.Fatalf("%d rows for %d ids", len(rows), len(ids))
	}
	for i, r := range rows {
		if r.ID != ids[i] {
			t.Fatalf("row %d is %q, want %q", i, r.ID, ids[i])
		}
		w := want[r.ID]
		got := docState{Rev: r.Rev, Deleted: r.Deleted}
		if w.Deleted {
			got.Rev = w.Rev // a tombstone's revision is not always known
		} else {
			var body struct {
				ID string `json:"_id"`
				V  string `json:"v"`
			}
			if err := json.Unmarshal(r.Doc, &body); err != nil || body.ID != r.ID {
				t.Errorf("%s: body %s (%v)", r.ID, r.Doc, err)
			}
			got.V = body.V
		}
		if got != w || r.Removed {
			t.Errorf("%s: %+v removed %t, want %+v", r.ID, got, r.Removed, w)
		}
	}
}

// TestListRequests checks the requests and the end of a listing on a
// scripted source.
func TestListRequests(t *testing.T) {
	t.Parallel()
	f := newFakeSource(t,
		reply(200, `{"results":[{"seq":"1-a","id":"a","changes":[{"rev":"1-a"}]},{"seq":"2-b","id":"_user/bob","changes":[]}],"last_seq":"2-b"}`),
		reply(200, `{"results":[{"seq":"3-c","id":"a","changes":[{"rev":"2-a"}],"deleted":true},{"seq":"4-d","id":"d","changes":[{"rev":"1-d"}],"removed":["ch"]}],"last_seq":"4-d"}`),
		reply(200, `{"results":[],"last_seq":"4-d"}`))
	c := f.client(func(o *Options) {
		o.SourceType, o.Channels, o.ActiveOnly, o.Fetch = config.SourceSyncGateway, []string{"ch", "x"}, true, config.FetchIncludeDocs
	})
	var got []Row
	if err := c.List(t.Context(), 2, func(rows []Row) error { got = append(got, rows...); return nil }); err != nil {
		t.Fatalf("List: %v", err)
	}
	want := []Row{
		{Seq: json.RawMessage(`"1-a"`), ID: "a", Rev: "1-a"},
		{Seq: json.RawMessage(`"3-c"`), ID: "a", Rev: "2-a", Deleted: true},
		{Seq: json.RawMessage(`"4-d"`), ID: "d", Rev: "1-d", Removed: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	reqs := f.requests()
	if len(reqs) != 3 {
		t.Fatalf("%d requests, want 3", len(reqs))
	}
	for i, since := range []string{"", "2-b", "4-d"} {
		u, _ := url.Parse(reqs[i].RequestURI)
		q := u.Query()
		wantQ := url.Values{"feed": {"normal"}, "style": {"main_only"}, "limit": {"2"}, "filter": {"sync_gateway/bychannel"}, "channels": {"ch,x"}}
		if since != "" {
			wantQ.Set("since", since)
		}
		if u.Path != "/db/_changes" || q.Encode() != wantQ.Encode() {
			t.Errorf("request %d: %s, want /db/_changes?%s", i, reqs[i].RequestURI, wantQ.Encode())
		}
	}
}

func TestListRefusesAStuckFeed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		pages []http.HandlerFunc
		want  string
	}{
		{"last_seq does not move", []http.HandlerFunc{
			reply(200, `{"results":[{"seq":5,"id":"a","changes":[{"rev":"1-a"}]}],"last_seq":5}`),
			reply(200, `{"results":[{"seq":5,"id":"a","changes":[{"rev":"1-a"}]}],"last_seq":5}`),
		}, "does not move"},
		{"empty last_seq", []http.HandlerFunc{
			reply(200, `{"results":[{"seq":5,"id":"a","changes":[{"rev":"1-a"}]}],"last_seq":""}`),
		}, "last_seq is empty"},
		{"no results", []http.HandlerFunc{reply(200, `{"last_seq":5}`)}, "no results"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeSource(t, tt.pages...)
			err := f.client(nil).List(t.Context(), 10, func([]Row) error { return nil })
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("List = %v, want ErrMalformed saying %q", err, tt.want)
			}
			if n := len(f.requests()); n > 2 {
				t.Errorf("%d requests: the listing went on", n)
			}
		})
	}
	t.Run("an error of fn stops the listing", func(t *testing.T) {
		t.Parallel()
		f := newFakeSource(t, reply(200, `{"results":[{"seq":1,"id":"a","changes":[{"rev":"1-a"}]}],"last_seq":1}`))
		stop := errors.New("stop")
		if err := f.client(nil).List(t.Context(), 1, func([]Row) error { return stop }); !errors.Is(err, stop) {
			t.Errorf("List = %v, want fn's error", err)
		}
		if n := len(f.requests()); n != 1 {
			t.Errorf("%d requests, want 1", n)
		}
	})
}

// TestCurrentSyncGateway reads Sync Gateway's multipart answer: a live
// document, a tombstone, a document the reader may no longer see (403),
// and one the answer leaves out (read with its own GET).
func TestCurrentSyncGateway(t *testing.T) {
	t.Parallel()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, part := range []string{
		`{"_id":"live","_rev":"3-l","v":1}`,
		`{"_id":"gone","_rev":"2-g","_deleted":true}`,
		`{"id":"hidden","error":"forbidden","reason":"forbidden","status":403}`,
	} {
		w, _ := mw.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/json"}})
		w.Write([]byte(part))
	}
	mw.Close()
	f := newFakeSource(t, route(map[string]http.HandlerFunc{
		"/db/_bulk_get": replyType(200, "multipart/mixed; boundary="+mw.Boundary(), body.String()),
		"/db/left-out":  reply(200, `{"_id":"left-out","_rev":"1-o"}`),
	}))
	c := f.client(func(o *Options) { o.SourceType = config.SourceSyncGateway })
	rows, err := c.Current(t.Context(), []string{"live", "gone", "hidden", "left-out"})
	if err != nil {
		t.Fatalf("Current: %v", err)
	}
	want := []Row{
		{ID: "live", Rev: "3-l", Doc: json.RawMessage(`{"_id":"live","_rev":"3-l","v":1}`)},
		{ID: "gone", Rev: "2-g", Deleted: true},
		{ID: "hidden", Removed: true},
		{ID: "left-out", Rev: "1-o", Doc: json.RawMessage(`{"_id":"left-out","_rev":"1-o"}`)},
	}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	reqs := f.requests()
	if len(reqs) != 2 || reqs[0].Method != http.MethodPost || reqs[0].RequestURI != "/db/_bulk_get?revs=false" ||
		reqs[0].Body != `{"docs":[{"id":"live"},{"id":"gone"},{"id":"hidden"},{"id":"left-out"}]}` {
		t.Errorf("requests: %+v", reqs)
	}

	// CouchDB's 403 is an error, not a removal.
	f = newFakeSource(t, reply(200, `{"results":[{"id":"x","docs":[{"error":{"id":"x","rev":"undefined","error":"forbidden","reason":"no","status":403}}]}]}`))
	if _, err := f.client(nil).Current(t.Context(), []string{"x"}); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("CouchDB 403: error %v, want one naming the document", err)
	}
	// An answer for a document not asked for is refused.
	f = newFakeSource(t, reply(200, `{"results":[{"id":"y","docs":[{"ok":{"_id":"y","_rev":"1-y"}}]}]}`))
	if _, err := f.client(nil).Current(t.Context(), []string{"x"}); !errors.Is(err, ErrMalformed) {
		t.Errorf("answer for another document: error %v, want ErrMalformed", err)
	}
}
