package feed

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
)

// Deleted, removed and revoked rows, Accept for _bulk_get, and feed
// positions, against the replay of real Sync Gateway 3.1.0 exchanges
// (testdata/syncgateway/3.1.0/10-40, made by capture-3.1.0.sh) and 4.0.2.

const (
	revO1    = "1-b84aa47d1e4e5253f5995e28b21a4a18"
	revO1v2  = "2-d10919272b87157485b3565a844597af"
	revO2del = "2-10d659680c479e409bb487da4fd9877b"
	revO3out = "2-096080dc6ba3eec1383074fb28ec3d76" // 3.1.0 captures: o3 moved to eu
)

// db3 is a replay client for the 3.1.0 captures' database db3.
func (r *replay) db3(edit func(*Options)) *Client {
	return r.client("alice", func(o *Options) {
		o.URL = r.public.URL + "/db3"
		if edit != nil {
			edit(o)
		}
	})
}

// TestSyncGatewayBulkGetAcceptsMultipart: Sync Gateway answers _bulk_get only
// in multipart and refuses Accept: application/json with 406 (capture 23);
// the client must accept multipart there and JSON everywhere else.
func TestSyncGatewayBulkGetAcceptsMultipart(t *testing.T) {
	t.Parallel()
	r := newReplay(t, "3.1.0", "22", "28", "29")
	rows := []Row{
		{Seq: raw(`8`), ID: "o1", Rev: revO1v2},
		{Seq: raw(`8`), ID: "o1", Rev: revO1},          // an older revision, still readable
		{Seq: raw(`9`), ID: "o2", Rev: revO2del},       // the tombstone itself
		{Seq: raw(`10`), ID: "o3", Rev: revO3out},      // moved out of alice's channels
		{Seq: raw(`7`), ID: "a/b c+dé", Rev: revWeird}, // escaped id
		{Seq: raw(`11`), ID: "nosuch", Rev: "1-abc"},   // unknown: 404 part, then GET 404
		{Seq: raw(`12`), ID: "o1", Rev: "9-ffff"},      // gone: 404 part, then the winner
	}
	c := r.db3(func(o *Options) { o.Fetch = config.FetchBulkGet })
	if err := c.FetchDocs(t.Context(), rows); err != nil {
		t.Fatalf("FetchDocs: %v", err)
	}
	want := []Row{
		{Seq: raw(`8`), ID: "o1", Rev: revO1v2, Doc: raw(`{"_id":"o1","_rev":"2-d10919272b87157485b3565a844597af","channels":["orders"],"n":11}`)},
		{Seq: raw(`8`), ID: "o1", Rev: revO1, Doc: raw(`{"_id":"o1","_rev":"1-b84aa47d1e4e5253f5995e28b21a4a18","channels":["orders"],"n":1}`)},
		{Seq: raw(`9`), ID: "o2", Rev: revO2del, Deleted: true},
		{Seq: raw(`10`), ID: "o3", Rev: revO3out, Removed: true},
		{Seq: raw(`7`), ID: "a/b c+dé", Rev: revWeird, Doc: raw(`{"_id":"a/b c+dé","_rev":"1-57efedb8cf56edf401502d12c96aad80","channels":["orders"],"n":5}`)},
		{Seq: raw(`11`), ID: "nosuch", Rev: "1-abc", Deleted: true},
		{Seq: raw(`12`), ID: "o1", Rev: revO1v2, Doc: raw(`{"_id":"o1","_rev":"2-d10919272b87157485b3565a844597af","channels":["orders"],"n":11}`)},
	}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	for _, s := range r.requests() {
		multipart := strings.Contains(s.Accept, "multipart/")
		if bulk := strings.Contains(s.RequestURI, "/_bulk_get"); bulk != multipart {
			t.Errorf("%s %s sent Accept %q (multipart accepted: %t)", s.Method, s.RequestURI, s.Accept, multipart)
		}
		if !strings.Contains(s.Accept, "application/json") {
			t.Errorf("%s %s sent Accept %q without application/json", s.Method, s.RequestURI, s.Accept)
		}
	}
}

