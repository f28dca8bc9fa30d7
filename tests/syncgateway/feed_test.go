package syncgateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// client returns a feed client on url as user (password user+"pw").
func client(t *testing.T, url, user string, edit func(*feed.Options)) *feed.Client {
	t.Helper()
	o := feed.Options{
		SourceType: config.SourceSyncGateway, URL: url, Limit: 100,
		Username: user, Password: user + "pw",
		Slack: 10 * time.Second, RequestTimeout: 10 * time.Second,
	}
	if user == "" {
		o.Password = ""
	}
	if edit != nil {
		edit(&o)
	}
	c, err := feed.New(o)
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	return c
}

// state is what a reader concluded about one document.
type state struct {
	Rev     string
	Deleted bool
	Removed bool
	Revoked bool
	Body    map[string]any
}

// readAll pages the feed from since until a batch is caught up, fetches
// bodies, and returns the last state of each document, the rows in order,
// the final position and the number of _changes requests.
func readAll(t *testing.T, c *feed.Client, since json.RawMessage) (map[string]state, []feed.Row, json.RawMessage, int) {
	t.Helper()
	ctx := t.Context()
	got := map[string]state{}
	var all []feed.Row
	for n := 1; ; n++ {
		b, err := c.Changes(ctx, since, 0)
		if err != nil {
			t.Fatalf("Changes(since %s): %v", since, err)
		}
		if err := c.FetchDocs(ctx, b.Rows); err != nil {
			t.Fatalf("FetchDocs: %v", err)
		}
		for _, r := range b.Rows {
			if r.Deleted && r.Removed {
				t.Errorf("row %s seq %s is both deleted and removed", r.ID, r.Seq)
			}
			st := state{Rev: r.Rev, Deleted: r.Deleted, Removed: r.Removed, Revoked: r.Revoked}
			if r.Doc != nil {
				if err := json.Unmarshal(r.Doc, &st.Body); err != nil {
					t.Fatalf("row %s body: %v", r.ID, err)
				}
			} else if !r.Deleted && !r.Removed {
				t.Errorf("live row %s seq %s has no body after FetchDocs", r.ID, r.Seq)
			}
			got[r.ID] = st
		}
		all = append(all, b.Rows...)
		since = b.LastSeq
		if b.CaughtUp() {
			return got, all, since, n
		}
		if n > 1000 {
			t.Fatal("feed never caught up")
		}
	}
}

func orders(n int, channels ...string) map[string]any {
	return map[string]any{"channels": channels, "n": n}
}

var fetchModes = []string{config.FetchIncludeDocs, config.FetchBulkGet}

// TestChannelsAndRemovals: a user restricted to a channel sees its documents,
// a document moved out of it as removed, a deletion as deleted (never both),
// and nothing of documents it never could see; sync_gateway/bychannel narrows
// the feed to the channels named.
func TestChannelsAndRemovals(t *testing.T) {
	t.Parallel()
	db := sg.CreateDB(t, "")
	db.PutUser("alice", "alicepw", "orders")
	db.PutUser("carol", "carolpw", "orders", "eu")
	o1 := db.Put("o1", "", orders(1, "orders"))
	o2 := db.Put("o2", "", orders(2, "orders"))
	o3 := db.Put("o3", "", orders(3, "orders"))
	both := db.Put("both", "", orders(4, "orders", "eu"))
	e1 := db.Put("e1", "", orders(5, "eu"))
	x1 := db.Put("x1", "", orders(6, "other")) // nobody's channel, deleted below
	o1 = db.Put("o1", o1, orders(11, "orders"))
	o2del := db.Delete("o2", o2)
	o3out := db.Put("o3", o3, orders(33, "eu"))
	x1del := db.Delete("x1", x1)
	db.WaitCached()

	for _, fetch := range fetchModes {
		t.Run(fetch, func(t *testing.T) {
			t.Parallel()
			got, _, last, _ := readAll(t, client(t, db.URL(), "alice", func(o *feed.Options) { o.Fetch = fetch }), nil)
			want := map[string]state{
				"o1":   {Rev: o1, Body: map[string]any{"_id": "o1", "_rev": o1, "channels": []any{"orders"}, "n": 11.0}},
				"o2":   {Rev: o2del, Deleted: true},
				"o3":   {Rev: o3out, Removed: true},
				"both": {Rev: both, Body: map[string]any{"_id": "both", "_rev": both, "channels": []any{"orders", "eu"}, "n": 4.0}},
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("alice's feed (-want +got):\n%s", d)
			}
			if !strings.HasPrefix(string(last), `"`) {
				t.Errorf("last_seq %s is not a JSON string", last)
			}

			// carol reads orders and eu, filtered to eu: o3 arrives live.
			got, _, _, _ = readAll(t, client(t, db.URL(), "carol", func(o *feed.Options) {
				o.Fetch, o.Channels = fetch, []string{"eu"}
			}), nil)
			if got["e1"].Rev != e1 || got["o3"].Rev != o3out || got["o3"].Removed || got["both"].Rev != both {
				t.Errorf("carol's eu feed: %+v", got)
			}
			for _, id := range []string{"o1", "o2"} {
				if _, ok := got[id]; ok {
					t.Errorf("carol's eu feed holds %s, which was never in eu: %+v", id, got[id])
				}
			}
		})
	}
	_ = x1del

	// A channel the user may not read gives an empty feed, not an error.
	got, rows, _, _ := readAll(t, client(t, db.URL(), "alice", func(o *feed.Options) { o.Channels = []string{"eu"} }), nil)
	if len(got) != 0 {
		t.Errorf("alice filtered to eu, a channel she lacks: %d rows %+v, want none", len(rows), got)
	}
}

