package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

func TestCheckpoint(t *testing.T) {
	ctx, s := parallelStack(t, outPG)
	store := s.Leases
	get := func() *lease.State {
		t.Helper()
		st, err := store.Get(ctx, "orders")
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	if out := s.mustCLI(ctx, "checkpoint", "get"); !strings.Contains(out, "orders checkpoint (beginning), generation 0; lease none") {
		t.Errorf("get on a new job: %s", out)
	}

	// Five changes in the source: "now" is seq 5 on pouchdb-server.
	for i := range 5 {
		s.putDoc(fmt.Sprintf("d%d", i), map[string]any{"i": i}, "")
	}
	out := s.mustCLI(ctx, "checkpoint", "reset", "--from", "now", "--yes")
	if st := get(); string(st.Checkpoint) != "5" || st.Generation != 1 || st.Held(time.Now()) {
		t.Errorf("reset --from now: checkpoint %s generation %d held %t (%s)", st.Checkpoint, st.Generation, st.Held(time.Now()), out)
	}
	var got checkpointState
	if err := json.Unmarshal([]byte(s.mustCLI(ctx, "checkpoint", "get", "--json")), &got); err != nil {
		t.Fatal(err)
	}
	if string(got.Checkpoint) != "5" || got.Role != "released" || got.CheckpointAt == nil {
		t.Errorf("get --json: %+v", got)
	}

	// Declining the prompt changes nothing.
	if _, _, err := s.cli(ctx, "n\n", "checkpoint", "reset"); err == nil || !strings.Contains(err.Error(), "not confirmed") {
		t.Errorf("reset declined: %v", err)
	}
	if st := get(); string(st.Checkpoint) != "5" {
		t.Errorf("declined reset moved the checkpoint to %s", st.Checkpoint)
	}
	if _, _, err := s.cli(ctx, "", "checkpoint", "set", "--seq", "not json", "--yes"); err == nil || !strings.Contains(err.Error(), "is not JSON") {
		t.Errorf("set of a bad seq: %v", err)
	}

	// A poller holds the lease: set refuses, waits in vain, then --force
	// fences the poller out.
	poller, _, err := store.Acquire(ctx, "orders", "poller-1", "host", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.cli(ctx, "", "checkpoint", "set", "--seq", `"7-x"`, "--yes"); err == nil || !strings.Contains(err.Error(), "a poller holds the lease (poller-1") {
		t.Errorf("set under a held lease: %v", err)
	}
	if _, _, err := s.cli(ctx, "", "checkpoint", "set", "--seq", `"7-x"`, "--yes", "--wait", "300ms"); err == nil || !strings.Contains(err.Error(), "a poller holds the lease") {
		t.Errorf("set --wait under a lease held longer: %v", err)
	}
	s.mustCLI(ctx, "checkpoint", "set", "--seq", `"7-x"`, "--yes", "--force")
	if st := get(); string(st.Checkpoint) != `"7-x"` || st.Generation != poller.Generation+1 || st.TakeoverKind != lease.Forced {
		t.Errorf("set --force: checkpoint %s generation %d kind %s", st.Checkpoint, st.Generation, st.TakeoverKind)
	}
	if err := store.Checkpoint(ctx, poller, json.RawMessage(`99`), 0); !errors.Is(err, lease.ErrLeaseLost) {
		t.Errorf("the fenced poller's checkpoint write: %v, want ErrLeaseLost", err)
	}

	// --wait takes the lease at the poller's handoff.
	poller, _, err = store.Acquire(ctx, "orders", "poller-2", "host", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(time.Second)
		_ = store.Release(ctx, poller)
	}()
	out = s.mustCLI(ctx, "checkpoint", "reset", "--yes", "--wait", "30s")
	if st := get(); st.Checkpoint != nil || st.Generation != poller.Generation+1 || !strings.Contains(out, "taken as handoff") {
		t.Errorf("reset --wait: checkpoint %s generation %d: %s", st.Checkpoint, st.Generation, out)
	}
}

// TestCheckpointNowSyncGateway: for the Sync Gateway family, "now" is the
// database's update_seq, also for a keyspace URL, written as the JSON string
// Sync Gateway's last_seq always is.
func TestCheckpointNowSyncGateway(t *testing.T) {
	ctx, s := parallelStack(t, outPG)
	asked := make(chan string, 100)
	sg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked <- r.URL.Path
		if r.URL.Path != "/db/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, `{"db_name":"db","update_seq":4242,"state":"Online"}`)
	}))
	t.Cleanup(sg.Close)
	// The same stack, its job reading a Sync Gateway keyspace instead.
	cfg, err := config.Load(s.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Jobs[0].Source = config.Source{Type: config.SourceSyncGateway, URL: sg.URL + "/db.inventory.orders"}
	doc, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.ConfigPath = tempFile(t, "sg.json", doc)
	s.mustCLI(ctx, "checkpoint", "reset", "--from", "now", "--yes")
	if out := s.mustCLI(ctx, "checkpoint", "get"); !strings.Contains(out, `orders checkpoint "4242",`) {
		t.Errorf("get after reset --from now: %s", out)
	}
	if got := <-asked; got != "/db/" {
		t.Errorf("the source was asked for %s, want the database's information at /db/", got)
	}
}
