package syncgateway

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

// pipelineStack is one job reading a Sync Gateway database as a
// channel-restricted user into a PostgreSQL table, through the real poller,
// SQS queues (the local AWS emulator) and writer, hosted in this process.
type pipelineStack struct {
	*stack.Stack
	t *testing.T
}

func newPipelineStack(t *testing.T, db *testenv.SGDatabase, user, password, fetch string, limit int) *pipelineStack {
	t.Helper()
	return newPipelineStackAuth(t, db, config.AuthBasic, user, password, fetch, limit)
}

// newPipelineStackAuth is newPipelineStack with the source's auth type
// (basic or session).
func newPipelineStackAuth(t *testing.T, db *testenv.SGDatabase, authType, user, password, fetch string, limit int) *pipelineStack {
	t.Helper()
	cfg := stack.PostgresJob("sg",
		config.Source{Type: config.SourceSyncGateway, URL: db.URL(),
			Auth: &config.Auth{Type: authType, Username: user, Password: &config.SecretRef{Env: "SG_TEST_PASSWORD"}}},
		config.Feed{Limit: limit, Timeout: config.Duration(2 * time.Second), Fetch: fetch})
	st := stack.ForTest(t, stack.Options{Config: cfg, Secrets: map[string]string{"SG_TEST_PASSWORD": password}})
	return &pipelineStack{Stack: st, t: t}
}

// converge waits for db's caches, runs the pipeline until the job is caught
// up and its queue drained, and fails the test on dead letters, and unless
// the output table holds exactly the documents user can read, at their
// revisions. It returns those documents and the size of the
// largest body in the table.
func (s *pipelineStack) converge(ctx context.Context, db *testenv.SGDatabase, user, password, phase string) (map[string]string, int) {
	s.t.Helper()
	db.WaitCached()
	sum, err := s.RunUntilIdle(ctx, localrun.Options{})
	if err != nil {
		s.t.Fatal(err)
	}
	for k, st := range sum.Outputs {
		if st.DeadLettered != 0 {
			s.t.Errorf("%s: %s: %d messages dead-lettered", phase, k, st.DeadLettered)
		}
	}
	want := db.Visible(user, password)
	got, err := s.Revs(ctx, "sg", "pg")
	if err != nil {
		s.t.Fatal(err)
	}
	largest := 0
	for id := range got {
		body, _, err := s.Body(ctx, "sg", "pg", id)
		if err != nil {
			s.t.Fatal(err)
		}
		largest = max(largest, len(body))
	}
	if d := cmp.Diff(want, got); d != "" {
		s.t.Errorf("%s: postgres differs from what %s can read (-%s +postgres):\n%s", phase, user, user, d)
	}
	s.t.Logf("%s: %d documents visible to %s, %d changes read", phase, len(want), user, sum.Read)
	return want, largest
}

// TestPipelineDeliversWhatTheUserSees is the end-to-end check: a job reading
// as a user restricted to channel "orders" ends, after every kind of change,
// with exactly the documents that user can read, at their current revisions,
// for both ways of fetching bodies. include_docs reads one row per request,
// so the feed's first page holds only the user's "_user/" row.
func TestPipelineDeliversWhatTheUserSees(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		fetch string
		limit int
	}{{config.FetchIncludeDocs, 1}, {config.FetchBulkGet, 7}} {
		t.Run(tc.fetch, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := sg.CreateDB(t, "")
			db.PutUser("alice", "alicepw", "orders")
			s := newPipelineStack(t, db, "alice", "alicepw", tc.fetch, tc.limit)
			check := func(phase string) {
				t.Helper()
				want, largest := s.converge(ctx, db, "alice", "alicepw", phase)
				if _, ok := want[bigID]; ok && largest < 300*1024 {
					t.Errorf("%s: the largest body in postgres is %d bytes, want the ~400 KB document", phase, largest)
				}
			}

			// Phase 1: documents in and out of alice's channel, unicode and
			// escaped ids, a body larger than an SQS message (claim check).
			revs := map[string]string{}
			put := func(id string, body map[string]any) { revs[id] = db.Put(id, revs[id], body) }
			for i := range 12 {
				put(fmt.Sprintf("o-%02d", i), orders(i, "orders"))
			}
			for i := range 4 {
				put(fmt.Sprintf("e-%d", i), orders(i, "eu"))
			}
			for _, id := range unicodeIDs {
				put(id, orders(1, "orders"))
			}
			put(bigID, map[string]any{"channels": []string{"orders"}, "notes": strings.Repeat("é", 200*1024)})
			put("big-eu", map[string]any{"channels": []string{"eu"}, "notes": strings.Repeat("x", 300*1024)})
			check("initial load")

			// Phase 2: updates, deletes (seen, and unseen), moves out of and
			// into the channel, a unicode update, the large body updated.
			for i := range 4 {
				put(fmt.Sprintf("o-%02d", i), orders(100+i, "orders"))
			}
			put("o-00", orders(200, "orders"))
			for _, id := range []string{"o-04", "o-05", unicodeIDs[1]} {
				db.Delete(id, revs[id])
			}
			db.Delete("e-0", revs["e-0"])
			put("o-06", orders(6, "eu"))            // moved out
			put("o-07", orders(7, "eu", "other"))   // moved out, to two channels
			put("e-1", orders(1, "eu", "orders"))   // moved in
			put("e-2", orders(2, "orders"))         // moved in, left eu
			put(unicodeIDs[0], orders(2, "orders")) // unicode update
			put(bigID, map[string]any{"channels": []string{"orders"}, "notes": strings.Repeat("ü", 200*1024), "v": 2})
			put("o-08", orders(8, "eu"))     // moved out ...
			put("o-08", orders(9, "orders")) // ... and back in
			check("updates, deletes and moves")

			// Phase 3: alice is granted eu (a backfill with compound seqs),
			// then loses it again (revocation).
			db.SetChannels("alice", "orders", "eu")
			check("after granting eu")
			put("e-3", orders(33, "eu")) // changed while visible
			db.SetChannels("alice", "orders")
			check("after revoking eu")
		})
	}
}

// unicodeIDs are ids that must survive every URL and key they become part of.
var unicodeIDs = []string{"ünïcödé/ñ doc+1", "日本語 ドキュメント", "a/b c+d%é?x=1#f"}

const bigID = "big/ünïcode dóc"