// TestDeletedOutsideChannels: Get and the FetchDocs fallback tell a deletion
// (403 on GET, as for any hidden document) from a document the user may no
// longer see.
func TestDeletedOutsideChannels(t *testing.T) {
	t.Parallel()
	db := sg.CreateDB(t, "")
	db.PutUser("alice", "alicepw", "orders")
	o2 := db.Put("o2", "", orders(2, "orders"))
	o2del := db.Delete("o2", o2)
	o3 := db.Put("o3", "", orders(3, "orders"))
	db.Put("o3", o3, orders(33, "eu"))
	db.Put("e1", "", orders(4, "eu"))
	db.WaitCached()
	c := client(t, db.URL(), "alice", func(o *feed.Options) { o.Fetch = config.FetchBulkGet })

	status, _ := db.Public(http.MethodGet, "/o2", "alice", "alicepw", nil)
	if status != http.StatusForbidden {
		t.Errorf("GET deleted o2 as alice: %d, want Sync Gateway's 403", status)
	}
	if _, _, err := c.Get(t.Context(), "o2"); !errors.Is(err, feed.ErrNotFound) {
		t.Errorf("Get(o2) deleted: %v, want ErrNotFound", err)
	}
	for _, id := range []string{"o3", "e1"} {
		_, _, err := c.Get(t.Context(), id)
		var se *feed.StatusError
		if !errors.As(err, &se) || se.Status != http.StatusForbidden {
			t.Errorf("Get(%s) hidden: %v, want a 403 StatusError", id, err)
		}
	}
	if _, _, err := c.Get(t.Context(), "nosuch"); !errors.Is(err, feed.ErrNotFound) {
		t.Errorf("Get(nosuch): %v, want ErrNotFound", err)
	}

	// Revisions that are gone make FetchDocs read the winner.
	rows := []feed.Row{
		{Seq: json.RawMessage(`"1"`), ID: "o2", Rev: "1-0000"},
		{Seq: json.RawMessage(`"2"`), ID: "o3", Rev: "1-0000"},
		{Seq: json.RawMessage(`"3"`), ID: "e1", Rev: "1-0000"},
		{Seq: json.RawMessage(`"4"`), ID: "nosuch", Rev: "1-0000"},
	}
	if err := c.FetchDocs(t.Context(), rows); err != nil {
		t.Fatalf("FetchDocs: %v", err)
	}
	want := []feed.Row{
		{Seq: json.RawMessage(`"1"`), ID: "o2", Rev: o2del, Deleted: true},
		{Seq: json.RawMessage(`"2"`), ID: "o3", Rev: "1-0000", Removed: true},
		{Seq: json.RawMessage(`"3"`), ID: "e1", Rev: "1-0000", Removed: true},
		{Seq: json.RawMessage(`"4"`), ID: "nosuch", Rev: "1-0000", Deleted: true},
	}
	if d := cmp.Diff(want, rows); d != "" {
		t.Errorf("rows (-want +got):\n%s", d)
	}
}

