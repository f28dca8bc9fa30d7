package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/failure"
	"github.com/changes-worker/changes-worker/shared/statetable/halt"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

// haltReceiver is an HTTP output that records the documents it accepted, in
// order, and refuses some with 400 (a permanent failure).
type haltReceiver struct {
	mu      sync.Mutex
	applied []string
	refuse  map[string]bool
}

func (r *haltReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	id, _ := url.PathUnescape(strings.TrimPrefix(req.URL.EscapedPath(), "/docs/"))
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refuse[id] {
		http.Error(w, "refused by the test", http.StatusBadRequest)
		return
	}
	r.applied = append(r.applied, id)
	w.WriteHeader(http.StatusNoContent)
}

func (r *haltReceiver) setRefuse(id string, v bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refuse[id] = v
}

func (r *haltReceiver) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.applied)
}

// newHaltStack is a test stack whose job has one output, "ledger": HTTP to
// recv (served for the test), ordering total, on_failure halt, halting on a
// change's second transient failure.
func newHaltStack(t *testing.T, recv *haltReceiver) *testStack {
	t.Helper()
	srv := httptest.NewServer(recv)
	t.Cleanup(srv.Close)
	out := &config.Output{ID: "ledger", Type: config.OutputHTTP, Ordering: config.OrderingTotal, OnFailure: config.OnFailureHalt,
		MaxReceiveCount: 2, HTTP: &config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}"}}
	job := &config.Job{ID: "orders", Feed: config.Feed{Limit: 100, Timeout: config.Duration(2 * time.Second)},
		Lease: config.Lease{TTL: config.Duration(6 * time.Second)}, Outputs: []*config.Output{out}}
	cfg := &config.File{
		Stack: config.Stack{PollerTimeout: config.Duration(15 * time.Second), WriterTimeout: config.Duration(10 * time.Second)},
		Jobs:  []*config.Job{job},
	}
	return &testStack{Stack: stack.ForTest(t, stack.Options{Config: cfg}), t: t}
}

// waitFor polls cond every 200 ms (testenv.Poll) until it holds, failing
// the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := testenv.Poll(t.Context(), d, 200*time.Millisecond, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting %s for %s: %v", d, what, err)
	}
}

// An output with ordering total and on_failure halt, against the local
// services with the whole pipeline running (poller, SQS FIFO, writer): a
// change the output refuses stops the output there, nothing after it is
// delivered, status and halt show tell the operator; halt skip moves it to
// the DLQ with its reason and the rest follows in feed order; halt retry,
// after the output was fixed, delivers it and the rest in feed order.
func TestHaltSkipAndRetry(t *testing.T) {
	t.Parallel()
	recv := &haltReceiver{refuse: map[string]bool{"poison": true, "fixme": true}}
	s := newHaltStack(t, recv)
	s.runInBackground()

	halted := func() []haltShown {
		var list []haltShown
		out := s.mustCLI(t.Context(), "halt", "show", "--json")
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("halt show --json: %v\n%s", err, out)
		}
		return list
	}
	for _, id := range []string{"d01", "d02", "poison", "d04", "d05"} {
		s.putDoc(id, map[string]any{"n": id}, "")
	}
	waitFor(t, 90*time.Second, "the output to halt", func() bool { return len(halted()) == 1 })
	h := halted()[0]
	if h.DocID != "poison" || h.Class != "permanent" || h.Reason != "http_status" || h.HTTPStatus != 400 || h.Group != "ledger" || len(h.Seq) == 0 {
		t.Fatalf("halt %+v, want document poison, permanent http_status 400, group ledger", h)
	}
	if h.Envelope == nil || h.Envelope.DocID != "poison" {
		t.Errorf("halt show kept no envelope of the blocked change: %+v", h.Envelope)
	}
	// Nothing after the refused change is delivered while halted.
	time.Sleep(4 * time.Second)
	if d := cmp.Diff([]string{"d01", "d02"}, recv.got()); d != "" {
		t.Fatalf("delivered while halted (-want +got):\n%s", d)
	}
	text := s.mustCLI(t.Context(), "status")
	if !strings.Contains(text, "ledger HALTED") || !strings.Contains(text, `at document "poison"`) || !strings.Contains(text, "permanent http_status (http 400)") {
		t.Errorf("status does not show the halt:\n%s", text)
	}
	var rows []jobStatus
	if err := json.Unmarshal([]byte(s.mustCLI(t.Context(), "status", "--json")), &rows); err != nil {
		t.Fatal(err)
	}
	if o := rows[0].Outputs[0]; len(o.Halted) != 1 || o.Halted[0].DocID != "poison" || o.Halted[0].Since.IsZero() || o.DLQDepth != 0 {
		t.Errorf("status --json output %+v, want halted at poison, DLQ empty", o)
	}
	show := s.mustCLI(t.Context(), "halt", "show", "--body")
	for _, want := range []string{"ledger HALTED (ordering total)", `document  "poison"`, "permanent http_status (http 400)", `"n":"poison"`} {
		if !strings.Contains(squeeze(show), squeeze(want)) {
			t.Errorf("halt show --body lacks %q:\n%s", want, show)
		}
	}

	// Skip: the change goes to the DLQ with its reason, the rest follows.
	out := s.mustCLI(t.Context(), "halt", "skip", "--yes", "--wait", "60s")
	if !strings.Contains(out, `document "poison" moved to`) {
		t.Errorf("halt skip printed %q", out)
	}
	waitFor(t, 60*time.Second, "d04 and d05", func() bool { return len(recv.got()) >= 4 })
	if d := cmp.Diff([]string{"d01", "d02", "d04", "d05"}, recv.got()); d != "" {
		t.Errorf("delivered after skip (-want +got):\n%s", d)
	}
	dlqOut := s.mustCLI(t.Context(), "dlq", "show")
	for _, want := range []string{`"poison"`, "permanent http_status (http 400)", "skipped by the operator"} {
		if !strings.Contains(dlqOut, want) {
			t.Errorf("dlq show lacks %q:\n%s", want, dlqOut)
		}
	}
	if len(halted()) != 0 {
		t.Errorf("still halted after the skip: %+v", halted())
	}

	// Retry after the output was fixed: the change and the rest, in order.
	for _, id := range []string{"fixme", "d07", "d08"} {
		s.putDoc(id, map[string]any{"n": id}, "")
	}
	waitFor(t, 90*time.Second, "the output to halt at fixme", func() bool {
		l := halted()
		return len(l) == 1 && l[0].DocID == "fixme"
	})
	time.Sleep(3 * time.Second)
	if got := recv.got(); len(got) != 4 {
		t.Fatalf("delivered while halted at fixme: %v", got)
	}
	// A retry before the fix fails again and says so.
	if _, _, err := s.cli(t.Context(), "", "halt", "retry", "--wait", "60s"); err == nil || !strings.Contains(err.Error(), "failed again") {
		t.Errorf("halt retry before the fix: %v, want failed again", err)
	}
	recv.setRefuse("fixme", false)
	out = s.mustCLI(t.Context(), "halt", "retry", "--wait", "60s")
	if !strings.Contains(out, `document "fixme" delivered`) {
		t.Errorf("halt retry printed %q", out)
	}
	waitFor(t, 60*time.Second, "d07 and d08", func() bool { return len(recv.got()) >= 7 })
	if d := cmp.Diff([]string{"d01", "d02", "d04", "d05", "fixme", "d07", "d08"}, recv.got()); d != "" {
		t.Errorf("delivered (-want +got):\n%s", d)
	}
	if n := s.depth(s.queues("ledger").DLQURL); n != 1 {
		t.Errorf("DLQ holds %d messages, want only the skipped one", n)
	}
}

