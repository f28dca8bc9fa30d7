package outage_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/statetable/outage"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// Against DynamoDB Local: two writers' marks make one record with the first
// Since, the last error and the sum of what they held; Clear removes it, and
// clearing again does nothing.
func TestStoreLifecycle(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, name := testenv.StateTable(t)
	s := &outage.Store{DB: db, Table: name}
	t0 := time.Date(2026, 11, 26, 8, 0, 0, 0, time.UTC)
	if got, err := s.Get(ctx, "j", "o"); err != nil || got != nil {
		t.Fatalf("before any mark: %+v, %v", got, err)
	}
	for _, st := range []outage.State{
		{Job: "j", Output: "o", Since: t0, LastAt: t0, LastError: "transient connection: refused", Held: 4},
		{Job: "j", Output: "o", Since: t0.Add(time.Minute), LastAt: t0.Add(2 * time.Minute), LastError: "transient connection: reset", Held: 6},
	} {
		if err := s.Mark(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Get(ctx, "j", "o")
	if err != nil {
		t.Fatal(err)
	}
	want := &outage.State{Job: "j", Output: "o", Since: t0, LastAt: t0.Add(2 * time.Minute), LastError: "transient connection: reset", Held: 10}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("record (-want +got):\n%s", d)
	}
	for i, want := range []bool{true, false} {
		cleared, err := s.Clear(ctx, "j", "o")
		if err != nil {
			t.Fatal(err)
		}
		if cleared != want {
			t.Errorf("clear %d: cleared %v, want %v", i+1, cleared, want)
		}
	}
	if got, err := s.Get(ctx, "j", "o"); err != nil || got != nil {
		t.Errorf("after clear: %+v, %v", got, err)
	}
}

// Against DynamoDB Local: a FIFO output's intake, paused by a writer,
// probed by one probe at a time, resuming and resumed. A paused record
// keeps its first probe change and is not deleted by Clear; Resumed deletes
// only a resuming one.
func TestIntakeLifecycle(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, name := testenv.StateTable(t)
	s := &outage.Store{DB: db, Table: name}
	t0 := time.Date(2026, 11, 26, 8, 0, 0, 0, time.UTC)
	if err := s.Mark(ctx, outage.State{Job: "j", Output: "o", Since: t0, LastAt: t0, LastError: "503", Held: 2}); err != nil {
		t.Fatal(err)
	}
	if c, err := s.ClaimProbe(ctx, "j", "o", t0, t0.Add(time.Minute)); err != nil || c != nil {
		t.Fatalf("claim before a pause: %+v, %v; want nothing to probe", c, err)
	}
	for i, probe := range []string{"m1", "m2"} {
		paused, err := s.Pause(ctx, outage.State{Job: "j", Output: "o", Since: t0, LastAt: t0.Add(time.Duration(i+1) * time.Second), LastError: "503",
			ProbeMessageID: probe, ProbeBody: `{"doc_id":"` + probe + `"}`})
		if err != nil {
			t.Fatal(err)
		}
		if paused != (i == 0) {
			t.Errorf("pause %d: paused %v, want %v", i+1, paused, i == 0)
		}
	}
	if cleared, err := s.Clear(ctx, "j", "o"); err != nil || cleared {
		t.Fatalf("clear of a paused record: %v, %v; want it kept", cleared, err)
	}
	got, err := s.Get(ctx, "j", "o")
	if err != nil {
		t.Fatal(err)
	}
	want := &outage.State{Job: "j", Output: "o", Since: t0, LastAt: t0.Add(time.Second), LastError: "503", Held: 2,
		Intake: outage.IntakePaused, PausedAt: t0.Add(time.Second), ProbeMessageID: "m1", ProbeBody: `{"doc_id":"m1"}`}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("paused record (-want +got):\n%s", d)
	}

	now, until := t0.Add(time.Minute), t0.Add(2*time.Minute)
	claimed, err := s.ClaimProbe(ctx, "j", "o", now, until)
	if err != nil || claimed == nil || claimed.ProbeMessageID != "m1" || !claimed.ProbeUntil.Equal(until) {
		t.Fatalf("claim: %+v, %v", claimed, err)
	}
	if c, err := s.ClaimProbe(ctx, "j", "o", now.Add(time.Second), until.Add(time.Second)); err != nil || c != nil {
		t.Fatalf("second claim while the first lasts: %+v, %v; want refused", c, err)
	}
	if err := s.ProbeFailed(ctx, outage.State{Job: "j", Output: "o", LastAt: now, LastError: "still 503"}, until); err != nil {
		t.Fatal(err)
	}
	if c, err := s.ClaimProbe(ctx, "j", "o", now.Add(time.Second), until.Add(time.Second)); err != nil || c == nil || c.LastError != "still 503" {
		t.Fatalf("claim after a failed probe: %+v, %v; want it taken, with the probe's error", c, err)
	}
	if ok, err := s.Resumed(ctx, "j", "o"); err != nil || ok {
		t.Fatalf("resumed while paused: %v, %v; want the record kept", ok, err)
	}
	if err := s.Resuming(ctx, "j", "o"); err != nil {
		t.Fatal(err)
	}
	if c, err := s.ClaimProbe(ctx, "j", "o", until.Add(time.Hour), until.Add(2*time.Hour)); err != nil || c != nil {
		t.Fatalf("claim of a resuming intake: %+v, %v; want nothing to probe", c, err)
	}
	if st, err := s.Get(ctx, "j", "o"); err != nil || st.Intake != outage.IntakeResuming || !st.ProbeUntil.IsZero() {
		t.Fatalf("resuming record: %+v, %v", st, err)
	}
	if ok, err := s.Resumed(ctx, "j", "o"); err != nil || !ok {
		t.Fatalf("resumed: %v, %v; want the record deleted", ok, err)
	}
	if st, err := s.Get(ctx, "j", "o"); err != nil || st != nil {
		t.Errorf("after resumed: %+v, %v; want no record", st, err)
	}
}
