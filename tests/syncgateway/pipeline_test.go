package syncgateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/provision"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// pipelineStack is one job reading a Sync Gateway database as a
// channel-restricted user into a PostgreSQL table, through the real poller,
// SQS queues (the local AWS emulator) and writer, hosted in this process.
type pipelineStack struct {
	t     *testing.T
	table string
	deps  *pipeline.Deps
	logs  *syncBuffer
}

func newPipelineStack(t *testing.T, db *testenv.SGDatabase, user, password, fetch string, limit int) *pipelineStack {
	t.Helper()
	return newPipelineStackAuth(t, db, config.AuthBasic, user, password, fetch, limit)
}

// newPipelineStackAuth is newPipelineStack with the source's auth type
// (basic or session).
func newPipelineStackAuth(t *testing.T, db *testenv.SGDatabase, authType, user, password, fetch string, limit int) *pipelineStack {
	t.Helper()
	awsCfg := testenv.AWS(t)
	testenv.Postgres(t) // fails early, with a hint, when PostgreSQL is down
	prefix := testenv.Name(t)
	if len(prefix) > 28 {
		prefix = prefix[len(prefix)-28:]
	}
	prefix = "s" + strings.TrimLeft(prefix, "-")
	s := &pipelineStack{t: t, table: strings.ReplaceAll(prefix, "-", "_"), logs: &syncBuffer{}}
	doc := fmt.Sprintf(`{
		"stack": {"prefix": %q, "bucket": "changes-worker-tests", "poller_timeout": "20s", "writer_timeout": "10s"},
		"jobs": [{"id": "sg", "source": {"type": "sync_gateway", "url": %q,
				"auth": {"type": %q, "username": %q, "password": {"env": "SG_TEST_PASSWORD"}}},
			"feed": {"limit": %d, "timeout": "2s", "fetch": %q}, "lease": {"ttl": "10s"},
			"outputs": [{"id": "pg", "type": "postgres", "max_receive_count": 4,
				"postgres": {"dsn": {"env": "SG_TEST_PG_DSN"}, "table": %q, "create_tables": true}}]}]}`,
		prefix, db.URL(), authType, user, limit, fetch, s.table)
	path := filepath.Join(t.TempDir(), "jobs.json")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("load config: %v", err)
	}
	lookup := func(k string) (string, bool) {
		switch k {
		case "SG_TEST_PASSWORD":
			return password, true
		case "SG_TEST_PG_DSN":
			return testenv.PostgresDSN(t), true
		}
		return "", false
	}
	log := slog.New(slog.NewTextHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s.deps = pipeline.New(cfg, awsCfg, lookup, log, io.Discard)
	t.Cleanup(s.deps.Close)
	if _, err := provision.Apply(t.Context(), provision.Clients{DynamoDB: s.deps.DynamoDB, SQS: s.deps.SQS, S3: s.deps.S3}, cfg); err != nil {
		t.Fatalf("provision: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pipeline log (last lines):\n%s", s.logs.tail(40))
		}
	})
	return s
}

// runUntilIdle runs pollers and writers until the job is caught up and
// its queue drained, and fails the test on dead letters.
func (s *pipelineStack) runUntilIdle(ctx context.Context) localrun.Summary {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	rt := &localrun.Runtime{Deps: s.deps, Opts: localrun.Options{UntilIdle: true, Tick: 2 * time.Second}, Log: s.deps.Log}
	if err := rt.Run(ctx); err != nil {
		s.t.Fatalf("run until idle: %v", err)
	}
	sum := rt.Summary()
	for k, st := range sum.Outputs {
		if st.DeadLettered != 0 {
			s.t.Errorf("%s: %d messages dead-lettered", k, st.DeadLettered)
		}
	}
	return sum
}

// pgState returns doc id → rev of the rows in the output table, and the
// size of the largest body.
func (s *pipelineStack) pgState(ctx context.Context) (map[string]string, int) {
	s.t.Helper()
	rows, err := testenv.Postgres(s.t).Query(ctx, "SELECT doc_id, rev, octet_length(body::text) FROM "+pgx.Identifier{s.table}.Sanitize())
	if err != nil {
		s.t.Fatalf("read output table: %v", err)
	}
	got, largest := map[string]string{}, 0
	for rows.Next() {
		var id, rev string
		var n int
		if err := rows.Scan(&id, &rev, &n); err != nil {
			s.t.Fatal(err)
		}
		got[id] = rev
		largest = max(largest, n)
	}
	if err := rows.Err(); err != nil {
		s.t.Fatal(err)
	}
	return got, largest
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
				db.WaitCached()
				sum := s.runUntilIdle(ctx)
				want := db.Visible("alice", "alicepw")
				got, largest := s.pgState(ctx)
				if d := cmp.Diff(want, got); d != "" {
					t.Errorf("%s: postgres differs from what alice can read (-alice +postgres):\n%s", phase, d)
				}
				if _, ok := want[bigID]; ok && largest < 300*1024 {
					t.Errorf("%s: the largest body in postgres is %d bytes, want the ~400 KB document", phase, largest)
				}
				t.Logf("%s: %d documents visible to alice, %d changes read", phase, len(want), sum.Read)
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

// syncBuffer is a concurrency-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) tail(n int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	lines := strings.Split(strings.TrimRight(w.b.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
