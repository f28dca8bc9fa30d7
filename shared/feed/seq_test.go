package feed

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
)

func TestSeqBefore(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a, b       string
		before, ok bool
	}{
		{a: `3`, b: `9`, before: true, ok: true},
		{a: `9`, b: `3`, before: false, ok: true},
		{a: `9`, b: `9`, before: false, ok: true},
		{a: `"3"`, b: `9`, before: true, ok: true},
		{a: `12345678901234567890122`, b: `12345678901234567890123`, before: true, ok: true},
		{a: `99`, b: `12345678901234567890123`, before: true, ok: true},
		{a: `"007"`, b: `8`, before: true, ok: true},
		{a: `"3:9"`, b: `"5"`, before: true, ok: true},     // triggered by 3: before 5
		{a: `"5"`, b: `"3:9"`, before: false, ok: true},    // 5 is after the grant at 3
		{a: `"10::12"`, b: `"11"`, before: true, ok: true}, // low 10
		{a: `"12"`, b: `"10::12"`, before: false, ok: true},
		{a: `"3-g1AAAA"`, b: `"12-g1BBBB"`, ok: false},
		{a: `"12-g1BBBB"`, b: `"3-g1AAAA"`, ok: false},
		{a: `"12-g1AAAA"`, b: `"12-g1BBBB"`, ok: false},
		{a: `"12-g1AAAA"`, b: `12`, ok: false},
		{a: `"now"`, b: `3`, ok: false},
		{a: `[1,"g1"]`, b: `3`, ok: false},
		{a: `null`, b: `3`, before: true, ok: true},
		{a: `3`, b: ``, before: false, ok: true},
	}
	for _, tt := range tests {
		before, ok := SeqBefore(json.RawMessage(tt.a), json.RawMessage(tt.b))
		if before != tt.before || ok != tt.ok {
			t.Errorf("SeqBefore(%s, %s) = %t, %t; want %t, %t", tt.a, tt.b, before, ok, tt.before, tt.ok)
		}
	}
}

// TestChangesLastSeqNeverGoesBack: last_seq is never before the rows it
// comes with, nor before since, where the format tells; an empty one is
// refused, or replaced by the last row's seq.
func TestChangesLastSeqNeverGoesBack(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		source string
		since  json.RawMessage
		body   string
		want   string // LastSeq
		cut    bool
	}{
		{name: "rows at 9, last_seq 3", body: `{"results":[{"seq":8,"id":"a","changes":[{"rev":"1-a"}]},{"seq":9,"id":"b","changes":[{"rev":"1-b"}]}],"last_seq":3}`,
			since: raw(`7`), want: `9`},
		{name: "nothing new, last_seq before since", since: raw(`9`), body: `{"results":[],"last_seq":3}`, want: `9`},
		{name: "numeric strings", since: raw(`"9"`), body: `{"results":[],"last_seq":"3"}`, want: `"9"`},
		{name: "sync gateway compound rows", source: config.SourceSyncGateway, since: raw(`"3"`),
			body: `{"results":[{"seq":"4:9","id":"a","changes":[{"rev":"1-a"}]}],"last_seq":"2"}`, want: `"4:9"`},
		{name: "couchdb 2 lower prefix, nothing new, is the source's position", since: raw(`"12-g1BBBB"`), body: `{"results":[],"last_seq":"3-g1AAAA"}`, want: `"3-g1AAAA"`},
		{name: "couchdb 2 lower prefix within the answer is the source's position", since: raw(`"10-g1CCCC"`),
			body: `{"results":[{"seq":"12-g1BBBB","id":"a","changes":[{"rev":"1-a"}]}],"last_seq":"11-g1AAAA"}`, want: `"11-g1AAAA"`},
		{name: "couchdb 2 rewinding with rows is the source's position", since: raw(`"12-g1BBBB"`),
			body: `{"results":[{"seq":"2-g1AAAA","id":"a","changes":[{"rev":"1-a"}]}],"last_seq":"3-g1AAAA"}`, want: `"3-g1AAAA"`},
		{name: "forward is kept", since: raw(`3`), body: `{"results":[],"last_seq":9}`, want: `9`},
		{name: "incomparable is kept", since: raw(`"12-g1BBBB"`), body: `{"results":[],"last_seq":5}`, want: `5`},
		{name: "empty last_seq after rows", since: raw(`3`),
			body: `{"results":[{"seq":4,"id":"a","changes":[{"rev":"1-a"}]}],"last_seq":""}`, want: `4`, cut: true},
		{name: "null last_seq after rows", since: raw(`3`),
			body: `{"results":[{"seq":4,"id":"a","changes":[{"rev":"1-a"}]}],"last_seq":null}`, want: `4`, cut: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeSource(t, reply(http.StatusOK, tt.body))
			c := f.client(func(o *Options) {
				if tt.source != "" {
					o.SourceType = tt.source
				}
			})
			b, err := c.Changes(t.Context(), tt.since, time.Second)
			if err != nil {
				t.Fatalf("Changes: %v", err)
			}
			if string(b.LastSeq) != tt.want {
				t.Errorf("LastSeq = %s, want %s", b.LastSeq, tt.want)
			}
			if (b.Cut != "") != tt.cut || (tt.cut && !b.Full) {
				t.Errorf("Cut = %q, Full = %t; want cut %t (and full)", b.Cut, b.Full, tt.cut)
			}
		})
	}
}

