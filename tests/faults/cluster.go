package faults

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/changes-worker/changes-worker/shared/clock"
)

// Cluster is a set of poller processes of one stack, each in a slot that can
// be restarted with the same options after a fault. Safe for concurrent use.
type Cluster struct {
	stack *Stack
	bin   string

	mu    sync.Mutex
	slots []*Proc
	all   []*Proc
}

// NewCluster returns an empty cluster running the changesctl binary bin.
func (s *Stack) NewCluster(bin string) *Cluster { return &Cluster{stack: s, bin: bin} }

// Add starts a process in a new slot.
func (c *Cluster) Add(o ProcOptions) (*Proc, error) {
	p, err := c.stack.Start(c.bin, o)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slots = append(c.slots, p)
	c.all = append(c.all, p)
	return p, nil
}

// Restart kills the process of p's slot if it still runs and starts a new
// one with the same options (opts, when given, replaces them).
func (c *Cluster) Restart(p *Proc, opts ...ProcOptions) (*Proc, error) {
	c.mu.Lock()
	slot := -1
	for i, q := range c.slots {
		if q == p {
			slot = i
		}
	}
	c.mu.Unlock()
	if slot < 0 {
		return nil, fmt.Errorf("restart %s: not a current process of the cluster", p.Name)
	}
	if err := p.Kill(); err != nil {
		return nil, err
	}
	o := p.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	q, err := c.stack.Start(c.bin, o)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slots[slot] = q
	c.all = append(c.all, q)
	return q, nil
}

// Current returns the current process of every slot.
func (c *Cluster) Current() []*Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Proc(nil), c.slots...)
}

// All returns every process the cluster ever started.
func (c *Cluster) All() []*Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Proc(nil), c.all...)
}

// ByOwner returns the process whose pid a lease owner id carries.
func (c *Cluster) ByOwner(owner string) *Proc {
	pid := OwnerPID(owner)
	if pid == 0 {
		return nil
	}
	for _, p := range c.All() {
		if p.PID() == pid {
			return p
		}
	}
	return nil
}

