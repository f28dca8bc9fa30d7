package feed

import (
	"context"
	"errors"
	"mime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
)

// Tests against the replay of real Sync Gateway exchanges (replay_test.go).
// Sequences, revisions and bodies below are the captured ones.

const (
	revO1v3  = "3-d57282ac9782b3e27fedac41b910f19c"
	revWeird = "1-57efedb8cf56edf401502d12c96aad80"
	revAtt1  = "1-b08981faaf5977c18e4612f9fa22a107"
	revO4    = "1-8a0bad17607e4798fa4850acda759bd5"
	revE1    = "1-892e2d1c5f0bf2ee70dd86be03688b6f"
	revO3v2  = "2-640d473a677e83ef0a2684c8f7d63dbd"
)

// TestSyncGatewayReplayFeeds reads captured feeds whose rows are all live.
func TestSyncGatewayReplayFeeds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		version string
		capture string
		user    string
		since   string
		timeout time.Duration
		ignore  []string
		edit    func(*Options)
		want    *Batch
	}{
		{
			name: "limit pages keep the string last_seq", version: "4.0.2", capture: "22", user: "alice",
			since: "0", timeout: time.Second, edit: func(o *Options) { o.Limit = 2 },
			want: &Batch{
				Rows: []Row{{Seq: raw(`7`), ID: "a/b c+dé", Rev: revWeird,
					Doc: raw(`{"channels":["orders"],"n":5,"_id":"a/b c+dé","_rev":"1-57efedb8cf56edf401502d12c96aad80","_cv":"18ea842863660000@u8OsTyoXvUnIhZn65lp6mQ"}`)}},
				LastSeq: raw(`"7"`), Pending: -1, Full: true,
			},
		},
		{
			name: "active_only at the source", version: "4.0.2", capture: "23", user: "alice",
			since: "0", timeout: time.Second, edit: func(o *Options) { o.ActiveOnly = true },
			want: &Batch{
				Rows: []Row{
					{Seq: raw(`7`), ID: "a/b c+dé", Rev: revWeird, Doc: raw(`{"channels":["orders"],"n":5,"_id":"a/b c+dé","_rev":"1-57efedb8cf56edf401502d12c96aad80","_cv":"18ea842863660000@u8OsTyoXvUnIhZn65lp6mQ"}`)},
					{Seq: raw(`9`), ID: "o1", Rev: revO1v3, Doc: raw(`{"channels":["orders"],"n":111,"_id":"o1","_rev":"3-d57282ac9782b3e27fedac41b910f19c","_cv":"18ea842b3a0b0000@u8OsTyoXvUnIhZn65lp6mQ"}`)},
					{Seq: raw(`14`), ID: "att1", Rev: revAtt1, Doc: raw(`{"channels":["orders"],"n":6,"_id":"att1","_rev":"1-b08981faaf5977c18e4612f9fa22a107","_cv":"18ea842bb3c50000@u8OsTyoXvUnIhZn65lp6mQ","_attachments":{"hello.txt":{"content_type":"text/plain","digest":"sha1-Kq5sNclPz7QV2+lfQIuc6R7oRu0=","length":11,"revpos":1,"stub":true}}}`)},
					{Seq: raw(`15`), ID: "o4", Rev: revO4, Doc: raw(`{"channels":["orders"],"n":7,"_id":"o4","_rev":"1-8a0bad17607e4798fa4850acda759bd5","_cv":"18ea842bb56e0000@u8OsTyoXvUnIhZn65lp6mQ"}`)},
				},
				LastSeq: raw(`"15"`), Pending: -1,
			},
		},
		{
			name: "compound seqs after a grant, one per page", version: "4.0.2", capture: "32", user: "alice",
			since: "15", timeout: time.Second, edit: func(o *Options) { o.Limit = 1 },
			want: &Batch{
				Rows: []Row{{Seq: raw(`"18:6"`), ID: "e1", Rev: revE1,
					Doc: raw(`{"channels":["eu"],"n":4,"_id":"e1","_rev":"1-892e2d1c5f0bf2ee70dd86be03688b6f","_cv":"18ea8428623e0000@u8OsTyoXvUnIhZn65lp6mQ"}`)}},
				LastSeq: raw(`"18:6"`), Pending: -1, Full: true,
			},
		},
		{
			name: "another user sees other channels", version: "4.0.2", capture: "25", user: "bob",
			since: "0", timeout: time.Second,
			want: &Batch{
				Rows: []Row{
					{Seq: raw(`6`), ID: "e1", Rev: revE1, Doc: raw(`{"channels":["eu"],"n":4,"_id":"e1","_rev":"1-892e2d1c5f0bf2ee70dd86be03688b6f","_cv":"18ea8428623e0000@u8OsTyoXvUnIhZn65lp6mQ"}`)},
					{Seq: raw(`13`), ID: "o3", Rev: revO3v2, Doc: raw(`{"channels":["eu"],"n":33,"_id":"o3","_rev":"2-640d473a677e83ef0a2684c8f7d63dbd","_cv":"18ea842bb0c80000@u8OsTyoXvUnIhZn65lp6mQ"}`)},
				},
				LastSeq: raw(`"13"`), Pending: -1,
			},
		},
		{
			name: "long-poll timeout with nothing new", version: "4.0.2", capture: "28", user: "alice",
			since: "100", timeout: 1500 * time.Millisecond, edit: func(o *Options) { o.Fetch = config.FetchBulkGet },
			want: &Batch{Rows: []Row{}, LastSeq: raw(`"100"`), Pending: -1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Captured before any revocation: revocations=true changes nothing.
			r := newReplay(t, tt.version, tt.capture).ignoring(append(tt.ignore, "revocations")...)
			got, err := r.client(tt.user, tt.edit).Changes(t.Context(), raw(tt.since), tt.timeout)
			checkBatch(t, got, err, tt.want)
			if seen := r.requests(); len(seen) != 1 || !strings.HasPrefix(seen[0].File, tt.capture) {
				t.Errorf("requests %+v, want one answered by capture %s", seen, tt.capture)
			}
		})
	}
}

