package syncgateway

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

// streamPasswordEnv holds the test user's password for the stacks' jobs
// (the stack resolves secrets from the process environment).
const streamPasswordEnv = "SG_STREAM_TEST_PASSWORD"

// TestStreamPipeline: a job in each streaming mode Sync Gateway offers,
// reading as a user restricted to channel "orders", catches up, opens one
// stream, and what happens while that stream is open (inserts, updates,
// deletes, documents moved out of and into the channel, unicode ids) ends
// in PostgreSQL exactly as the user sees the database, through that one
// stream.
func TestStreamPipeline(t *testing.T) {
	t.Parallel()
	os.Setenv(streamPasswordEnv, "alicepw")
	eachStreamCase(t, func(t *testing.T, mode, fetch string, db *testenv.SGDatabase, revs map[string]string, put func(string, map[string]any)) {
		for i := range 10 {
			put(fmt.Sprintf("o-%02d", i), orders(i, "orders"))
			put(fmt.Sprintf("e-%02d", i), orders(i, "eu"))
		}
		db.WaitCached()
		s := newSGStreamStack(t, db.URL(), config.Feed{Mode: mode, Fetch: fetch})
		stop := runStreaming(t, s)
		defer stop()
		s.Logs().WaitFor(t, `msg="stream opened" job=sg`, time.Minute)

		for i := range 20 {
			put(fmt.Sprintf("n-%02d ü/é+%d", i, i), orders(i, "orders"))
		}
		for i := range 5 {
			put(fmt.Sprintf("o-%02d", i), orders(100+i, "orders"))
		}
		for _, id := range []string{"o-05", "n-03 ü/é+3", "e-00"} {
			db.Delete(id, revs[id])
		}
		put("o-06", orders(6, "eu"))           // moved out
		put("e-01", orders(1, "eu", "orders")) // moved in
		put(unicodeIDs[2], orders(1, "orders"))
		db.WaitCached()
		want := db.Visible("alice", "alicepw")
		wrote := time.Now()
		got := waitOutput(t, s, want)
		t.Logf("%d documents visible to alice; the output equals them %s after the last write", len(got), time.Since(wrote).Round(time.Millisecond))

		s.Logs().CheckOneStream(t)
	})
}

// newSGStreamStack is a stack with one job, "sg", reading url as alice
// into one PostgreSQL output, with the feed settings f (limit 50 and a 2 s
// timeout unless set).
func newSGStreamStack(t *testing.T, url string, f config.Feed) *stack.Stack {
	t.Helper()
	if f.Limit == 0 {
		f.Limit = 50
	}
	if f.Timeout == 0 {
		f.Timeout = config.Duration(2 * time.Second)
	}
	cfg := stack.PostgresJob("sg",
		config.Source{Type: config.SourceSyncGateway, URL: url,
			Auth: &config.Auth{Type: "basic", Username: "alice", Password: &config.SecretRef{Env: streamPasswordEnv}}},
		f)
	return stack.ForTest(t, stack.Options{Config: cfg})
}

// TestStreamPipelineCutByPageBytes: with fetch bulk_get and page_bytes at
// its minimum (64 KiB), bursts of 16 KiB documents written while the stream
// is open come in stream batches whose bodies the budget cuts after a few
// documents; in both streaming modes, the rows after each cut still reach
// PostgreSQL, which ends equal to what alice can read.
func TestStreamPipelineCutByPageBytes(t *testing.T) {
	t.Parallel()
	os.Setenv(streamPasswordEnv, "alicepw")
	for _, mode := range []string{config.ModeContinuous, config.ModeWebSocket} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db := sg.CreateDB(t, "")
			db.PutUser("alice", "alicepw", "orders")
			db.Put("before", "", orders(0, "orders"))
			db.WaitCached()
			s := newSGStreamStack(t, db.URL(), config.Feed{Mode: mode, Fetch: config.FetchBulkGet, PageBytes: 64 << 10})
			stop := runStreaming(t, s)
			defer stop()
			s.Logs().WaitFor(t, `msg="stream opened" job=sg`, time.Minute)
			pad := strings.Repeat("x", 16<<10)
			for burst := range 3 {
				docs := make([]map[string]any, 0, 30)
				for i := range 30 {
					d := orders(i, "orders")
					d["_id"], d["pad"] = fmt.Sprintf("b%d-%02d", burst, i), pad
					docs = append(docs, d)
				}
				if status, body := db.Public(http.MethodPost, "/_bulk_docs", "alice", "alicepw", map[string]any{"docs": docs}); status != http.StatusCreated {
					t.Fatalf("_bulk_docs: %d %s", status, body)
				}
				time.Sleep(2 * time.Second)
			}
			db.WaitCached()
			got := waitOutput(t, s, db.Visible("alice", "alicepw"))
			t.Logf("%d documents visible to alice reached PostgreSQL", len(got))
			if logs := s.Logs().String(); !strings.Contains(logs, `reason="page_bytes: the bodies fetched`) {
				t.Errorf("no batch was cut by page_bytes: the test did not test the cut")
			}
		})
	}
}

// runStreaming runs the stack's pipeline in the background with one poller
// invocation lasting the whole test, and returns the function that stops
// it.
func runStreaming(t *testing.T, s *stack.Stack) (stop func()) {
	t.Helper()
	_, stop = s.RunInBackground(t, localrun.Options{Tick: 10 * time.Minute, PollerTimeout: 3 * time.Minute})
	return stop
}

// waitOutput waits up to a minute for the output table to hold exactly
// want (doc id → rev) and returns what it holds.
func waitOutput(t *testing.T, s *stack.Stack, want map[string]string) map[string]string {
	t.Helper()
	var got map[string]string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		var err error
		if got, err = s.Revs(t.Context(), "sg", "pg"); err != nil {
			// The writer creates the table with its first change.
			if strings.Contains(err.Error(), "42P01") {
				continue
			}
			t.Fatalf("read output: %v", err)
		}
		if cmp.Equal(want, got) {
			return got
		}
	}
	t.Fatalf("postgres differs from what alice can read after a minute (-alice +postgres):\n%s", cmp.Diff(want, got))
	return nil
}
