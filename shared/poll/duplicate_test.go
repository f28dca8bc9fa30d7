package poll_test

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestDuplicateEventEnds: an asynchronous event may be delivered twice with
// its request id, the invocation's owner id (AWS documents that an event can
// arrive more than once; LocalStack invokes again an event whose invocation
// outlasts its client's 60 s read timeout). An invocation that finds its own
// owner id on the job item as it starts, holding the lease or marked as a
// standby within the last marking interval, ends at once instead of standing
// by for its whole budget, without marking the item; a mark of its id older
// than that is a finished attempt's, and it stands by as usual.
func TestDuplicateEventEnds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		setup    func(r *rig)
		wantRole string
	}{
		{
			name:     "the holder runs under the same owner id",
			setup:    func(r *rig) { r.leases.holdBy("me") },
			wantRole: "duplicate",
		},
		{
			name: "a standby runs under the same owner id",
			setup: func(r *rig) {
				r.leases.holdBy("other")
				_ = r.leases.MarkStandby(context.Background(), "orders", "me")
				r.leases.marks = 0
				r.w.Advance(2 * time.Second)
			},
			wantRole: "duplicate",
		},
		{
			name: "a mark of the same owner id from an attempt long gone",
			setup: func(r *rig) {
				_ = r.leases.MarkStandby(context.Background(), "orders", "me")
				r.w.Advance(ttl)
				r.leases.holdBy("other")
				r.leases.marks = 0
			},
			wantRole: "standby",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(nil)
			r.leases.perRead = 500 * time.Millisecond
			tt.setup(r)
			start := r.w.Now()
			res, err := r.run(t, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			took := r.w.Now().Sub(start)
			if res.Role != tt.wantRole {
				t.Fatalf("role %q after %s, want %q; logs:\n%s", res.Role, took, tt.wantRole, r.logs)
			}
			if tt.wantRole != "duplicate" {
				return
			}
			if took > time.Second || r.leases.marks > 0 {
				t.Errorf("the duplicate ran %s and marked the job item %d times, want it to end at once, unmarked", took, r.leases.marks)
			}
			if !strings.Contains(r.logs.String(), "another invocation runs for this event") {
				t.Errorf("logs:\n%s", r.logs)
			}
		})
	}
}

// TestStandbyMarks: a standby marks the job item (changesctl status shows
// it) once it has watched the item for the mark delay, a TTL at most 10 s,
// and then every third of a TTL, so that before its first mark it can tell
// another invocation's mark of its owner id from its own.
func TestStandbyMarks(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.leases.holdBy("other")
	r.leases.perRead, r.leases.renewing = 500*time.Millisecond, true
	var marks []time.Duration
	start := r.w.Now()
	r.poller.Leases = markTimes{r.leases, func() { marks = append(marks, r.w.Now().Sub(start)) }}
	res, err := r.run(t, 20*time.Second)
	if err != nil || res.Role != "standby" {
		t.Fatalf("result %+v, %v; want a standby for the whole budget", res, err)
	}
	if len(marks) < 2 || marks[0] < ttl || marks[1]-marks[0] < ttl/3 {
		t.Errorf("marks at %v of the standby's watch, want the first at %s or later and then every %s", marks, ttl, ttl/3)
	}
}

// markTimes calls marked on every standby mark.
type markTimes struct {
	*fakeLeases
	marked func()
}

func (m markTimes) MarkStandby(ctx context.Context, job, owner string) error {
	m.marked()
	return m.fakeLeases.MarkStandby(ctx, job, owner)
}