// TestSyncGatewayReplayErrors checks how captured error answers classify.
func TestSyncGatewayReplayErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		capture  string
		url      string // below the public server; default /db1
		user     string
		password string
		call     func(context.Context, *Client) error
		status   int
		reason   string
	}{
		{name: "no credentials", capture: "59", call: changesFrom("0"), status: 401, reason: "Unauthorized: Login required"},
		{name: "wrong password", capture: "58", user: "alice", password: "wrong", call: changesFrom("0"), status: 401, reason: "Unauthorized: Invalid login"},
		{name: "missing database with credentials is 401", capture: "60", url: "/nosuchdb", user: "alice", call: changesFrom(""), status: 401, reason: "Unauthorized: Invalid login"},
		{name: "bad since", capture: "65", user: "alice", call: changesFrom(`"garbage"`), status: 400, reason: `Bad Request: Invalid sequence: "garbage"`},
		{name: "missing document", capture: "53", user: "alice", call: get("nosuchdoc"), status: 404, reason: "not_found: missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newReplay(t, "4.0.2", tt.capture).ignoring("limit", "revocations")
			c := r.client("", func(o *Options) {
				o.Fetch = config.FetchBulkGet // the captures did not ask include_docs
				if tt.url != "" {
					o.URL = r.public.URL + tt.url
				}
				if tt.user != "" {
					o.Username, o.Password = tt.user, tt.user+"pw"
					if tt.password != "" {
						o.Password = tt.password
					}
				}
			})
			err := tt.call(t.Context(), c)
			var se *StatusError
			if !errors.As(err, &se) || se.Status != tt.status || se.Reason != tt.reason {
				t.Fatalf("error %v, want a StatusError %d %q", err, tt.status, tt.reason)
			}
			if Transient(err) {
				t.Errorf("Transient(%v) = true, want false: a person must act", err)
			}
			if strings.Contains(err.Error(), "pw") {
				t.Errorf("error %q leaks the password", err)
			}
		})
	}
}

func changesFrom(since string) func(context.Context, *Client) error {
	return func(ctx context.Context, c *Client) error {
		_, err := c.Changes(ctx, raw(since), 0)
		return err
	}
}