// TestGrantRevokeAndActiveOnly: a grant backfills the channel's documents
// with compound seqs ("N:M"), paged one row at a time through a page that
// holds only the "_user/" row; a revocation reports each document as
// revoked (a removal); active_only reports neither deletions, removals nor
// revocations.
func TestGrantRevokeAndActiveOnly(t *testing.T) {
	t.Parallel()
	db := sg.CreateDB(t, "")
	db.PutUser("alice", "alicepw", "orders")
	db.Put("o1", "", orders(1, "orders"))
	e1 := db.Put("e1", "", orders(2, "eu"))
	e2 := db.Put("e2", "", orders(3, "eu"))
	o2 := db.Put("o2", "", orders(4, "orders"))
	db.Delete("o2", o2)
	db.WaitCached()
	c := client(t, db.URL(), "alice", func(o *feed.Options) { o.Limit = 1 })
	_, _, since, _ := readAll(t, c, nil)

	db.SetChannels("alice", "orders", "eu")
	db.WaitCached()
	var pages []string
	for {
		b, err := c.Changes(t.Context(), since, 0)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range b.Rows {
			ids = append(ids, r.ID+"@"+string(r.Seq))
		}
		pages = append(pages, strings.Join(ids, ",")+" caught_up="+map[bool]string{true: "yes", false: "no"}[b.CaughtUp()])
		since = b.LastSeq
		if b.CaughtUp() {
			break
		}
		if len(pages) > 10 {
			t.Fatalf("no end of feed after pages %v", pages)
		}
	}
	// e1 and e2 with compound seqs, then the _user row alone, then the end.
	if len(pages) != 4 || !strings.HasPrefix(pages[0], `e1@"`) || !strings.Contains(pages[0], ":") ||
		!strings.HasPrefix(pages[1], `e2@"`) || pages[2] != " caught_up=no" || pages[3] != " caught_up=yes" {
		t.Errorf("pages after the grant: %q", pages)
	}

	db.SetChannels("alice", "orders")
	db.WaitCached()
	got, _, _, _ := readAll(t, client(t, db.URL(), "alice", nil), since)
	want := map[string]state{"e1": {Rev: e1, Removed: true, Revoked: true}, "e2": {Rev: e2, Removed: true, Revoked: true}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("after the revocation (-want +got):\n%s", d)
	}

	got, _, _, _ = readAll(t, client(t, db.URL(), "alice", func(o *feed.Options) { o.ActiveOnly = true }), nil)
	if ids := keys(got); !slices.Equal(ids, []string{"o1"}) {
		t.Errorf("active_only from the start: %v, want only o1", ids)
	}
	got, _, _, _ = readAll(t, client(t, db.URL(), "alice", func(o *feed.Options) { o.ActiveOnly = true }), since)
	if len(got) != 0 {
		t.Errorf("active_only after the revocation: %+v, want nothing", got)
	}
}

