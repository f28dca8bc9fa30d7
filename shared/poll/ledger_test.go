package poll

import (
	"encoding/json"
	"testing"
	"time"
)

func seqMark(seq string) mark { return mark{seq: json.RawMessage(seq), left: -1} }

// TestLedgerCheckpoint drives a ledger that starts from checkpoint 10 and
// looks at the checkpoint it gives out, and where the next read starts.
func TestLedgerCheckpoint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		run      func(l *ledger)
		wantTake string // "": nothing to write
		wantNext string
	}{
		{name: "nothing sent", run: func(*ledger) {}, wantNext: "10"},
		{name: "a chunk in flight holds the checkpoint back", run: func(l *ledger) {
			l.sent(seqMark("20"))
		}, wantNext: "20"},
		{name: "an acknowledged chunk moves it", run: func(l *ledger) {
			l.ack(l.sent(seqMark("20")))
		}, wantTake: "20", wantNext: "20"},
		{name: "a later chunk acknowledged first waits for the one before", run: func(l *ledger) {
			l.sent(seqMark("20"))
			l.ack(l.sent(seqMark("30")))
		}, wantNext: "30"},
		{name: "once the earlier one is acknowledged too, both count", run: func(l *ledger) {
			first := l.sent(seqMark("20"))
			l.ack(l.sent(seqMark("30")))
			l.ack(first)
		}, wantTake: "30", wantNext: "30"},
		{name: "it stops before the first chunk not acknowledged", run: func(l *ledger) {
			l.ack(l.sent(seqMark("20")))
			l.sent(seqMark("30"))
			l.ack(l.sent(seqMark("40")))
		}, wantTake: "20", wantNext: "40"},
		{name: "abandoned chunks never count", run: func(l *ledger) {
			l.ack(l.sent(seqMark("20")))
			late := l.sent(seqMark("30"))
			l.abandon()
			l.ack(late)
		}, wantTake: "20", wantNext: "20"},
		{name: "a position reached with nothing to queue waits for the chunks before", run: func(l *ledger) {
			l.sent(seqMark("20"))
			l.reached(seqMark("25"))
		}, wantNext: "25"},
		{name: "a position reached with nothing in flight counts", run: func(l *ledger) {
			l.reached(seqMark("25"))
		}, wantTake: "25", wantNext: "25"},
		{name: "never back where the seq format tells", run: func(l *ledger) {
			l.ack(l.sent(seqMark("5")))
		}, wantTake: "10", wantNext: "10"},
		{name: "a chunk without a seq does not move it", run: func(l *ledger) {
			l.ack(l.sent(seqMark("")))
		}, wantNext: "10"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			l := newLedger(json.RawMessage("10"), start)
			tt.run(&l)
			if got := string(l.next()); got != tt.wantNext {
				t.Errorf("next() = %q, want %q", got, tt.wantNext)
			}
			var got string
			if m, ok := l.take(start.Add(time.Minute)); ok {
				got = string(m.seq)
			}
			if got != tt.wantTake {
				t.Errorf("take() = %q, want %q", got, tt.wantTake)
			}
			if tt.wantTake != "" && string(l.checkpoint()) != tt.wantTake {
				t.Errorf("checkpoint() after take = %q, want %q", l.checkpoint(), tt.wantTake)
			}
		})
	}
}

// TestLedgerDue: a queued position falls due checkpointEvery after the
// last checkpoint was taken, with what the source had pending at it.
func TestLedgerDue(t *testing.T) {
	t.Parallel()
	// The lease's last checkpoint was taken at start, by the holder
	// before this one.
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	l := newLedger(json.RawMessage("10"), start)
	if l.due(start.Add(time.Hour)) {
		t.Fatal("due with nothing queued")
	}
	if age, ok := l.age(start.Add(time.Second)); !ok || age != time.Second {
		t.Errorf("age() = %v, %v; want the previous holder's checkpoint's, 1s, true", age, ok)
	}
	// A new holder's first checkpoint is not spaced from the previous
	// holder's: it is due at once.
	l.ack(l.sent(mark{seq: json.RawMessage("20"), left: 7}))
	first := start.Add(checkpointEvery / 4)
	if !l.due(first) || l.recent(first) {
		t.Error("the first checkpoint of a holder held back by the previous holder's")
	}
	if d, ok := l.dueIn(first); !ok || d != 0 {
		t.Errorf("dueIn() before the first checkpoint = %v, %v; want 0, true", d, ok)
	}
	if m, ok := l.take(first); !ok || string(m.seq) != "20" || m.left != 7 {
		t.Errorf("take() = %s %d, %v; want 20 7, true", m.seq, m.left, ok)
	}
	if l.due(first.Add(time.Hour)) || l.held() {
		t.Error("still held after take")
	}
	// Its later checkpoints are spaced by checkpointEvery.
	l.ack(l.sent(mark{seq: json.RawMessage("30"), left: 0}))
	if l.due(first.Add(checkpointEvery/2)) || !l.recent(first.Add(checkpointEvery/2)) {
		t.Error("due before checkpointEvery has passed since the holder's last checkpoint")
	}
	if d, ok := l.dueIn(first); !ok || d != checkpointEvery {
		t.Errorf("dueIn() = %v, %v; want %v, true", d, ok, checkpointEvery)
	}
	now := first.Add(checkpointEvery)
	if !l.due(now) {
		t.Fatal("not due once checkpointEvery has passed")
	}
	if m, ok := l.take(now); !ok || string(m.seq) != "30" {
		t.Errorf("take() = %s, %v; want 30, true", m.seq, ok)
	}
	if age, ok := l.age(now.Add(time.Second)); !ok || age != time.Second {
		t.Errorf("age() = %v, %v; want 1s, true", age, ok)
	}
}