func get(id string) func(context.Context, *Client) error {
	return func(ctx context.Context, c *Client) error {
		_, _, err := c.Get(ctx, id)
		return err
	}
}

// TestSyncGatewayReplayWinners lists the captured _all_docs of a user.
func TestSyncGatewayReplayWinners(t *testing.T) {
	t.Parallel()
	r := newReplay(t, "4.0.2", "62")
	var got []DocRev
	err := r.client("alice", nil).Winners(t.Context(), 100, func(p []DocRev) error {
		got = append(got, p...)
		return nil
	})
	if err != nil {
		t.Fatalf("Winners: %v", err)
	}
	want := []DocRev{{"a/b c+dé", revWeird}, {"att1", revAtt1}, {"e1", revE1}, {"o1", revO1v3}, {"o3", revO3v2}, {"o4", revO4}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("winners (-want +got):\n%s", diff)
	}
}

// TestSyncGatewayReplayGetEscapedID reads the captured document whose id
// holds '/', a space, '+' and 'é'.
func TestSyncGatewayReplayGetEscapedID(t *testing.T) {
	t.Parallel()
	r := newReplay(t, "4.0.2", "64")
	doc, rev, err := r.client("alice", nil).Get(t.Context(), "a/b c+dé")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if rev != revWeird || !strings.Contains(string(doc), `"_id":"a/b c+dé"`) {
		t.Errorf("Get = %s, %s", doc, rev)
	}
}

// TestSyncGatewayReplayKeyspace reads the captured feed of a named
// collection (db2.sc.col) and its database's update_seq.
func TestSyncGatewayReplayKeyspace(t *testing.T) {
	t.Parallel()
	// The feed was captured without limit (four rows fit any limit) and
	// before any revocation.
	r := newReplay(t, "4.0.2", "84", "85").ignoring("limit", "revocations")
	c := r.client("carol", func(o *Options) { o.URL = r.public.URL + "/db2.sc.col" })
	b, err := c.Changes(t.Context(), raw("0"), 0)
	if err != nil {
		t.Fatalf("Changes: %v", err)
	}
	var ids []string
	for _, row := range b.Rows {
		ids = append(ids, row.ID)
	}
	if want := []string{"k1", "k3", "k2"}; !cmp.Equal(ids, want) || string(b.LastSeq) != `"5"` {
		t.Errorf("rows %v last_seq %s, want %v and \"5\"", ids, b.LastSeq, want)
	}
	if _, err := c.Now(t.Context()); err != nil {
		t.Errorf("Now on a keyspace URL: %v", err)
	}
	for _, s := range r.requests() {
		if strings.HasPrefix(s.RequestURI, "/db2.sc.col/") && s.File == "" {
			t.Errorf("request %s was not answered by a capture", s.RequestURI)
		}
	}
	if got := r.requests()[1].RequestURI; got != "/db2/" {
		t.Errorf("Now asked %s, want the database's /db2/ (a keyspace has no db info: capture 86)", got)
	}
}

// TestSyncGatewayReplayNestedAttachments parses the captured _bulk_get
// answer with attachments=true (capture 42): a document with an attachment
// is a nested multipart/related whose first part is the JSON.
func TestSyncGatewayReplayNestedAttachments(t *testing.T) {
	t.Parallel()
	var x *exchange
	for _, e := range loadExchanges(t, "4.0.2") {
		if strings.HasPrefix(e.file, "42") {
			x = e
		}
	}
	if x == nil {
		t.Fatal("capture 42 missing")
	}
	_, params, err := mime.ParseMediaType(x.header.Get("Content-Type"))
	if err != nil {
		t.Fatal(err)
	}
	answers, err := parseBulkMultipart(x.answer, params["boundary"])
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	var got []string
	for _, a := range answers {
		got = append(got, a.id+" "+a.rev)
	}
	if want := []string{"att1 " + revAtt1, "o4 " + revO4}; !cmp.Equal(got, want) {
		t.Errorf("answers %v, want %v", got, want)
	}
	if len(answers) > 0 && !strings.Contains(string(answers[0].body), `"data":"aGVsbG8gd29ybGQ="`) {
		t.Errorf("att1 body %s, want the inline attachment", answers[0].body)
	}
}