// TestCouchDBBulkGetStaysJSON: CouchDB's _bulk_get is asked for JSON.
func TestCouchDBBulkGetStaysJSON(t *testing.T) {
	t.Parallel()
	f := newFakeSource(t, func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get("Accept"); got != "application/json" {
			t.Errorf("Accept %q, want application/json", got)
		}
		reply(200, `{"results":[{"id":"a","docs":[{"ok":{"_id":"a","_rev":"1-a"}}]}]}`)(w, r)
	})
	rows := []Row{{Seq: raw(`1`), ID: "a", Rev: "1-a"}}
	if err := f.client(func(o *Options) { o.Fetch = config.FetchBulkGet }).FetchDocs(t.Context(), rows); err != nil {
		t.Fatalf("FetchDocs: %v", err)
	}
}

// TestSyncGatewayRowSemantics: a row is exactly one of live, deleted or
// removed. A deletion a channel-restricted user sees carries "deleted" and
// "removed" together and is a deletion; a revoked row (revocations=true) is
// a removal whose doc is a {"_removed":true} stub, never a body.
func TestSyncGatewayRowSemantics(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		version  string
		capture  string
		ignore   []string
		db       string
		since    string
		fetch    string
		limit    int
		want     []Row
		wantLast string
	}{
		{
			name: "3.1.0 include_docs: update, delete, move out", version: "3.1.0", capture: "20", db: "/db3", since: "0",
			want: []Row{
				{Seq: raw(`7`), ID: "a/b c+dé", Rev: revWeird, Doc: raw(`{"_id":"a/b c+dé","_rev":"1-57efedb8cf56edf401502d12c96aad80","channels":["orders"],"n":5}`)},
				{Seq: raw(`8`), ID: "o1", Rev: revO1v2, Doc: raw(`{"_id":"o1","_rev":"2-d10919272b87157485b3565a844597af","channels":["orders"],"n":11}`)},
				{Seq: raw(`9`), ID: "o2", Rev: revO2del, Deleted: true},
				{Seq: raw(`10`), ID: "o3", Rev: revO3out, Removed: true},
			},
			wantLast: `"10"`,
		},
		{
			name: "3.1.0 without docs (bulk_get jobs)", version: "3.1.0", capture: "21", db: "/db3", since: "0", fetch: config.FetchBulkGet,
			want: []Row{
				{Seq: raw(`7`), ID: "a/b c+dé", Rev: revWeird},
				{Seq: raw(`8`), ID: "o1", Rev: revO1v2},
				{Seq: raw(`9`), ID: "o2", Rev: revO2del, Deleted: true},
				{Seq: raw(`10`), ID: "o3", Rev: revO3out, Removed: true},
			},
			wantLast: `"10"`,
		},
		{
			name: "3.1.0 revocation", version: "3.1.0", capture: "37", db: "/db3", since: "12",
			want: []Row{
				{Seq: raw(`"13:6"`), ID: "e1", Rev: revE1, Removed: true, Revoked: true},
				{Seq: raw(`"13:10"`), ID: "o3", Rev: revO3out, Removed: true, Revoked: true},
			},
			wantLast: `"13"`,
		},
		{
			name: "4.0.2 include_docs", version: "4.0.2", capture: "21", ignore: []string{"revocations"}, since: "7",
			want: []Row{
				{Seq: raw(`9`), ID: "o1", Rev: revO1v3, Doc: raw(`{"channels":["orders"],"n":111,"_id":"o1","_rev":"3-d57282ac9782b3e27fedac41b910f19c","_cv":"18ea842b3a0b0000@u8OsTyoXvUnIhZn65lp6mQ"}`)},
				{Seq: raw(`12`), ID: "o2", Rev: revO2del, Deleted: true},
				{Seq: raw(`13`), ID: "o3", Rev: revO3v2, Removed: true},
				{Seq: raw(`14`), ID: "att1", Rev: revAtt1, Doc: raw(`{"channels":["orders"],"n":6,"_id":"att1","_rev":"1-b08981faaf5977c18e4612f9fa22a107","_cv":"18ea842bb3c50000@u8OsTyoXvUnIhZn65lp6mQ","_attachments":{"hello.txt":{"content_type":"text/plain","digest":"sha1-Kq5sNclPz7QV2+lfQIuc6R7oRu0=","length":11,"revpos":1,"stub":true}}}`)},
				{Seq: raw(`15`), ID: "o4", Rev: revO4, Doc: raw(`{"channels":["orders"],"n":7,"_id":"o4","_rev":"1-8a0bad17607e4798fa4850acda759bd5","_cv":"18ea842bb56e0000@u8OsTyoXvUnIhZn65lp6mQ"}`)},
			},
			wantLast: `"15"`,
		},
		{
			name: "4.0.2 revocation", version: "4.0.2", capture: "36", since: "20",
			want: []Row{
				{Seq: raw(`"21:6"`), ID: "e1", Rev: revE1, Removed: true, Revoked: true},
				{Seq: raw(`"21:13"`), ID: "o3", Rev: revO3v2, Removed: true, Revoked: true},
			},
			wantLast: `"21"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newReplay(t, tt.version, tt.capture).ignoring(tt.ignore...)
			c := r.client("alice", func(o *Options) {
				if tt.db != "" {
					o.URL = r.public.URL + tt.db
				}
				if tt.fetch != "" {
					o.Fetch = tt.fetch
				}
			})
			b, err := c.Changes(t.Context(), raw(tt.since), time.Second)
			if err != nil {
				t.Fatalf("Changes: %v", err)
			}
			if diff := cmp.Diff(tt.want, b.Rows); diff != "" {
				t.Errorf("rows (-want +got):\n%s", diff)
			}
			if string(b.LastSeq) != tt.wantLast {
				t.Errorf("LastSeq %s, want %s", b.LastSeq, tt.wantLast)
			}
			for _, row := range b.Rows {
				if row.Deleted && row.Removed {
					t.Errorf("row %s is both deleted and removed", row.ID)
				}
			}
		})
	}
}

// TestSyncGatewayRevocationsAsked: without revocations=true Sync Gateway
// says nothing when a channel is revoked (capture 38: only the _user row),
// so the client always asks for them.
func TestSyncGatewayRevocationsAsked(t *testing.T) {
	t.Parallel()
	r := newReplay(t, "3.1.0", "37", "38")
	b, err := r.db3(nil).Changes(t.Context(), raw("12"), time.Second)
	if err != nil {
		t.Fatalf("Changes: %v", err)
	}
	if len(b.Rows) != 2 {
		t.Errorf("rows %+v, want the two revoked documents", b.Rows)
	}
	if seen := r.requests(); len(seen) != 1 || !strings.HasPrefix(seen[0].File, "37") {
		t.Errorf("requests %+v, want one answered by capture 37 (revocations=true)", seen)
	}
}

// TestSyncGatewayForbiddenTold: Sync Gateway answers 403 both for a deleted
// document whose tombstone left the reader's channels and for one the
// reader may no longer see; the leaf revisions tell them apart.
func TestSyncGatewayForbiddenTold(t *testing.T) {
	t.Parallel()
	r := newReplay(t, "3.1.0", "24", "25", "26", "27", "39", "40")
	c := r.db3(nil)

	// Get: a deletion is not found; the others stay 403.
	if _, _, err := c.Get(t.Context(), "o2"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(o2), deleted: error %v, want ErrNotFound", err)
	}
	for _, id := range []string{"o3", "e1"} { // moved out; revoked
		_, _, err := c.Get(t.Context(), id)
		var se *StatusError
		if !errors.As(err, &se) || se.Status != http.StatusForbidden || errors.Is(err, ErrNotFound) {
			t.Errorf("Get(%s): error %v, want a 403 StatusError", id, err)
		}
	}

	// The fallback of FetchDocs when a revision is gone.
	tests := []struct {
		row, want Row
	}{
		{row: Row{ID: "o2", Rev: "1-gone"}, want: Row{ID: "o2", Rev: revO2del, Deleted: true}},
		{row: Row{ID: "o3", Rev: "1-gone"}, want: Row{ID: "o3", Rev: "1-gone", Removed: true}},
		{row: Row{ID: "e1", Rev: "1-gone"}, want: Row{ID: "e1", Rev: "1-gone", Removed: true}},
	}
	for _, tt := range tests {
		row := tt.row
		if err := c.fetchWinner(t.Context(), &row); err != nil {
			t.Fatalf("fetchWinner(%s): %v", row.ID, err)
		}
		if diff := cmp.Diff(tt.want, row); diff != "" {
			t.Errorf("fetchWinner(%s) (-want +got):\n%s", row.ID, diff)
		}
	}
}

// TestSyncGatewayUserOnlyPage: a full page holding only a "_user/" row
// (capture 34, limit 1) is not the end of the feed; the next, empty, page
// (35) is.
func TestSyncGatewayUserOnlyPage(t *testing.T) {
	t.Parallel()
	r := newReplay(t, "3.1.0", "32", "33", "34", "35")
	c := r.db3(func(o *Options) { o.Limit = 1 })
	since := raw(`"10"`)
	var caughtUp []bool
	var ids []string
	for range 4 {
		b, err := c.Changes(t.Context(), since, time.Second)
		if err != nil {
			t.Fatalf("Changes(%s): %v", since, err)
		}
		for _, row := range b.Rows {
			ids = append(ids, row.ID)
		}
		caughtUp = append(caughtUp, b.CaughtUp())
		since = b.LastSeq
	}
	if want := []string{"e1", "o3"}; !cmp.Equal(ids, want) {
		t.Errorf("rows %v, want %v", ids, want)
	}
	if want := []bool{false, false, false, true}; !cmp.Equal(caughtUp, want) {
		t.Errorf("caught up after each page %v, want %v", caughtUp, want)
	}
}

// TestSyncGatewayNowIsAString: _changes writes every last_seq as a JSON
// string, so the position Now returns (from update_seq, a number) is one too.
func TestSyncGatewayNowIsAString(t *testing.T) {
	t.Parallel()
	r := newReplay(t, "3.1.0", "30")
	seq, err := r.db3(nil).Now(t.Context())
	if err != nil {
		t.Fatalf("Now: %v", err)
	}
	if string(seq) != `"11"` {
		t.Errorf("Now = %s, want \"11\"", seq)
	}
}

// TestBatchCaughtUp covers every way a batch can end.
func TestBatchCaughtUp(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		batch Batch
		want  bool
	}{
		{name: "empty, not full", batch: Batch{Pending: -1}, want: true},
		{name: "rows, not full", batch: Batch{Rows: []Row{{ID: "a"}}, Pending: -1}, want: true},
		{name: "rows, full", batch: Batch{Rows: []Row{{ID: "a"}}, Pending: -1, Full: true}, want: false},
		{name: "full page of dropped rows", batch: Batch{Pending: -1, Full: true}, want: false},
		{name: "pending zero with rows", batch: Batch{Rows: []Row{{ID: "a"}}, Pending: 0, Full: true}, want: true},
		{name: "pending left, rows dropped", batch: Batch{Pending: 3}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.batch.CaughtUp(); got != tt.want {
				t.Errorf("CaughtUp() = %t, want %t", got, tt.want)
			}
		})
	}
}

// TestSyncGatewayRevocationCycle: Sync Gateway 3.1.0 pages a revocation from
// its start again once the page after the last revoked row is asked with a
// small limit (seen on the real server; these are its answers, limit 2,
// since "30:21"). The client reads the whole revocation instead and drops
// what it had read.
func TestSyncGatewayRevocationCycle(t *testing.T) {
	t.Parallel()
	row := func(id, seq string) string {
		return `{"seq":"` + seq + `","id":"` + id + `","changes":[{"rev":"1-a"}],"revoked":true}`
	}
	f := newFakeSource(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("limit") {
		case "2":
			reply(200, `{"results":[`+row("e-0", "30:14")+`,`+row("big-eu", "30:18")+`],"last_seq":"30:18"}`)(w, r)
		case "10000":
			reply(200, `{"results":[`+row("e-0", "30:14")+`,`+row("big-eu", "30:18")+`,`+row("o-06", "30:20")+`,`+
				row("o-07", "30:21")+`,`+row("e-3", "30:29")+`],"last_seq":"30"}`)(w, r)
		default:
			t.Errorf("unexpected limit %s", r.URL.Query().Get("limit"))
		}
	})
	c := f.client(func(o *Options) { o.SourceType, o.Limit = config.SourceSyncGateway, 2 })
	b, err := c.Changes(t.Context(), raw(`"30:21"`), time.Second)
	if err != nil {
		t.Fatalf("Changes: %v", err)
	}
	want := []Row{{Seq: raw(`"30:29"`), ID: "e-3", Rev: "1-a", Removed: true, Revoked: true}}
	if diff := cmp.Diff(want, b.Rows); diff != "" || string(b.LastSeq) != `"30"` {
		t.Errorf("rows (-want +got):\n%s\nlast_seq %s, want \"30\"", diff, b.LastSeq)
	}
	if n := len(f.requests()); n != 2 {
		t.Errorf("%d requests, want 2 (limit 2, then the whole revocation)", n)
	}

	// An answer that still goes back never moves the position back: a page
	// of such rows reads as nothing new, and a full one is an error.
	g := newFakeSource(t, reply(200, `{"results":[`+row("e-0", "30:14")+`],"last_seq":"30:14"}`))
	b, err = g.client(func(o *Options) { o.SourceType, o.Limit = config.SourceSyncGateway, 1 }).Changes(t.Context(), raw(`"30:21"`), time.Second)
	if err != nil || len(b.Rows) != 0 || string(b.LastSeq) != `"30:21"` {
		t.Errorf("a page before since: %+v, %v; want no rows and since kept", b, err)
	}
	full := make([]string, revocationPage)
	for i := range full {
		full[i] = row(fmt.Sprintf("d%d", i), fmt.Sprintf("30:%d", i%20))
	}
	f2 := newFakeSource(t, reply(200, `{"results":[`+strings.Join(full, ",")+`],"last_seq":"30:19"}`))
	_, err = f2.client(func(o *Options) { o.SourceType, o.Limit = config.SourceSyncGateway, revocationPage }).Changes(t.Context(), raw(`"30:21"`), time.Second)
	if !errors.Is(err, ErrMalformed) {
		t.Errorf("a full page before since: %v, want ErrMalformed", err)
	}
	// A last_seq alone before since does not move the position back.
	h := newFakeSource(t, reply(200, `{"results":[],"last_seq":"3"}`))
	b, err = h.client(func(o *Options) { o.SourceType = config.SourceSyncGateway }).Changes(t.Context(), raw(`"30:21"`), time.Second)
	if err != nil || string(b.LastSeq) != `"30:21"` {
		t.Errorf("last_seq before since: %s, %v; want since kept", b.LastSeq, err)
	}
}

// TestSGSeqOrder checks the order of Sync Gateway sequences.
func TestSGSeqOrder(t *testing.T) {
	t.Parallel()
	ordered := []string{`"5"`, `"6:2"`, `"6:4"`, `"6"`, `7`, `"8::10"`, `"9"`, `"10"`, `"11:3"`}
	for i := range ordered {
		for j := range ordered {
			a, okA := parseSGSeq(raw(ordered[i]))
			b, okB := parseSGSeq(raw(ordered[j]))
			if !okA || !okB {
				t.Fatalf("parse %s or %s", ordered[i], ordered[j])
			}
			if got := a.before(b); got != (i < j) {
				t.Errorf("%s before %s = %t, want %t", ordered[i], ordered[j], got, i < j)
			}
		}
	}
	for _, bad := range []string{`"a"`, `"1:2:3:4"`, `"5:"`, `{}`} {
		if _, ok := parseSGSeq(raw(bad)); ok {
			t.Errorf("parseSGSeq(%s) ok, want not", bad)
		}
	}
}
