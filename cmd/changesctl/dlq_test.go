package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// TestDLQRoundTrip puts failed changes through the real writer into the
// DLQ, reads their reasons back with list and show, redrives them, lets the
// real writer deliver them to PostgreSQL, and purges a DLQ.
func TestDLQRoundTrip(t *testing.T) {
	ctx, s := parallelStack(t, outPG)
	q := s.queues(outPG)

	// The output already holds a newer revision of "a" (version 5.1).
	s.enqueue(q, envelope("pg", "a", "2-new", 5, 1))
	s.run(true)
	if rev, _ := s.pgRev(outPG, "a"); rev != "2-new" {
		t.Fatalf("setup: output holds %q for a, want 2-new", rev)
	}

	// An older change of "a" (4.9) and a change of "b" fail permanently at
	// the output: the writer moves them to the DLQ with the reason.
	s.enqueue(q, envelope("pg", "a", "1-old", 4, 9), envelope("pg", "b", "1-b", 4, 10))
	failure := &deliver.Error{Class: deliver.Permanent, Reason: "http_status", HTTPStatus: 422, Err: errors.New("endpoint said: field total is invalid")}
	if n := s.failThroughWriter(q, failure); n != 2 {
		t.Fatalf("writer handled %d messages, want 2", n)
	}
	if d := s.depth(q.DLQURL); d != 2 {
		t.Fatalf("dlq depth %d after the failures, want 2", d)
	}

	t.Run("list", func(t *testing.T) {
		out := s.mustCLI(ctx, "dlq", "list", "--output", "pg", "--json")
		var got dlqListing
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("list --json: %v\n%s", err, out)
		}
		if got.Scanned != 2 || len(got.Groups) != 1 {
			t.Fatalf("list: scanned %d, groups %+v", got.Scanned, got.Groups)
		}
		g := got.Groups[0]
		want := dlq.Group{Class: "permanent", Reason: "http_status", HTTPStatus: 422, Count: 2, Samples: []string{"a", "b"},
			Error: "permanent http_status (http 422): endpoint said: field total is invalid"}
		g.FirstAt, g.LastAt = time.Time{}, time.Time{}
		if len(g.Samples) == 2 && g.Samples[0] == "b" {
			g.Samples[0], g.Samples[1] = "a", "b"
		}
		if diff := cmp.Diff(want, g); diff != "" {
			t.Errorf("group (-want +got):\n%s", diff)
		}
		table := s.mustCLI(ctx, "dlq", "list", "--output", "pg")
		for _, w := range []string{"2 messages", "permanent", "http_status", "http 422", "field total is invalid"} {
			if !strings.Contains(table, w) {
				t.Errorf("list output lacks %q:\n%s", w, table)
			}
		}
	})

	t.Run("show", func(t *testing.T) {
		out := squeeze(s.mustCLI(ctx, "dlq", "show", "--output", "pg", "--limit", "2"))
		for _, w := range []string{`document "a"`, `document "b"`, "rev 1-old", "version 4.9", "permanent http_status (http 422) after 1 attempt(s)",
			"first failure", "last failure", "--body prints it"} {
			if !strings.Contains(out, w) {
				t.Errorf("show lacks %q:\n%s", w, out)
			}
		}
		if strings.Contains(out, "BODY-") {
			t.Errorf("show printed a document body without --body:\n%s", out)
		}
		var shown []dlqShown
		if err := json.Unmarshal([]byte(s.mustCLI(ctx, "dlq", "show", "--output", "pg", "--limit", "1", "--json")), &shown); err != nil {
			t.Fatal(err)
		}
		if len(shown) != 1 || shown[0].Doc != nil || shown[0].Envelope == nil || shown[0].Envelope.Doc != nil || shown[0].Failure.Attempts != 1 {
			t.Errorf("show --json without --body: %+v", shown)
		}
		id := shown[0].ID
		withBody := squeeze(s.mustCLI(ctx, "dlq", "show", "--output", "pg", "--id", id, "--body"))
		if !strings.Contains(withBody, "message "+id) || !strings.Contains(withBody, `"marker":"BODY-`) {
			t.Errorf("show --id --body:\n%s", withBody)
		}
		if _, _, err := s.cli(ctx, "", "dlq", "show", "--output", "pg", "--id", "no-such-message"); err == nil {
			t.Error("show --id of an unknown message succeeded")
		}
	})

	t.Run("redrive", func(t *testing.T) {
		out := s.mustCLI(ctx, "dlq", "redrive", "--output", "pg")
		if !strings.Contains(out, "2 messages back on "+q.WorkName) || !strings.Contains(out, "0 left in the dlq") {
			t.Errorf("redrive said:\n%s", out)
		}
		// A standard DLQ: the default mode runs an SQS message move task.
		if !strings.Contains(out, "(task, task ") {
			t.Errorf("redrive did not say how it moved the messages:\n%s", out)
		}
		if d, w := s.depth(q.DLQURL), s.depth(q.WorkURL); d != 0 || w != 2 {
			t.Fatalf("after redrive: dlq %d, work queue %d; want 0 and 2", d, w)
		}
		// The real writer delivers them; the stale revision of "a" changes
		// nothing, because the output holds a newer version.
		sum := s.run(true)
		if st := sum.Outputs["orders/pg"]; st.Delivered != 2 || st.DeadLettered != 0 {
			t.Errorf("writer stats after redrive: %+v", st)
		}
		if rev, v := s.pgRev(outPG, "a"); rev != "2-new" || v != (change.Version{Generation: 5, Counter: 1}) {
			t.Errorf("a: output holds %s at %s after the stale redrive, want 2-new at 5.1", rev, v)
		}
		if rev, v := s.pgRev(outPG, "b"); rev != "1-b" || v != (change.Version{Generation: 4, Counter: 10}) {
			t.Errorf("b: output holds %q at %s, want 1-b at 4.10", rev, v)
		}
		if out := s.mustCLI(ctx, "dlq", "list", "--output", "pg"); !strings.Contains(out, "0 messages") {
			t.Errorf("list after redrive:\n%s", out)
		}
	})

	t.Run("purge", func(t *testing.T) {
		s.enqueue(q, envelope("pg", "c", "1-c", 6, 1))
		s.failThroughWriter(q, failure)
		if _, _, err := s.cli(ctx, "n\n", "dlq", "purge", "--output", "pg"); err == nil || !strings.Contains(err.Error(), "not confirmed") {
			t.Errorf("purge answered no: %v", err)
		}
		if d := s.depth(q.DLQURL); d != 1 {
			t.Fatalf("dlq depth %d after a refused purge, want 1", d)
		}
		out := s.mustCLI(ctx, "dlq", "purge", "--output", "pg", "--yes")
		if !strings.Contains(out, "1 messages deleted") {
			t.Errorf("purge said:\n%s", out)
		}
		if err := testenv.Poll(ctx, time.Minute, 200*time.Millisecond, func(context.Context) (bool, error) {
			return s.depth(q.DLQURL) == 0, nil
		}); err != nil {
			t.Fatalf("dlq not empty a minute after purge: %v", err)
		}
	})
}

// squeeze collapses runs of white space, so tests need not know column widths.
func squeeze(s string) string { return strings.Join(strings.Fields(s), " ") }
