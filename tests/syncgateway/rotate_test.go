package syncgateway

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

// The source's password rotated while the poller is warm: alice's password
// changes at Sync Gateway, the poller's requests are refused (401), and a
// few seconds later the operator stores the new password in the job's
// Secrets Manager secret. The warm poller reads the secret again and
// delivers the changes made meanwhile within a minute, with no restart.
func TestSourcePasswordRotatedWhileWarm(t *testing.T) {
	t.Parallel()
	db := sg.CreateDB(t, "")
	db.PutUser("alice", "alice-pw-1", "orders")
	name, putSecret := testenv.Secret(t, "sg-rotate", "alice-pw-1")
	cfg := stack.PostgresJob("sg",
		config.Source{Type: config.SourceSyncGateway, URL: db.URL(),
			Auth: &config.Auth{Type: config.AuthBasic, Username: "alice", Password: &config.SecretRef{Secret: name}}},
		config.Feed{Limit: 50, Timeout: config.Duration(2 * time.Second)})
	s := stack.ForTest(t, stack.Options{Config: cfg})

	_, stop := s.RunInBackground(t, localrun.Options{Tick: 5 * time.Second, PollerTimeout: 20 * time.Second})
	defer stop()

	revs := map[string]string{}
	put := func(id string, body map[string]any) { revs[id] = db.Put(id, revs[id], body) }
	for i := range 10 {
		put(fmt.Sprintf("o-%02d", i), orders(i, "orders"))
	}
	db.WaitCached()
	waitOutput(t, s, db.Visible("alice", "alice-pw-1"))

	db.PutUser("alice", "alice-pw-2", "orders")
	for i := range 5 {
		put(fmt.Sprintf("o-%02d", i), orders(100+i, "orders"))
	}
	s.Logs().WaitFor(t, `msg="source refused our credentials"`, time.Minute)
	putSecret("alice-pw-2")
	stored := time.Now()
	db.WaitCached()
	want := db.Visible("alice", "alice-pw-2")
	got := waitOutput(t, s, want)
	took := time.Since(stored)
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("output (-want +got):\n%s", d)
	}
	if took > time.Minute {
		t.Errorf("the rotated password took effect %s after it was stored, want within a minute", took.Round(time.Second))
	}
	t.Logf("rotated password stored; the warm poller delivered the changes made meanwhile %s later", took.Round(100*time.Millisecond))
}