func keys(m map[string]state) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestBulkGetAttachmentsAndErrorParts: _bulk_get answers in multipart with an
// error part for a missing revision and a document with an attachment (a
// stub without attachments=true); the client fills what exists.
func TestBulkGetAttachmentsAndErrorParts(t *testing.T) {
	t.Parallel()
	db := sg.CreateDB(t, "")
	db.PutUser("alice", "alicepw", "orders")
	att := db.Put("att1", "", map[string]any{"channels": []string{"orders"},
		"_attachments": map[string]any{"hello.txt": map[string]any{"content_type": "text/plain", "data": "aGVsbG8gd29ybGQ="}}})
	o1 := db.Put("o1", "", orders(1, "orders"))
	db.WaitCached()

	rows := []feed.Row{
		{Seq: json.RawMessage(`"1"`), ID: "att1", Rev: att},
		{Seq: json.RawMessage(`"2"`), ID: "o1", Rev: o1},
		{Seq: json.RawMessage(`"3"`), ID: "o1", Rev: "7-0000"}, // error part, then the winner
		{Seq: json.RawMessage(`"4"`), ID: "gone", Rev: "1-0000"},
	}
	c := client(t, db.URL(), "alice", func(o *feed.Options) { o.Fetch = config.FetchBulkGet })
	if err := c.FetchDocs(t.Context(), rows); err != nil {
		t.Fatalf("FetchDocs: %v", err)
	}
	var a struct {
		Attachments map[string]struct {
			Stub   bool `json:"stub"`
			Length int  `json:"length"`
		} `json:"_attachments"`
	}
	if err := json.Unmarshal(rows[0].Doc, &a); err != nil || !a.Attachments["hello.txt"].Stub || a.Attachments["hello.txt"].Length != 11 {
		t.Errorf("att1 body %s (%v), want the attachment as an 11-byte stub", rows[0].Doc, err)
	}
	if rows[1].Rev != o1 || rows[1].Doc == nil || rows[2].Rev != o1 || rows[2].Doc == nil {
		t.Errorf("o1 rows %+v %+v, want both at %s with a body", rows[1], rows[2], o1)
	}
	if !rows[3].Deleted || rows[3].Doc != nil {
		t.Errorf("gone row %+v, want deleted", rows[3])
	}

	// The same request with Accept: application/json alone is refused.
	body := `{"docs":[{"id":"o1","rev":"` + o1 + `"}]}`
	for accept, want := range map[string]int{"application/json": 406, "multipart/mixed": 200, "": 200} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, db.URL()+"/_bulk_get?revs=false", strings.NewReader(body))
		req.SetBasicAuth("alice", "alicepw")
		req.Header.Set("Content-Type", "application/json")
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := sg.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("_bulk_get with Accept %q: %d, want %d", accept, resp.StatusCode, want)
		}
	}
}

// TestErrorStatuses: what a person must fix is permanent, and says so.
func TestErrorStatuses(t *testing.T) {
	t.Parallel()
	db := sg.CreateDB(t, "")
	db.PutUser("alice", "alicepw", "orders")
	db.PutUser("bob", "bobpw", "eu")
	db.Put("o1", "", orders(1, "orders"))
	db.WaitCached()
	tests := []struct {
		name   string
		c      *feed.Client
		call   func(context.Context, *feed.Client) error
		status int
	}{
		{name: "no credentials", c: client(t, db.URL(), "", nil), call: changes, status: 401},
		{name: "wrong password", c: client(t, db.URL(), "alice", func(o *feed.Options) { o.Password = "wrong" }), call: changes, status: 401},
		{name: "unknown user", c: client(t, db.URL(), "mallory", nil), call: changes, status: 401},
		{name: "missing database", c: client(t, sg.PublicURL+"/nosuchdb", "alice", nil), call: changes, status: 401},
		{name: "document of another channel", c: client(t, db.URL(), "bob", nil), call: getDoc("o1"), status: 403},
		{name: "missing document", c: client(t, db.URL(), "alice", nil), call: getDoc("nosuch"), status: 404},
		{name: "bad since", c: client(t, db.URL(), "alice", nil), call: func(ctx context.Context, c *feed.Client) error {
			_, err := c.Changes(ctx, json.RawMessage(`"garbage"`), 0)
			return err
		}, status: 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.call(t.Context(), tt.c)
			var se *feed.StatusError
			if !errors.As(err, &se) || se.Status != tt.status {
				t.Fatalf("error %v, want status %d", err, tt.status)
			}
			if feed.Transient(err) {
				t.Errorf("Transient(%v) = true, want false", err)
			}
			if strings.Contains(err.Error(), "pw") || strings.Contains(err.Error(), "wrong") {
				t.Errorf("error %q shows a password", err)
			}
		})
	}
}

func changes(ctx context.Context, c *feed.Client) error {
	_, err := c.Changes(ctx, nil, 0)
	return err
}

func getDoc(id string) func(context.Context, *feed.Client) error {
	return func(ctx context.Context, c *feed.Client) error {
		_, _, err := c.Get(ctx, id)
		return err
	}
}

