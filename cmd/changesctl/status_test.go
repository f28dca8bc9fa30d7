package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/changes-worker/changes-worker/shared/statetable"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/statetable/outage"
	"github.com/changes-worker/changes-worker/shared/statetable/quarantine"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// pollerCheckpoint has poller-7 on host-a hold the job's lease and write
// checkpoint "12-abc" with 3 changes pending; it returns the lease.
func (s *testStack) pollerCheckpoint() *lease.Lease {
	s.t.Helper()
	l, _, err := s.Leases.Acquire(s.t.Context(), "orders", "poller-7", "host-a", time.Minute)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.Leases.Checkpoint(s.t.Context(), l, json.RawMessage(`"12-abc"`), 3); err != nil {
		s.t.Fatal(err)
	}
	return l
}

func TestStatus(t *testing.T) {
	ctx, s := parallelStack(t, outPG, outS3)
	store := s.Leases
	l := s.pollerCheckpoint()
	authAt := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	for _, n := range []int64{120, 20000, 700} { // only a larger batch replaces the recorded one
		if err := store.NoteLargestBatch(ctx, "orders", n); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.NoteSourceAuthFailure(ctx, "orders", authAt); err != nil {
		t.Fatal(err)
	}
	pg := s.queues(outPG)
	s.enqueue(pg, envelope("pg", "a", "1-a", 1, 1), envelope("pg", "b", "1-b", 1, 2))
	s3q := s.queues(outS3)
	s.enqueue(s3q, envelope("s3", "a", "1-a", 1, 1))
	s.failThroughWriter(s3q, errPermanent)

	var rows []jobStatus
	if err := json.Unmarshal([]byte(s.mustCLI(ctx, "status", "--json")), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || len(rows[0].Outputs) != 2 {
		t.Fatalf("status --json: %+v", rows)
	}
	r := rows[0]
	if r.Role != "active" || r.Owner != "poller-7" || r.Generation != l.Generation || string(r.Checkpoint) != `"12-abc"` || r.Pending != 3 ||
		r.CheckpointAgeSecs == nil || r.HeartbeatAgeSeconds == nil || r.LeaseLeftSeconds == nil {
		t.Errorf("job row: %+v", r)
	}
	if r.LargestBatch != 20000 || r.FloodThreshold != 10000 || r.SourceAuthFailedAt == nil || !r.SourceAuthFailedAt.Equal(authAt) {
		t.Errorf("job health: largest %d threshold %d auth failed at %v", r.LargestBatch, r.FloodThreshold, r.SourceAuthFailedAt)
	}
	if o := r.Outputs[0]; o.Output != "pg" || o.Depth != 2 || o.DLQDepth != 0 || o.OldestAgeSeconds != nil {
		t.Errorf("pg row: %+v", o)
	}
	if o := r.Outputs[1]; o.Output != "s3" || o.Depth != 0 || o.DLQDepth != 1 {
		t.Errorf("s3 row: %+v", o)
	}

	table := squeeze(s.mustCLI(ctx, "status"))
	for _, w := range []string{"JOB ROLE HOLDER GEN HEARTBEAT CHECKPOINT CP AGE PENDING OUTPUT QUEUE OLDEST DLQ",
		"orders active poller-7", `"12-abc"`, " 3 pg 2 n/a 0", " s3 0 - 1",
		"orders: the source last refused our credentials at 2026-03-04T05:06:07Z",
		"orders: largest batch 20000 changes, flood threshold 10000 (a flood)"} {
		if !strings.Contains(table, w) {
			t.Errorf("status table lacks %q:\n%s", w, table)
		}
	}

	// --peek samples the oldest message and puts it back.
	time.Sleep(1100 * time.Millisecond)
	if err := json.Unmarshal([]byte(s.mustCLI(ctx, "status", "--json", "--peek")), &rows); err != nil {
		t.Fatal(err)
	}
	if o := rows[0].Outputs[0]; o.OldestAgeSeconds == nil || *o.OldestAgeSeconds < 1 || o.Depth != 2 {
		t.Errorf("pg row with --peek: %+v", o)
	}
	if _, _, err := s.cli(ctx, "", "status", "--watch", "--peek"); err == nil {
		t.Error("--watch --peek was accepted")
	}

	// --watch redraws, an interval apart, until interrupted: here once it
	// has drawn twice (however long a loaded machine takes to read the
	// status).
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	draws := &drawTimes{header: "changesctl status, every 500ms", want: 2, done: cancel}
	env := &cliEnv{stdin: strings.NewReader(""), stdout: draws, stderr: io.Discard, lookup: testenv.Lookup}
	if err := realMain(wctx, env, []string{"status", "--watch", "--interval", "500ms", "--config", s.ConfigPath}); err != nil {
		t.Fatalf("status --watch: %v", err)
	}
	if len(draws.at) < 2 {
		t.Fatalf("status --watch drew %d times in a minute:\n%s", len(draws.at), &draws.out)
	}
	if gap := draws.at[1].Sub(draws.at[0]); gap < 500*time.Millisecond {
		t.Errorf("status --watch --interval 500ms drew again after %s", gap)
	}
}

// drawTimes is the standard output of status --watch: it keeps the times
// at which the draws began, and calls done once it has seen want of them.
type drawTimes struct {
	header string
	want   int
	done   func()
	out    bytes.Buffer
	at     []time.Time
}

func (d *drawTimes) Write(p []byte) (int, error) {
	for range strings.Count(string(p), d.header) {
		if d.at = append(d.at, time.Now()); len(d.at) == d.want {
			d.done()
		}
	}
	return d.out.Write(p)
}

// TestStatusShowsQuarantine lists what the poller skipped and where it is
// blocked: a page recorded at the current checkpoint is blocked, one at an
// older position was passed since.
func TestStatusShowsQuarantine(t *testing.T) {
	ctx, s := parallelStack(t, outPG)
	s.pollerCheckpoint()
	q := &quarantine.Store{DB: s.Deps.DynamoDB, Table: s.Config.TableName()}
	for _, e := range []quarantine.Entry{
		{Job: "orders", Kind: quarantine.Row, Seq: json.RawMessage(`"9-xyz"`), After: json.RawMessage(`"8-xyz"`), Reason: "the row has no id",
			Raw: []byte(`{"seq":"9-xyz","changes":[]}`), Attempts: 3},
		{Job: "orders", Kind: quarantine.Page, Seq: json.RawMessage(`"5-old"`), Reason: "changes: malformed response: gone since", Attempts: 3},
		{Job: "orders", Kind: quarantine.Page, Seq: json.RawMessage(`"12-abc"`), Reason: "changes: malformed response: unexpected EOF", Attempts: 4},
	} {
		if err := q.Record(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	var rows []jobStatus
	if err := json.Unmarshal([]byte(s.mustCLI(ctx, "status", "--json")), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || len(rows[0].Quarantine) != 3 {
		t.Fatalf("status --json quarantine: %+v", rows)
	}
	got := map[string]quarantineStatus{}
	for _, e := range rows[0].Quarantine {
		got[e.Kind+" "+string(e.Seq)] = e
	}
	if e := got[`row "9-xyz"`]; e.State != "skipped" || e.Reason != "the row has no id" || e.Raw != `{"seq":"9-xyz","changes":[]}` ||
		e.Attempts != 3 || string(e.After) != `"8-xyz"` || e.FirstSeen.IsZero() {
		t.Errorf("row entry: %+v", e)
	}
	if e := got[`page "12-abc"`]; e.State != "blocked" || e.Attempts != 4 {
		t.Errorf("page at the checkpoint: %+v, want blocked", e)
	}
	if e := got[`page "5-old"`]; e.State != "passed" {
		t.Errorf("page behind the checkpoint: %+v, want passed", e)
	}
	text := s.mustCLI(ctx, "status")
	for _, w := range []string{`orders: BLOCKED at "12-abc"`, `orders: skipped row "9-xyz" (after "8-xyz";`, "the row has no id", `{"seq":"9-xyz","changes":[]}`} {
		if !strings.Contains(text, w) {
			t.Errorf("status text lacks %q:\n%s", w, text)
		}
	}
}

// TestStatusShowsOutputDown shows an output a writer found down: since
// when, the last error and the messages held, and whether its intake is
// paused; a record no writer has refreshed for long is shown as a past
// outage, unless its intake is paused.
func TestStatusShowsOutputDown(t *testing.T) {
	ctx, s := parallelStack(t, outPG, outS3)
	store := &outage.Store{DB: s.Deps.DynamoDB, Table: s.Config.TableName()}
	now := time.Now().UTC().Truncate(time.Millisecond)
	for _, st := range []outage.State{
		{Job: "orders", Output: "pg", Since: now.Add(-3 * time.Minute), LastAt: now, LastError: "transient connection: connect: connection refused", Held: 42},
		{Job: "orders", Output: "s3", Since: now.Add(-3 * time.Hour), LastAt: now.Add(-2 * time.Hour), LastError: "transient s3_status (http 503): slow down", Held: 7},
	} {
		if err := store.Mark(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	paused := now.Add(-2 * time.Minute)
	if _, err := store.Pause(ctx, outage.State{Job: "orders", Output: "pg", Since: now.Add(-3 * time.Minute), LastAt: paused,
		LastError: "transient connection: connect: connection refused", ProbeMessageID: "m1"}); err != nil {
		t.Fatal(err)
	}
	var rows []jobStatus
	if err := json.Unmarshal([]byte(s.mustCLI(ctx, "status", "--json")), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || len(rows[0].Outputs) != 2 {
		t.Fatalf("status --json: %+v", rows)
	}
	if d := rows[0].Outputs[0].Down; d == nil || !d.Current || d.Held != 42 || !d.Since.Equal(now.Add(-3*time.Minute)) || !strings.Contains(d.LastError, "connection refused") ||
		d.Intake != outage.IntakePaused || d.PausedAt == nil || !d.PausedAt.Equal(paused) {
		t.Errorf("pg down: %+v", d)
	}
	if d := rows[0].Outputs[1].Down; d == nil || d.Current {
		t.Errorf("s3 down: %+v, want a past outage", d)
	}
	table := squeeze(s.mustCLI(ctx, "status"))
	for _, w := range []string{" pg DOWN 0 ", "orders/pg DOWN since " + now.Add(-3*time.Minute).Format(time.RFC3339),
		"transient connection: connect: connection refused; messages held 42 times, 0 in the queue",
		"intake paused since " + paused.Format(time.RFC3339), "no message is received, the writer's probe tries the output",
		"orders/s3 was DOWN from " + now.Add(-3*time.Hour).Format(time.RFC3339)} {
		if !strings.Contains(table, w) {
			t.Errorf("status table lacks %q:\n%s", w, table)
		}
	}
	if strings.Contains(table, " s3 DOWN") {
		t.Errorf("a past outage is shown as current:\n%s", table)
	}
}

// TestStatusShowsHolderVersion: status names the version of the release
// that holds (or last held) a job's lease, as its take recorded it, and
// says so when the holder recorded none (a release before versions).
func TestStatusShowsHolderVersion(t *testing.T) {
	ctx, s := parallelStack(t, outPG)
	s.pollerCheckpoint()
	var rows []map[string]any
	if err := json.Unmarshal([]byte(s.mustCLI(ctx, "status", "--json")), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0]["holder_version"] != "devel" {
		t.Errorf("status --json: holder_version %v, want devel (a test binary's)", rows[0]["holder_version"])
	}
	if out := s.mustCLI(ctx, "status"); !strings.Contains(out, "orders: lease holder version devel\n") {
		t.Errorf("status does not name the holder's version:\n%s", out)
	}

	// A take by a release that records no version (here the previous
	// release's update, by hand) leaves the holder's version unknown.
	_, err := s.Deps.DynamoDB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.Config.TableName()), Key: statetable.Key("orders"),
		UpdateExpression:          aws.String("SET #owner = :owner, #gen = #gen + :one, #released = :false"),
		ExpressionAttributeNames:  map[string]string{"#owner": "owner", "#gen": "generation", "#released": "released"},
		ExpressionAttributeValues: map[string]ddbtypes.AttributeValue{":owner": statetable.Str("older-poller"), ":one": statetable.Num(1), ":false": &ddbtypes.AttributeValueMemberBOOL{Value: false}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var after []map[string]any
	if err := json.Unmarshal([]byte(s.mustCLI(ctx, "status", "--json")), &after); err != nil {
		t.Fatal(err)
	}
	if v, ok := after[0]["holder_version"]; ok {
		t.Errorf("status --json after an older release's take: holder_version %v, want none", v)
	}
	if out := s.mustCLI(ctx, "status"); !strings.Contains(out, "orders: lease holder version not recorded (a release before 1.0.0)\n") {
		t.Errorf("status after an older release's take does not say the version is unknown:\n%s", out)
	}
}