// TestChangesEmptyLastSeqIsNoReplay: an empty last_seq is an error, so the
// next request still starts from the checkpoint instead of the beginning.
func TestChangesEmptyLastSeqIsNoReplay(t *testing.T) {
	t.Parallel()
	f := newFakeSource(t, reply(http.StatusOK, `{"results":[],"last_seq":""}`))
	c := f.client(nil)
	if b, err := c.Changes(t.Context(), raw(`41`), time.Second); err == nil || !Transient(err) {
		t.Fatalf("Changes = %+v, %v; want a transient error", b, err)
	}
	if _, err := c.Changes(t.Context(), raw(`41`), time.Second); err == nil {
		t.Fatal("second Changes: no error")
	}
	for _, r := range f.requests() {
		if got := queryOf(t, r.RequestURI).Get("since"); got != "41" {
			t.Errorf("request %s has since %q, want 41", r.RequestURI, got)
		}
	}
}

// TestNotBefore keeps a checkpoint where it is when the next one is behind.
func TestNotBefore(t *testing.T) {
	t.Parallel()
	got := []string{
		string(NotBefore(raw(`3`), raw(`9`))),
		string(NotBefore(raw(`12`), raw(`9`))),
		string(NotBefore(raw(`"x"`), raw(`9`))),
		string(NotBefore(nil, raw(`9`))),
	}
	if diff := cmp.Diff([]string{`9`, `12`, `"x"`, `9`}, got); diff != "" {
		t.Errorf("NotBefore (-want +got):\n%s", diff)
	}
}

// queryOf parses the query of a request URI.
func queryOf(t *testing.T, requestURI string) url.Values {
	t.Helper()
	u, err := url.ParseRequestURI(requestURI)
	if err != nil {
		t.Fatalf("parse request URI %q: %v", requestURI, err)
	}
	return u.Query()
}

// TestCouchDBOtherReplica: CouchDB 2+ sequences are opaque; their numeric
// prefix is a sum over whichever shard copies answered, so another node of
// the cluster can answer with a lower one for changes that are new. Read
// as a poller reads (the next position is NotBefore the answer's last_seq
// and the current one), the position must move on to what the answer says,
// or every read asks for the same changes again.
func TestCouchDBOtherReplica(t *testing.T) {
	t.Parallel()
	// Node B's copies have counted fewer updates than node A's: it answers
	// the checkpoint node A gave with new rows whose prefix is lower.
	answers := map[string]string{
		`120-g1AAAA`: `{"results":[{"seq":"95-g1BBBB","id":"a","changes":[{"rev":"3-a"}]},{"seq":"96-g1BBBB","id":"b","changes":[{"rev":"2-b"}]}],"last_seq":"96-g1BBBB"}`,
		`96-g1BBBB`:  `{"results":[{"seq":"97-g1BBBB","id":"c","changes":[{"rev":"1-c"}]}],"last_seq":"97-g1BBBB"}`,
		`97-g1BBBB`:  `{"results":[],"last_seq":"97-g1BBBB"}`,
	}
	f := newFakeSource(t, func(w http.ResponseWriter, r *http.Request) {
		body, ok := answers[r.URL.Query().Get("since")]
		if !ok {
			body = `{"results":[],"last_seq":"0-g1AAAA"}`
		}
		reply(http.StatusOK, body)(w, r)
	})
	c := f.client(nil)
	pos := raw(`"120-g1AAAA"`)
	var got []string
	for range 4 {
		b, err := c.Changes(t.Context(), pos, time.Second)
		if err != nil {
			t.Fatalf("Changes from %s: %v", pos, err)
		}
		for _, r := range b.Rows {
			got = append(got, r.ID)
		}
		pos = NotBefore(b.LastSeq, pos)
	}
	if diff := cmp.Diff([]string{"a", "b", "c"}, got); diff != "" {
		t.Errorf("changes read in four reads (-want +got):\n%s", diff)
	}
	if string(pos) != `"97-g1BBBB"` {
		t.Errorf("position after four reads = %s, want \"97-g1BBBB\"", pos)
	}
}