// TestKeyspace: Sync Gateway 3.1.0 with walrus serves the default
// collection's keyspace (db._default._default) for every call the worker
// makes, but refuses named collections in legacy mode, which walrus forces.
func TestKeyspace(t *testing.T) {
	t.Parallel()
	db := sg.CreateDB(t, "")
	db.PutUser("alice", "alicepw", "orders")
	o1 := db.Put("o1", "", orders(1, "orders"))
	o2 := db.Put("o2", "", orders(2, "orders"))
	db.Delete("o2", o2)
	db.WaitCached()
	for _, fetch := range fetchModes {
		c := client(t, db.URL()+"._default._default", "alice", func(o *feed.Options) { o.Fetch = fetch })
		got, _, _, _ := readAll(t, c, nil)
		if got["o1"].Rev != o1 || got["o1"].Body == nil || !got["o2"].Deleted || len(got) != 2 {
			t.Errorf("%s keyspace feed: %+v", fetch, got)
		}
		// update_seq moves without a write when Sync Gateway releases the
		// sequences it reserved unused (1.5 s after its last reservation):
		// Now must be the value read just before it or just after.
		before := fmt.Sprintf(`"%v"`, db.Admin(http.MethodGet, "/", nil)["update_seq"])
		now, err := c.Now(t.Context())
		after := fmt.Sprintf(`"%v"`, db.Admin(http.MethodGet, "/", nil)["update_seq"])
		if err != nil || (string(now) != before && string(now) != after) {
			t.Errorf("Now on the keyspace: %s, %v; want %s or %s (the database's update_seq, as a string)", now, err, before, after)
		}
		if _, rev, err := c.Get(t.Context(), "o1"); err != nil || rev != o1 {
			t.Errorf("Get on the keyspace: %s, %v", rev, err)
		}
	}

	// A named collection: 3.1.0 with walrus cannot create one.
	name := strings.ReplaceAll(testenv.Name(t), "-", "_") + "_c"
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, sg.AdminURL+"/"+name+"/",
		strings.NewReader(`{"server":"walrus:","bucket":"`+name+`","num_index_replicas":0,"enable_shared_bucket_access":false,`+
			`"scopes":{"sc":{"collections":{"col":{"sync":"function(doc){channel(doc.channels);}"}}}}}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := sg.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "scopes are not allowed with legacy config") {
		t.Errorf("creating a named collection: %d %s; 3.1.0 with walrus refused it before (if this passes now, test collections here)", resp.StatusCode, b)
	}
	_, err = client(t, db.URL()+".sc.col", "alice", nil).Changes(t.Context(), nil, 0)
	var se *feed.StatusError
	if !errors.As(err, &se) || se.Status != http.StatusNotFound {
		t.Errorf("feed of a missing keyspace: %v, want 404", err)
	}
}

// TestPerDocumentFetch runs the edge_server fetch path (no _bulk_get: one
// GET per document, at most Concurrency at a time) against Sync Gateway's
// document API, which Edge Server shares, and checks it reaches the same
// states as _bulk_get. No real Edge Server runs here.
func TestPerDocumentFetch(t *testing.T) {
	t.Parallel()
	db := sg.CreateDB(t, "")
	db.PutUser("alice", "alicepw", "orders")
	revs := map[string]string{}
	for i := range 30 {
		id := fmt.Sprintf("d/%02d é", i)
		revs[id] = db.Put(id, "", orders(i, "orders"))
	}
	for i := range 30 {
		id := fmt.Sprintf("d/%02d é", i)
		switch i % 3 {
		case 0:
			revs[id] = db.Put(id, revs[id], orders(100+i, "orders"))
		case 1:
			db.Delete(id, revs[id])
		}
	}
	db.Put("x", "", orders(1, "eu"))
	db.WaitCached()
	bulk, _, _, _ := readAll(t, client(t, db.URL(), "alice", func(o *feed.Options) { o.Fetch = config.FetchBulkGet }), nil)
	perDoc, _, _, _ := readAll(t, client(t, db.URL(), "alice", func(o *feed.Options) {
		o.SourceType, o.Fetch, o.Concurrency = config.SourceEdgeServer, config.FetchBulkGet, 3
	}), nil)
	if len(bulk) != 30 {
		t.Fatalf("bulk_get read %d documents, want 30", len(bulk))
	}
	if d := cmp.Diff(bulk, perDoc); d != "" {
		t.Errorf("per-document GETs differ from _bulk_get (-bulk +per-document):\n%s", d)
	}
}
