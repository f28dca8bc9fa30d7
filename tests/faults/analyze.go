package faults

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/deliver"
)

// Generations returns the generations that sent messages, ascending.
func Generations(msgs []Message) []int64 {
	seen := map[int64]bool{}
	var out []int64
	for _, m := range msgs {
		if !seen[m.Version.Generation] {
			seen[m.Version.Generation] = true
			out = append(out, m.Version.Generation)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// OfGeneration returns the messages of generation gen.
func OfGeneration(msgs []Message, gen int64) []Message {
	var out []Message
	for _, m := range msgs {
		if m.Version.Generation == gen {
			out = append(out, m)
		}
	}
	return out
}

type changeKey struct{ doc, seq string }

// Replayed counts the changes (document and feed seq) that generation g
// queued and generation h queued again: what a takeover replayed.
func Replayed(msgs []Message, g, h int64) int {
	sent := map[changeKey]bool{}
	for _, m := range msgs {
		if m.Version.Generation == g {
			sent[changeKey{m.DocID, m.Seq}] = true
		}
	}
	again := map[changeKey]bool{}
	for _, m := range msgs {
		if m.Version.Generation == h && sent[changeKey{m.DocID, m.Seq}] {
			again[changeKey{m.DocID, m.Seq}] = true
		}
	}
	return len(again)
}

// Overlap describes messages of an older generation that SQS accepted after
// the first message of a newer one: two pollers sending at once.
type Overlap struct {
	Older, Newer int64
	NewerFirst   time.Time // the newer generation's first send
	Late         int       // messages of Older sent after NewerFirst
	LastLate     time.Time
}

func (o Overlap) String() string {
	return fmt.Sprintf("generation %d sent %d messages after generation %d started sending at %s (the last at %s, %s later)",
		o.Older, o.Late, o.Newer, o.NewerFirst.Format("15:04:05.000"), o.LastLate.Format("15:04:05.000"), o.LastLate.Sub(o.NewerFirst))
}

// Overlaps returns, for every pair of generations, the messages of the older
// one sent after the newer one's first: the pairs that sent at the same
// time. A fenced poller may finish the SendMessageBatch requests it had in
// flight (InFlightLimit), nothing more. SQS send times have millisecond
// resolution, so a message sent in the same millisecond is not late.
func Overlaps(msgs []Message) []Overlap {
	first := map[int64]time.Time{}
	for _, m := range msgs {
		if f, ok := first[m.Version.Generation]; !ok || m.Sent.Before(f) {
			first[m.Version.Generation] = m.Sent
		}
	}
	gens := Generations(msgs)
	var out []Overlap
	for i, g := range gens {
		for _, h := range gens[i+1:] {
			o := Overlap{Older: g, Newer: h, NewerFirst: first[h]}
			for _, m := range msgs {
				if m.Version.Generation == g && m.Sent.After(first[h]) {
					o.Late++
					if m.Sent.After(o.LastLate) {
						o.LastLate = m.Sent
					}
				}
			}
			if o.Late > 0 {
				out = append(out, o)
			}
		}
	}
	return out
}

// Newest returns, per document, the newest version among its messages: the
// one the output must hold.
func Newest(msgs []Message) map[string]Message {
	out := map[string]Message{}
	for _, m := range msgs {
		if cur, ok := out[m.DocID]; !ok || cur.Version.Compare(m.Version) < 0 {
			out[m.DocID] = m
		}
	}
	return out
}

// NotNewest lists the documents whose stored version is not the newest
// version sent for them (a stale message won, or the newest was lost).
func NotNewest(msgs []Message, stored map[string]deliver.Stored) []string {
	var out []string
	for id, m := range Newest(msgs) {
		st, ok := stored[id]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s: not in the versions table (newest sent %s rev %s)", id, m.Version, m.Rev))
		case st.Version != m.Version:
			out = append(out, fmt.Sprintf("%s: holds %s rev %s, newest sent %s rev %s", id, st.Version, st.Rev, m.Version, m.Rev))
		}
	}
	sort.Strings(out)
	return out
}

// HeldByOlder lists the documents the output holds at generation old
// although a newer generation sent them too: a zombie's late message won.
func HeldByOlder(msgs []Message, stored map[string]deliver.Stored, old int64) []string {
	newer := map[string]change.Version{}
	for _, m := range msgs {
		if m.Version.Generation > old {
			newer[m.DocID] = m.Version
		}
	}
	var out []string
	for id, st := range stored {
		if v, ok := newer[id]; ok && st.Version.Generation == old {
			out = append(out, fmt.Sprintf("%s: holds %s, generation %d sent it as %s", id, st.Version, v.Generation, v))
		}
	}
	sort.Strings(out)
	return out
}

// SendOffset returns the smallest (SQS send time − envelope enqueued-at)
// over generation gen's messages: about minus the sender's clock skew.
func SendOffset(msgs []Message, gen int64) (time.Duration, bool) {
	var best time.Duration
	found := false
	for _, m := range msgs {
		if m.Version.Generation != gen {
			continue
		}
		d := m.Sent.Sub(m.EnqueuedAt)
		if !found || d < best {
			best, found = d, true
		}
	}
	return best, found
}

// Final is the state of a stack after a fault scenario, once the pollers
// caught up and stopped and the writer drained the queue.
type Final struct {
	Messages     []Message         // every message the pollers queued
	Source       map[string]string // the source's winners
	Drift        []string          // PostgreSQL vs the source (want none)
	NotNewest    []string          // versions not the newest sent (want none)
	Stored       map[string]deliver.Stored
	Applications int64    // changes applied (versions raised)
	Stale        int64    // writes to the output without a version raise (want 0)
	Regressions  []string // checkpoint moved back (want none)
	WriterErrors []string
}

// Finish waits until the job caught up with the source (stop writing to it
// first; WaitCaughtUp with timeout as its stall), stops the pollers
// gracefully, lets the collector drain the queue within timeout, stops it
// and the watcher, and compares PostgreSQL with the source.
func Finish(ctx context.Context, s *Stack, cl *Cluster, col *Collector, w *Watcher, timeout time.Duration) (Final, error) {
	var f Final
	if err := s.WaitCaughtUp(ctx, timeout); err != nil {
		return f, err
	}
	if err := cl.Terminate(20 * time.Second); err != nil {
		return f, err
	}
	if err := col.Drain(ctx, timeout); err != nil {
		return f, err
	}
	col.Stop()
	w.Stop()
	var err error
	f.Messages = col.Messages()
	f.WriterErrors = col.Errors()
	f.Regressions = w.Regressions()
	if f.Source, err = s.SourceWinners(ctx); err != nil {
		return f, err
	}
	pg, err := s.Revs(ctx, Job, Output)
	if err != nil {
		return f, err
	}
	f.Drift = Drift(f.Source, pg)
	sort.Strings(f.Drift)
	if f.Stored, err = s.PGVersions(ctx); err != nil {
		return f, err
	}
	f.NotNewest = NotNewest(f.Messages, f.Stored)
	if f.Applications, f.Stale, err = s.Applications(ctx); err != nil {
		return f, err
	}
	return f, nil
}
