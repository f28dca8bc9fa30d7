package poll_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/poll"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

// slowLeases answers the checkpoint, the release and the largest-batch note
// after delay of real time, as DynamoDB may on an overloaded host, or as
// their context ends, with its error, as the DynamoDB client does.
type slowLeases struct {
	*notingLeases
	delay time.Duration
}

func (s *slowLeases) wait(ctx context.Context) error {
	select {
	case <-time.After(s.delay):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *slowLeases) Checkpoint(ctx context.Context, l *lease.Lease, seq json.RawMessage, left int64) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return s.fakeLeases.Checkpoint(ctx, l, seq, left)
}

func (s *slowLeases) Release(ctx context.Context, l *lease.Lease) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return s.fakeLeases.Release(ctx, l)
}

func (s *slowLeases) NoteLargestBatch(ctx context.Context, job string, v int64) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return s.notingLeases.NoteLargestBatch(ctx, job, v)
}

// The writes an invocation makes as it ends (its last checkpoint, the
// release, the note of its batch) outlive a cancelled context for a while,
// but never its deadline: a function still writing at its timeout is
// killed and counted as an error, and an asynchronous event is retried. So
// with a store that takes 2 s a write, an invocation whose context ends 3 s
// after it starts returns before then.
func TestRunEndsBeforeItsDeadlineWhenTheStoreIsSlow(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.feed.batch = thenIdle(r, batchOf(1, 300))
	r.poller.Leases = &slowLeases{notingLeases: &notingLeases{fakeLeases: r.leases}, delay: 2 * time.Second}
	const deadline = 3 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	start := time.Now()
	res, _ := r.poller.Run(ctx, poll.Invocation{Owner: "me", Host: "host", Deadline: r.w.Now().Add(deadline)})
	if took := time.Since(start); took >= deadline {
		t.Errorf("Run returned %s after it started, its context's deadline %s: past the function's timeout (events %v)",
			took.Round(time.Millisecond), deadline, r.w.log())
	}
	if res.Role != "active" {
		t.Errorf("role %q, want active", res.Role)
	}
}

// A standby whose last look, made within its budget, comes back after the
// budget's end with the lease free leaves the lease to the next
// invocation: taking it then would leave the new holder no time to read,
// and its release and checkpoint would run into the deadline.
func TestStandbyDoesNotTakeTheLeasePastItsBudget(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.feed.batch = thenIdle(r, batchOf(1, 3))
	r.leases.holdBy("other")
	r.leases.renewing = true
	// The first look returns 10 s later, with the lease released: past
	// the budget of a 10 s deadline (9 s).
	r.leases.perRead = 10 * time.Second
	r.leases.freeAfterReads = 1
	res, err := r.run(t, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.Role != "standby" {
		t.Errorf("role %q after a look that ended past the budget, want standby (events %v)", res.Role, r.w.log())
	}
	if got := matching(r.w.log(), "acquire"); len(got) != 0 {
		t.Errorf("the standby took the lease past its budget: %v", got)
	}
}

// slowSender takes delay of real time over every Send, or returns its
// context's error when that ends first, as the SQS client does.
type slowSender struct {
	*fakeSender
	delay time.Duration
}

func (s *slowSender) Send(ctx context.Context, targets []fanout.Target, changes []*change.Envelope, fence fanout.Fence) (fanout.Stats, error) {
	select {
	case <-time.After(s.delay):
		return s.fakeSender.Send(ctx, targets, changes, fence)
	case <-ctx.Done():
		return fanout.Stats{}, ctx.Err()
	}
}

// A send that outlasts the whole invocation (SQS, or the host, slowed far
// past anything seen before in the invocation) is cut short before the
// deadline, leaving the last writes their time: the invocation returns
// before its function's timeout, without an error (a scheduled event would
// be delivered again), releases its lease, and its checkpoint does not
// pass the changes that were not queued.
func TestRunCutsAWorkStepShortBeforeItsDeadline(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.feed.batch = thenIdle(r, batchOf(1, 300))
	r.poller.Sender = &slowSender{fakeSender: r.sender, delay: 10 * time.Second}
	const deadline = 4 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	start := time.Now()
	res, err := r.poller.Run(ctx, poll.Invocation{Owner: "me", Host: "host", Deadline: r.w.Now().Add(deadline)})
	took := time.Since(start)
	if took >= deadline-lease.TailReserve {
		t.Errorf("Run returned %s after it started, its context's deadline %s: within the reserve of the function's timeout (events %v)",
			took.Round(time.Millisecond), deadline, r.w.log())
	}
	if err != nil {
		t.Errorf("Run: %v, want no error for a step cut short at the deadline", err)
	}
	if res.Role != "active" || res.Checkpoint != nil {
		t.Errorf("role %q, checkpoint %s; want active and no checkpoint (nothing was queued)", res.Role, res.Checkpoint)
	}
	if !strings.Contains(r.logs.String(), "work cut short before the deadline") {
		t.Errorf("no warning that the work was cut short:\n%s", r.logs)
	}
	if st := r.leases.state(); !st.Released || st.Checkpoint != nil {
		t.Errorf("lease released %v, checkpoint %s; want released with no checkpoint", st.Released, st.Checkpoint)
	}
}
