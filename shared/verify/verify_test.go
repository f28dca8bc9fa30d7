package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

// fakeSource is a source whose documents can change between reads.
type fakeSource struct {
	mu      sync.Mutex
	docs    map[string]string // id → winning rev
	deleted map[string]string // id → rev of the tombstone
	removed map[string]string // id → rev removed from the reader's channels
	// onList runs after the listing (the source changes meanwhile).
	onList func(f *fakeSource)
	seq    string
}

func (f *fakeSource) List(_ context.Context, _ int, fn func([]feed.Row) error) error {
	f.mu.Lock()
	var page []feed.Row
	for _, id := range slices.Sorted(maps.Keys(f.docs)) {
		page = append(page, feed.Row{ID: id, Rev: f.docs[id]})
	}
	// A document both deleted and removed (Sync Gateway's row for a
	// deletion seen by a reader of some channels) has one row.
	for _, id := range slices.Sorted(maps.Keys(f.deleted)) {
		_, removed := f.removed[id]
		page = append(page, feed.Row{ID: id, Rev: f.deleted[id], Deleted: true, Removed: removed})
	}
	for _, id := range slices.Sorted(maps.Keys(f.removed)) {
		if _, deleted := f.deleted[id]; !deleted {
			page = append(page, feed.Row{ID: id, Rev: f.removed[id], Removed: true})
		}
	}
	f.mu.Unlock()
	if err := fn(page); err != nil {
		return err
	}
	if f.onList != nil {
		f.onList(f)
	}
	return nil
}

func (f *fakeSource) Current(_ context.Context, ids []string) ([]feed.Row, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rows := make([]feed.Row, len(ids))
	for i, id := range ids {
		rows[i].ID = id
		_, removed := f.removed[id]
		switch rev, ok := f.docs[id]; {
		case ok:
			rows[i].Rev, rows[i].Doc = rev, json.RawMessage(fmt.Sprintf(`{"_id":%q,"_rev":%q}`, id, rev))
		case removed:
			rows[i].Removed = true
		default:
			rows[i].Deleted = true
		}
	}
	return rows, nil
}

func (f *fakeSource) Now(context.Context) (json.RawMessage, error) {
	return json.RawMessage(f.seq), nil
}

// fakeOutput is an output state held in a map; the content of the
// documents in tampered differs from the source's.
type fakeOutput struct {
	docs     map[string]Doc
	tampered map[string]bool
	// compared lists the documents whose content was compared.
	compared []string
}

func (o *fakeOutput) CompareContent(_ context.Context, docs []deliver.SourceDoc) (map[string]string, error) {
	out := map[string]string{}
	for _, d := range docs {
		o.compared = append(o.compared, d.ID)
		var body struct {
			ID string `json:"_id"`
		}
		if err := json.Unmarshal(d.Body, &body); err != nil || body.ID != d.ID {
			return nil, fmt.Errorf("source body of %s: %s", d.ID, d.Body)
		}
		if o.tampered[d.ID] {
			out[d.ID] = "tampered"
		}
	}
	return out, nil
}

func (o *fakeOutput) Scan(_ context.Context, fn func(Doc) error) error {
	for _, id := range slices.Sorted(maps.Keys(o.docs)) {
		d := o.docs[id]
		d.ID = id
		if err := fn(d); err != nil {
			return err
		}
	}
	return nil
}

func (o *fakeOutput) Lookup(_ context.Context, ids []string) (map[string]Doc, error) {
	out := map[string]Doc{}
	for _, id := range ids {
		if d, ok := o.docs[id]; ok {
			d.ID = id
			out[id] = d
		}
	}
	return out, nil
}

func held(rev string) Doc { return Doc{Rev: rev, Held: true} }