// A halt whose blocked change is gone from the queue (purged, or dropped
// after the retention period) holds back everything of its group; halt clear
// forgets it and the output goes on in order.
func TestHaltClearGone(t *testing.T) {
	t.Parallel()
	recv := &haltReceiver{refuse: map[string]bool{}}
	s := newHaltStack(t, recv)
	store := &halt.Store{DB: s.Deps.DynamoDB, Table: s.Config.TableName()}
	now := time.Now().UTC()
	if _, err := store.Record(t.Context(), halt.State{Job: "orders", Output: "ledger", Group: "ledger", MessageID: "purged-message",
		DocID: "lost", Seq: "1", Class: "permanent", Reason: "http_status", HTTPStatus: 400, Since: now, LastAt: now}); err != nil {
		t.Fatal(err)
	}
	s.runInBackground()
	for _, id := range []string{"a", "b", "c"} {
		s.putDoc(id, map[string]any{"n": id}, "")
	}
	// The poller queues them; the writer holds them back.
	waitFor(t, 60*time.Second, "the changes to be queued", func() bool {
		d, err := dlq.QueueDepth(t.Context(), s.Deps.SQS, s.queues("ledger").WorkURL)
		return err == nil && d.Total() == 3
	})
	time.Sleep(5 * time.Second)
	if got := recv.got(); len(got) != 0 {
		t.Fatalf("delivered while halted: %v", got)
	}
	out := s.mustCLI(t.Context(), "halt", "clear", "--yes")
	if !strings.Contains(out, `halt at document "lost" cleared`) {
		t.Errorf("halt clear printed %q", out)
	}
	waitFor(t, 60*time.Second, "a, b and c", func() bool { return len(recv.got()) >= 3 })
	if d := cmp.Diff([]string{"a", "b", "c"}, recv.got()); d != "" {
		t.Errorf("delivered after clear (-want +got):\n%s", d)
	}
}

// halt show --json names the failure fields it shares with dlq show --json
// (failure.Record) as dlq show does, so one script reads both.
func TestHaltShownNamesFailureFieldsAsDLQShow(t *testing.T) {
	t.Parallel()
	name := func(f reflect.StructField) string {
		n, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		return n
	}
	rec := reflect.TypeFor[failure.Record]()
	shown := reflect.TypeFor[haltShown]()
	shared := 0
	for i := range rec.NumField() {
		rf := rec.Field(i)
		hf, ok := shown.FieldByName(rf.Name)
		if !ok {
			continue
		}
		shared++
		if name(hf) != name(rf) {
			t.Errorf("%s: halt show --json names it %q, dlq show --json %q", rf.Name, name(hf), name(rf))
		}
	}
	if shared < 5 {
		t.Errorf("only %d fields shared with failure.Record; the test no longer compares what it should", shared)
	}
}