// Events returns the lease events of every process, ordered by time.
func (c *Cluster) Events() []Event {
	var out []Event
	for _, p := range c.All() {
		out = append(out, p.Events()...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out
}

// Acquisitions returns the "lease acquired" events by generation.
func (c *Cluster) Acquisitions() map[int64]Event {
	out := map[int64]Event{}
	for _, ev := range c.Events() {
		if ev.Msg == "lease acquired" {
			out[ev.Generation] = ev
		}
	}
	return out
}

// InvocationStart is when the invocation with lease owner id owner began,
// by its first logged event ("standing by" or "lease acquired"); zero if it
// logged none.
func (c *Cluster) InvocationStart(owner string) time.Time {
	p := c.ByOwner(owner)
	if p == nil {
		return time.Time{}
	}
	for _, ev := range p.Events() {
		if ev.Owner == owner {
			return ev.Time
		}
	}
	return time.Time{}
}

// Terminate stops every running process gracefully (SIGTERM, so active
// invocations release the lease), killing those that do not stop in time.
func (c *Cluster) Terminate(timeout time.Duration) error {
	var wg sync.WaitGroup
	errs := make([]error, len(c.Current()))
	for i, p := range c.Current() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.Terminate(timeout)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Kill kills every running process.
func (c *Cluster) Kill() {
	for _, p := range c.All() {
		_ = p.Kill()
	}
}

// Tails returns the last n lines of every process's output, for reports.
func (c *Cluster) Tails(n int) string {
	var b strings.Builder
	for _, p := range c.All() {
		fmt.Fprintf(&b, "--- poller %s (pid %d, started %s, exited %v)\n%s\n", p.Name, p.PID(), p.Started.Format("15:04:05.000"), p.Exited(), p.Tail(n))
	}
	return b.String()
}

// WaitSending waits until a live process of the cluster holds the lease and
// is queueing: two samples of its generation, taken after index from, with
// different checkpoints, both written by it. It returns the later sample and
// the holder.
func (c *Cluster) WaitSending(ctx context.Context, w *Watcher, from int, timeout time.Duration, accept func(*Proc, Sample) bool) (Sample, *Proc, error) {
	var prev Sample
	var holder *Proc
	s, err := w.WaitFor(ctx, from, timeout, func(s Sample) bool {
		defer func() { prev = s }()
		if s.State.Released || !s.CheckpointedByHolder() {
			return false
		}
		p := c.ByOwner(s.State.Owner)
		if p == nil || p.Exited() || (accept != nil && !accept(p, s)) {
			return false
		}
		if prev.State.Generation != s.State.Generation || prev.State.Owner != s.State.Owner || prev.Seq == s.Seq || !prev.CheckpointedByHolder() {
			return false
		}
		holder = p
		return true
	})
	if err != nil {
		return Sample{}, nil, fmt.Errorf("wait for an active poller that is queueing: %w", err)
	}
	return s, holder, nil
}

// Failover is the record of one kill -9 of the active poller.
type Failover struct {
	Victim     string // process name
	VictimPID  int
	VictimGen  int64
	VictimSeq  int64 // the checkpoint seen just before the kill
	KilledAt   time.Time
	Released   bool // the victim had released its lease just before the kill: no failover
	Successor  string
	Owner      string // the successor's lease owner id
	Generation int64  // the first generation after VictimGen taken by a live process
	Takeover   string // how it was taken: "failover" is expected
	AcquiredAt time.Time
	// FirstCheckpoint is when the successor first checkpointed (its own
	// clock), as sampled; zero if no sample showed it.
	FirstCheckpoint time.Time
}

// KillOptions shape KillActive.
type KillOptions struct {
	// Delay is waited between seeing the active queue and killing it.
	Delay time.Duration
	// Timeout bounds each wait (for an active, for its successor).
	Timeout time.Duration
	// Accept, when set, restricts the victim.
	Accept func(*Proc, Sample) bool
}

// KillActive waits until a live process holds the lease and is queueing,
// kills it with SIGKILL, restarts its slot at once (so a standby always
// exists), and waits until another process took the lease and wrote a
// checkpoint.
func (c *Cluster) KillActive(ctx context.Context, w *Watcher, o KillOptions) (Failover, error) {
	s, victim, err := c.WaitSending(ctx, w, w.Len(), o.Timeout, o.Accept)
	if err != nil {
		return Failover{}, err
	}
	if o.Delay > 0 {
		if err := clock.Sleep(ctx, o.Delay); err != nil {
			return Failover{}, err
		}
	}
	f := Failover{Victim: victim.Name, VictimPID: victim.PID(), VictimGen: s.State.Generation, VictimSeq: s.Seq}
	mark := w.Len()
	f.KilledAt = time.Now()
	if err := victim.Kill(); err != nil {
		return f, err
	}
	if _, err := c.Restart(victim); err != nil {
		return f, err
	}
	for _, ev := range victim.Events() {
		if ev.Msg == "lease released" && ev.Generation == f.VictimGen {
			f.Released = true
		}
	}
	next, err := w.WaitFor(ctx, mark, o.Timeout, func(s Sample) bool {
		return s.State.Generation > f.VictimGen && OwnerPID(s.State.Owner) != f.VictimPID && s.CheckpointedByHolder()
	})
	if err != nil {
		return f, fmt.Errorf("wait for a successor of generation %d (killed %s, pid %d): %w", f.VictimGen, f.Victim, f.VictimPID, err)
	}
	// The first generation after the victim's taken by another process.
	// Wait for its log line (the pipe may lag the item a little).
	p := c.ByOwner(next.State.Owner)
	if p == nil {
		return f, fmt.Errorf("owner %s of generation %d is not a process of the cluster", next.State.Owner, next.State.Generation)
	}
	if _, err := p.WaitEvent(ctx, 10*time.Second, func(ev Event) bool {
		return ev.Msg == "lease acquired" && ev.Generation == next.State.Generation
	}); err != nil {
		return f, err
	}
	acq := c.Acquisitions()
	for g := f.VictimGen + 1; g <= next.State.Generation; g++ {
		ev, ok := acq[g]
		if !ok || ev.PID == f.VictimPID {
			continue
		}
		f.Successor, f.Owner, f.Generation, f.Takeover, f.AcquiredAt = ev.Proc, ev.Owner, g, ev.Takeover, ev.Time
		break
	}
	if first, ok := w.FirstCheckpoint(f.Generation); ok {
		f.FirstCheckpoint = first.State.CheckpointAt
	}
	return f, nil
}
