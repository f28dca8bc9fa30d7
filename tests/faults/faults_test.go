package faults

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/pgsink"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

func TestParseEvent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		line string
		want Event
		ok   bool
	}{
		{
			name: "acquired",
			line: `time=2026-11-21T11:09:23.935Z level=INFO msg="lease acquired" job=orders owner=local-vm-19552-2 generation=2 takeover=failover previous_owner=local-vm-19320-1 checkpoint=1514`,
			want: Event{Time: time.Date(2026, 11, 21, 11, 9, 23, 935e6, time.UTC), Msg: "lease acquired", Owner: "local-vm-19552-2",
				Generation: 2, Takeover: "failover", Previous: "local-vm-19320-1"},
			ok: true,
		},
		{
			name: "lost, with a quoted error",
			line: `time=2026-11-21T11:09:24.922Z level=WARN msg="lease lost; stopping" job=orders owner=local-a-b-7-1 generation=1 error="renew lease orders: lease \"lost\""`,
			want: Event{Time: time.Date(2026, 11, 21, 11, 9, 24, 922e6, time.UTC), Msg: "lease lost; stopping", Owner: "local-a-b-7-1", Generation: 1},
			ok:   true,
		},
		{
			name: "standing by",
			line: `time=2026-11-21T11:09:17.334Z level=INFO msg="standing by" job=orders owner=local-vm-1-2 holder=local-vm-1-1 generation=1`,
			want: Event{Time: time.Date(2026, 11, 21, 11, 9, 17, 334e6, time.UTC), Msg: "standing by", Owner: "local-vm-1-2", Holder: "local-vm-1-1", Generation: 1},
			ok:   true,
		},
		{name: "other message", line: `time=2026-11-21T11:09:17.334Z level=INFO msg="lease renewed"`},
		{name: "not slog", line: `SDK 2026/11/21 11:20:03 WARN failed to discard`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := parseEvent(tt.line)
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v", ok, tt.ok)
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("event (-want +got):\n%s", d)
			}
		})
	}
}

func TestOwnerPID(t *testing.T) {
	t.Parallel()
	for owner, want := range map[string]int{
		"local-vm-19552-2":        19552,
		"local-my-host-name-42-7": 42,
		"3f1c-aws-request-id":     0,
		"":                        0,
	} {
		if got := OwnerPID(owner); got != want {
			t.Errorf("OwnerPID(%q) = %d, want %d", owner, got, want)
		}
	}
}

func msg(doc, seq string, gen, n int64, sentMS int64) Message {
	return Message{DocID: doc, Seq: seq, Version: change.Version{Generation: gen, Counter: n}, Sent: time.UnixMilli(sentMS)}
}

func TestAnalyses(t *testing.T) {
	t.Parallel()
	msgs := []Message{
		msg("a", "1", 1, 1, 1000), msg("b", "2", 1, 2, 1000), msg("c", "3", 1, 3, 1010),
		// Generation 2 takes over from seq 1 and sends b and c again, c at a
		// later seq; generation 1's in-flight batch lands after.
		msg("b", "2", 2, 1, 2000), msg("c", "4", 2, 2, 2000), msg("c", "3", 1, 4, 2100),
		msg("d", "5", 1, 5, 2100),
	}
	if got := Replayed(msgs, 1, 2); got != 1 {
		t.Errorf("Replayed = %d, want 1 (b at seq 2)", got)
	}
	want := []Overlap{{Older: 1, Newer: 2, NewerFirst: time.UnixMilli(2000), Late: 2, LastLate: time.UnixMilli(2100)}}
	if d := cmp.Diff(want, Overlaps(msgs)); d != "" {
		t.Errorf("Overlaps (-want +got):\n%s", d)
	}
	stored := map[string]deliver.Stored{
		"a": {Version: change.Version{Generation: 1, Counter: 1}},
		"b": {Version: change.Version{Generation: 2, Counter: 1}},
		"c": {Version: change.Version{Generation: 1, Counter: 4}}, // the zombie won: wrong
		"d": {Version: change.Version{Generation: 1, Counter: 5}},
	}
	if got := NotNewest(msgs, stored); len(got) != 1 {
		t.Errorf("NotNewest = %q, want only c", got)
	}
	if got := HeldByOlder(msgs, stored, 1); len(got) != 1 {
		t.Errorf("HeldByOlder = %q, want only c", got)
	}
	if got := Drift(map[string]string{"a": "1-x", "b": "2-y"}, map[string]string{"a": "1-x", "b": "1-y", "z": "1-z"}); len(got) != 2 {
		t.Errorf("Drift = %q, want b and z", got)
	}
}

// The audit counts a change the sink applies, ignores one it refuses, and
// catches writes that did not raise the version.
func TestAuditCountsStaleWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	testenv.AWS(t)
	testenv.CouchURL(t)
	testenv.PostgresDSN(t)
	s, err := NewStack(ctx, StackOptions{Name: "audit"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	out := s.Config.Jobs[0].Outputs[0]
	sink, err := pgsink.New(s.pool, *out.Postgres, out.ID)
	if err != nil {
		t.Fatal(err)
	}
	env := func(rev string, gen, n int64) *change.Envelope {
		return &change.Envelope{V: change.EnvelopeVersion, Job: Job, Output: Output, DocID: "x", Rev: rev, Seq: json.RawMessage(`1`),
			Version: change.Version{Generation: gen, Counter: n}, EnqueuedAt: time.Now(), Doc: json.RawMessage(`{"_id":"x","_rev":"` + rev + `"}`)}
	}
	for _, e := range []*change.Envelope{env("2-b", 2, 1), env("1-a", 1, 9), env("2-b", 2, 1)} {
		if errs := sink.Apply(ctx, []*change.Envelope{e}); errs[0] != nil {
			t.Fatal(errs[0])
		}
	}
	applied, stale, err := s.Applications(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if applied != 1 || stale != 0 {
		t.Errorf("after one change, an older one and a duplicate: applied %d, stale %d; want 1 and 0", applied, stale)
	}
	for _, q := range []string{
		`UPDATE ` + s.versions.Sanitize() + ` SET rev = '1-a', counter = counter WHERE doc_id = 'x'`,
		`UPDATE ` + s.data.Sanitize() + ` SET rev = '1-a' WHERE doc_id = 'x'`,
	} {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, stale, err = s.Applications(ctx); err != nil {
		t.Fatal(err)
	}
	if stale != 2 {
		t.Errorf("after two writes without a raise: stale %d, want 2", stale)
	}
}