func TestCompare(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		source   map[string]string
		deleted  map[string]string
		removed  map[string]string
		output   map[string]Doc
		tampered []string
		opts     Options
		onList   func(*fakeSource)
		want     []Drift
		kept     int
		compared []string // documents whose content is compared
	}{
		{
			name:   "in sync",
			source: map[string]string{"a": "1-a", "b": "2-b"},
			output: map[string]Doc{"a": held("1-a"), "b": held("2-b"), "gone": {Rev: "3-x"}},
		},
		{
			name:   "missing, stale, unexpected",
			source: map[string]string{"a": "1-a", "b": "2-b", "c": "1-c"},
			output: map[string]Doc{"b": held("1-b"), "c": held("1-c"), "z": held("4-z")},
			want: []Drift{
				{Kind: Missing, DocID: "a", SourceRev: "1-a"},
				{Kind: Stale, DocID: "b", SourceRev: "2-b", OutputRev: "1-b"},
				{Kind: Unexpected, DocID: "z", OutputRev: "4-z"},
			},
		},
		{
			name:   "inconsistent output",
			source: map[string]string{"a": "1-a", "b": "1-b"},
			output: map[string]Doc{
				"a": {Rev: "1-a", Held: true, Problem: "versions table records rev \"0-x\""},
				"b": {Rev: "1-b", Problem: "data row is gone"},
			},
			want: []Drift{
				{Kind: Missing, DocID: "b", SourceRev: "1-b", OutputRev: "1-b", Problem: "data row is gone"},
				{Kind: Stale, DocID: "a", SourceRev: "1-a", OutputRev: "1-a", Problem: "versions table records rev \"0-x\""},
			},
		},
		{
			name:   "filtered by a mapping at the current revision",
			source: map[string]string{"a": "2-a", "b": "2-b"},
			output: map[string]Doc{"a": {Rev: "2-a", Filtered: true}, "b": {Rev: "1-b", Filtered: true}},
			want:   []Drift{{Kind: Missing, DocID: "b", SourceRev: "2-b", OutputRev: "1-b"}},
		},
		{
			name:     "content differs at the same revision",
			source:   map[string]string{"a": "1-a", "b": "2-b", "c": "1-c", "f": "3-f"},
			output:   map[string]Doc{"a": held("1-a"), "b": held("1-b"), "c": held("1-c"), "f": {Rev: "3-f", Filtered: true}},
			tampered: []string{"a", "b", "f"},
			opts:     Options{Content: true},
			// b is stale: its content is not compared.
			compared: []string{"a", "c", "f"},
			want: []Drift{
				{Kind: Stale, DocID: "b", SourceRev: "2-b", OutputRev: "1-b"},
				{Kind: Content, DocID: "a", SourceRev: "1-a", OutputRev: "1-a", Problem: "tampered"},
				{Kind: Content, DocID: "f", SourceRev: "3-f", OutputRev: "3-f", Problem: "tampered"},
			},
		},
		{
			name:     "content not compared",
			source:   map[string]string{"a": "1-a"},
			output:   map[string]Doc{"a": held("1-a")},
			tampered: []string{"a"},
		},
		{
			name:     "content drift rechecked",
			source:   map[string]string{"a": "1-a", "b": "1-b"},
			output:   map[string]Doc{"a": held("1-a"), "b": held("1-b")},
			tampered: []string{"a"},
			opts:     Options{Content: true, Recheck: true},
			compared: []string{"a", "b", "a"},
			want:     []Drift{{Kind: Content, DocID: "a", SourceRev: "1-a", OutputRev: "1-a", Problem: "tampered"}},
		},
		{
			name:    "deleted in the source, listed as such",
			source:  map[string]string{"a": "1-a"},
			deleted: map[string]string{"z": "2-z"},
			output:  map[string]Doc{"a": held("1-a"), "z": held("1-z")},
			want:    []Drift{{Kind: Unexpected, DocID: "z", OutputRev: "1-z"}},
		},
		{
			name:    "removed documents kept on purpose, deleted ones not",
			source:  map[string]string{"a": "1-a"},
			deleted: map[string]string{"z": "2-z"},
			removed: map[string]string{"r": "1-r"},
			output:  map[string]Doc{"a": held("1-a"), "r": held("1-r"), "z": held("1-z")},
			opts:    Options{KeepRemoved: true, Recheck: true},
			want:    []Drift{{Kind: Unexpected, DocID: "z", OutputRev: "1-z"}},
			kept:    1,
		},
		{
			name:    "deleted and removed rows kept as the poller keeps them",
			source:  map[string]string{"a": "1-a"},
			deleted: map[string]string{"d": "2-d", "dr": "2-dr"},
			removed: map[string]string{"r": "1-r", "dr": "2-dr"},
			output:  map[string]Doc{"a": held("1-a"), "d": held("1-d"), "dr": held("1-dr"), "r": held("1-r"), "absent": held("1-x")},
			opts:    Options{KeepDeleted: true, Recheck: true},
			// ignore_delete skips a row that is deleted, removed or not.
			want: []Drift{{Kind: Unexpected, DocID: "r", OutputRev: "1-r"}},
			kept: 3,
		},
		{
			name:   "deleted documents kept on purpose",
			source: map[string]string{"a": "1-a"},
			output: map[string]Doc{"a": held("1-a"), "z": held("2-z")},
			opts:   Options{KeepDeleted: true},
			kept:   1,
		},
		{
			name:   "recheck drops what caught up",
			source: map[string]string{"a": "2-a", "b": "2-b"},
			output: map[string]Doc{"a": held("1-a"), "b": held("1-b")},
			opts:   Options{Recheck: true},
			// After the listing, "a" is deleted and "b" moves on: the output
			// still holds both, so both still differ, the other way.
			onList: func(f *fakeSource) {
				delete(f.docs, "a")
				f.docs["b"] = "1-b"
			},
			want: []Drift{{Kind: Unexpected, DocID: "a", OutputRev: "1-a"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src := &fakeSource{docs: maps.Clone(tt.source), deleted: tt.deleted, removed: tt.removed, onList: tt.onList}
			out := &fakeOutput{docs: tt.output, tampered: map[string]bool{}}
			for _, id := range tt.tampered {
				out.tampered[id] = true
			}
			rep, err := Compare(t.Context(), src, out, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.compared, out.compared); diff != "" {
				t.Errorf("content compared (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.want, rep.Drift); diff != "" {
				t.Errorf("drift (-want +got):\n%s", diff)
			}
			if rep.Clean() != (len(tt.want) == 0) || rep.Kept != tt.kept {
				t.Errorf("Clean() = %t, Kept = %d", rep.Clean(), rep.Kept)
			}
			for _, k := range Kinds {
				n := 0
				for _, d := range tt.want {
					if d.Kind == k {
						n++
					}
				}
				if rep.Counts[k] != n {
					t.Errorf("Counts[%s] = %d, want %d", k, rep.Counts[k], n)
				}
			}
		})
	}
}

// fakeLeases is a lease store in memory.
type fakeLeases struct {
	mu       sync.Mutex
	st       lease.State
	releases int
	// heldFor keeps the lease held by "poller" for this many Gets.
	heldFor int
}

func (f *fakeLeases) Get(context.Context, string) (*lease.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.heldFor > 0 {
		f.heldFor--
		if f.heldFor == 0 {
			f.st.Released = true
		}
	}
	st := f.st
	return &st, nil
}

func (f *fakeLeases) Acquire(_ context.Context, job, owner, _ string, ttl time.Duration) (*lease.Lease, *lease.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.st.Held(time.Now()) {
		st := f.st
		return nil, &st, lease.ErrLeaseHeld
	}
	return f.take(job, owner, ttl, lease.Handoff), nil, nil
}

func (f *fakeLeases) ForceTake(_ context.Context, job, owner, _ string, ttl time.Duration) (*lease.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.take(job, owner, ttl, lease.Forced), nil
}

func (f *fakeLeases) take(job, owner string, ttl time.Duration, kind lease.Takeover) *lease.Lease {
	prev := f.st
	f.st.Owner, f.st.Generation, f.st.Released, f.st.ExpiresAt = owner, f.st.Generation+1, false, time.Now().Add(ttl)
	return &lease.Lease{JobID: job, Owner: owner, Generation: f.st.Generation, Kind: kind, RenewedAt: time.Now(), TTL: ttl, Previous: prev}
}

func (f *fakeLeases) Renew(context.Context, *lease.Lease, int64) error { return nil }

func (f *fakeLeases) Release(context.Context, *lease.Lease) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.Released = true
	f.releases++
	return nil
}

