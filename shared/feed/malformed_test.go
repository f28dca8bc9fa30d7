package feed

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
)

// TestChangesMalformedRows: a row that names a document is a change of it
// whatever else is missing; a row that names none is reported, with its
// position, for the caller to decide on. Neither fails the page.
func TestChangesMalformedRows(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		row       string
		wantRows  []Row
		malformed *Malformed // Raw is checked apart
	}{
		{name: "no changes list", row: `{"seq":5,"id":"b"}`, wantRows: []Row{{Seq: raw(`5`), ID: "b"}}},
		{name: "empty changes list", row: `{"seq":5,"id":"b","changes":[]}`, wantRows: []Row{{Seq: raw(`5`), ID: "b"}}},
		{name: "changes not a list", row: `{"seq":5,"id":"b","changes":"2-b"}`, wantRows: []Row{{Seq: raw(`5`), ID: "b"}}},
		{name: "rev not a string", row: `{"seq":5,"id":"b","changes":[{"rev":2}]}`, wantRows: []Row{{Seq: raw(`5`), ID: "b"}}},
		{name: "revision from the included doc", row: `{"seq":5,"id":"b","changes":null,"doc":{"_id":"b","_rev":"2-b","v":2}}`,
			wantRows: []Row{{Seq: raw(`5`), ID: "b", Rev: "2-b", Doc: raw(`{"_id":"b","_rev":"2-b","v":2}`)}}},
		{name: "doc not a document is fetched", row: `{"seq":5,"id":"b","changes":[{"rev":"2-b"}],"doc":"x"}`,
			wantRows: []Row{{Seq: raw(`5`), ID: "b", Rev: "2-b"}}},
		{name: "deleted without a revision", row: `{"seq":5,"id":"b","deleted":true}`, wantRows: []Row{{Seq: raw(`5`), ID: "b", Deleted: true}}},
		{name: "null seq", row: `{"seq":null,"id":"b","changes":[{"rev":"2-b"}]}`, wantRows: []Row{{ID: "b", Rev: "2-b"}}},
		{name: "no seq", row: `{"id":"b","changes":[{"rev":"2-b"}]}`, wantRows: []Row{{ID: "b", Rev: "2-b"}}},
		{name: "empty seq", row: `{"seq":"","id":"b","changes":[{"rev":"2-b"}]}`, wantRows: []Row{{ID: "b", Rev: "2-b"}}},
		{name: "empty id", row: `{"seq":5,"id":"","changes":[{"rev":"2-b"}]}`,
			malformed: &Malformed{Before: 1, Seq: raw(`5`), After: raw(`4`), Reason: `the row's id "" is not a non-empty string`}},
		{name: "no id", row: `{"seq":5,"changes":[{"rev":"2-b"}]}`,
			malformed: &Malformed{Before: 1, Seq: raw(`5`), After: raw(`4`), Reason: "the row has no id"}},
		{name: "numeric id", row: `{"seq":5,"id":12,"changes":[{"rev":"2-b"}]}`,
			malformed: &Malformed{Before: 1, Seq: raw(`5`), After: raw(`4`), Reason: "the row's id 12 is not a non-empty string"}},
		{name: "no id, null seq", row: `{"seq":null,"changes":[]}`,
			malformed: &Malformed{Before: 1, After: raw(`4`), Reason: "the row has no id"}},
		{name: "not an object", row: `[5,"b"]`,
			malformed: &Malformed{Before: 1, After: raw(`4`), Reason: "the row is not a JSON object"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			body := `{"results":[{"seq":4,"id":"a","changes":[{"rev":"1-a"}]},` + tt.row +
				`,{"seq":6,"id":"c","changes":[{"rev":"1-c"}]}],"last_seq":6}`
			f := newFakeSource(t, reply(http.StatusOK, body))
			b, err := f.client(func(o *Options) { o.Fetch = config.FetchBulkGet }).Changes(t.Context(), raw(`3`), time.Second)
			if err != nil {
				t.Fatalf("Changes: %v", err)
			}
			want := append([]Row{{Seq: raw(`4`), ID: "a", Rev: "1-a"}}, tt.wantRows...)
			want = append(want, Row{Seq: raw(`6`), ID: "c", Rev: "1-c"})
			if diff := cmp.Diff(want, b.Rows); diff != "" {
				t.Errorf("rows (-want +got):\n%s", diff)
			}
			if string(b.LastSeq) != `6` || b.Cut != "" {
				t.Errorf("LastSeq %s, cut %q; want 6, whole", b.LastSeq, b.Cut)
			}
			if tt.malformed == nil {
				if len(b.Malformed) != 0 {
					t.Errorf("Malformed = %+v, want none", b.Malformed)
				}
				return
			}
			if len(b.Malformed) != 1 {
				t.Fatalf("Malformed = %+v, want one", b.Malformed)
			}
			got := b.Malformed[0]
			if string(got.Raw) != tt.row {
				t.Errorf("Raw = %s, want the row as sent %s", got.Raw, tt.row)
			}
			got.Raw = nil
			if diff := cmp.Diff(*tt.malformed, got); diff != "" {
				t.Errorf("malformed (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMalformedRawIsBounded keeps at most MalformedRawMax bytes of a row.
func TestMalformedRawIsBounded(t *testing.T) {
	t.Parallel()
	row := `{"seq":5,"pad":"` + strings.Repeat("x", 3*MalformedRawMax) + `"}`
	f := newFakeSource(t, reply(http.StatusOK, `{"results":[`+row+`],"last_seq":5}`))
	b, err := f.client(nil).Changes(t.Context(), nil, time.Second)
	if err != nil {
		t.Fatalf("Changes: %v", err)
	}
	if len(b.Malformed) != 1 || len(b.Malformed[0].Raw) != MalformedRawMax || string(b.Malformed[0].Raw) != row[:MalformedRawMax] {
		t.Errorf("Malformed = %d entries, want one holding the row's first %d bytes", len(b.Malformed), MalformedRawMax)
	}
}

// TestFetchDocsWithoutRevision: a row kept without a revision gets the
// document's current winner, or is a deletion when it has none.
func TestFetchDocsWithoutRevision(t *testing.T) {
	t.Parallel()
	for _, source := range []string{config.SourceCouchDB, config.SourceEdgeServer} {
		t.Run(source, func(t *testing.T) {
			t.Parallel()
			f := newFakeSource(t, route(map[string]http.HandlerFunc{
				"/db/b": byRev(map[string]http.HandlerFunc{"": reply(200, `{"_id":"b","_rev":"3-b","v":3}`)}),
				"/db/c": reply(404, `{"error":"not_found","reason":"deleted"}`),
			}))
			rows := []Row{{Seq: raw(`5`), ID: "b"}, {ID: "c"}}
			if err := f.client(func(o *Options) { o.SourceType, o.Fetch = source, config.FetchBulkGet }).FetchDocs(t.Context(), rows); err != nil {
				t.Fatalf("FetchDocs: %v", err)
			}
			want := []Row{{Seq: raw(`5`), ID: "b", Rev: "3-b", Doc: raw(`{"_id":"b","_rev":"3-b","v":3}`)}, {ID: "c", Deleted: true}}
			if diff := cmp.Diff(want, rows); diff != "" {
				t.Errorf("rows (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBatchCutBefore: the next read starts with the row cut at.
func TestBatchCutBefore(t *testing.T) {
	t.Parallel()
	mk := func() *Batch {
		return &Batch{
			Rows:      []Row{{Seq: raw(`4`), ID: "a"}, {ID: "b"}, {Seq: raw(`7`), ID: "c"}},
			LastSeq:   raw(`8`),
			Pending:   3,
			Malformed: []Malformed{{Before: 1, Seq: raw(`5`)}, {Before: 2}, {Before: 3, Seq: raw(`8`)}},
		}
	}
	tests := []struct {
		at   int
		want *Batch
	}{
		{at: 0, want: &Batch{Rows: []Row{}, LastSeq: raw(`3`), Pending: -1, Full: true, Cut: "why", Malformed: []Malformed{}}},
		{at: 1, want: &Batch{Rows: []Row{{Seq: raw(`4`), ID: "a"}}, LastSeq: raw(`4`), Pending: -1, Full: true, Cut: "why", Malformed: []Malformed{}}},
		{at: 2, want: &Batch{Rows: []Row{{Seq: raw(`4`), ID: "a"}, {ID: "b"}}, LastSeq: raw(`4`), Pending: -1, Full: true, Cut: "why",
			Malformed: []Malformed{{Before: 1, Seq: raw(`5`)}}}},
	}
	for _, tt := range tests {
		b := mk()
		b.CutBefore(tt.at, raw(`3`), "why")
		if diff := cmp.Diff(tt.want, b); diff != "" {
			t.Errorf("CutBefore(%d) (-want +got):\n%s", tt.at, diff)
		}
	}
}

// TestMalformedFirstRowFollowsSince: a malformed row with no row before it
// in the answer follows since.
func TestMalformedFirstRowFollowsSince(t *testing.T) {
	t.Parallel()
	f := newFakeSource(t, reply(http.StatusOK, `{"results":[{"seq":null,"changes":[]}],"last_seq":9}`))
	b, err := f.client(nil).Changes(t.Context(), raw(`8`), time.Second)
	if err != nil {
		t.Fatalf("Changes: %v", err)
	}
	if len(b.Malformed) != 1 || string(b.Malformed[0].After) != `8` || b.Malformed[0].Seq != nil || b.Malformed[0].Before != 0 {
		t.Errorf("Malformed = %+v, want one after since 8, without seq", b.Malformed)
	}
}