type fakeSender struct{ sent []*change.Envelope }

func (s *fakeSender) Send(_ context.Context, targets []fanout.Target, changes []*change.Envelope, fence fanout.Fence) (fanout.Stats, error) {
	if err := fence(); err != nil {
		return fanout.Stats{}, err
	}
	for _, c := range changes {
		e := *c
		e.Output = targets[0].Output
		s.sent = append(s.sent, &e)
	}
	return fanout.Stats{Messages: len(changes)}, nil
}

func TestRepair(t *testing.T) {
	t.Parallel()
	job := &config.Job{ID: "orders", Lease: config.Lease{TTL: config.Duration(10 * time.Second)}}
	tests := []struct {
		name        string
		leases      *fakeLeases
		force, keep bool
		wait        time.Duration
		wantErr     error
		wantGen     int64
		wantKind    lease.Takeover
		wantSent    []string // "id rev deleted"
	}{
		{
			name:     "free lease",
			leases:   &fakeLeases{st: lease.State{Exists: true, Owner: "poller-1", Generation: 7, Released: true}},
			wantGen:  8,
			wantKind: lease.Handoff,
			wantSent: []string{"a 2-a false", "b 1-b false", "gone  true"},
		},
		{
			name: "waits for the poller's handoff",
			leases: &fakeLeases{st: lease.State{Exists: true, Owner: "poller-1", Generation: 7, ExpiresAt: time.Now().Add(time.Hour)},
				heldFor: 3},
			wantGen:  8,
			wantKind: lease.Handoff,
			wantSent: []string{"a 2-a false", "b 1-b false", "gone  true"},
		},
		{
			name:    "gives up when the poller keeps the lease",
			leases:  &fakeLeases{st: lease.State{Exists: true, Owner: "poller-1", Generation: 7, ExpiresAt: time.Now().Add(time.Hour)}},
			wait:    300 * time.Millisecond,
			wantErr: ErrLeaseBusy,
		},
		{
			name:     "force",
			leases:   &fakeLeases{st: lease.State{Exists: true, Owner: "poller-1", Generation: 7, ExpiresAt: time.Now().Add(time.Hour)}},
			force:    true,
			wantGen:  8,
			wantKind: lease.Forced,
			wantSent: []string{"a 2-a false", "b 1-b false", "gone  true"},
		},
		{
			name:     "keeps deleted documents",
			leases:   &fakeLeases{st: lease.State{Exists: true, Generation: 1, Released: true, Owner: "x"}},
			keep:     true,
			wantGen:  2,
			wantKind: lease.Handoff,
			wantSent: []string{"a 2-a false", "b 1-b false"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src := &fakeSource{docs: map[string]string{"a": "2-a", "b": "1-b"}, seq: `"42-xyz"`}
			snd := &fakeSender{}
			r := &Repairer{Source: src, Leases: tt.leases, Sender: snd, Job: job, Target: fanout.Target{Output: "pg"},
				Owner: "verify", Wait: tt.wait, Force: tt.force, KeepDeleted: tt.keep}
			res, err := r.Repair(t.Context(), []string{"b", "gone", "a", "b"})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Repair error = %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr != nil {
				if len(snd.sent) > 0 {
					t.Errorf("sent %d changes without the lease", len(snd.sent))
				}
				return
			}
			if res.Generation != tt.wantGen || res.Takeover != tt.wantKind || string(res.Seq) != `"42-xyz"` {
				t.Errorf("result %+v", res)
			}
			var got []string
			for i, e := range snd.sent {
				got = append(got, fmt.Sprintf("%s %s %t", e.DocID, e.Rev, e.Deleted))
				want := change.Version{Generation: tt.wantGen, Counter: int64(i + 1)}
				if e.Version != want || e.Job != "orders" || e.Output != "pg" || string(e.Seq) != `"42-xyz"` {
					t.Errorf("change %d: version %s job %s output %s seq %s, want version %s", i, e.Version, e.Job, e.Output, e.Seq, want)
				}
				if err := e.Check(); err != nil {
					t.Errorf("change %d: %v", i, err)
				}
			}
			if diff := cmp.Diff(tt.wantSent, got); diff != "" {
				t.Errorf("sent (-want +got):\n%s", diff)
			}
			if tt.leases.releases != 1 {
				t.Errorf("lease released %d times, want 1", tt.leases.releases)
			}
		})
	}
}
