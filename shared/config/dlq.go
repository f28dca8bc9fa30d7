package config

import (
	"fmt"
	"time"
)

// Bounds and defaults of stack.dlq.
const (
	// MinDLQRetention and MaxDLQRetention are SQS's bounds on a queue's
	// message retention period.
	MinDLQRetention = time.Minute
	MaxDLQRetention = 14 * 24 * time.Hour
	// DefaultDLQAlarmAfter is how long a failed change waits, in a DLQ or
	// its archive, before its alarm fires.
	DefaultDLQAlarmAfter = 24 * time.Hour
	// DefaultArchiveMargin is how long before SQS would drop it a DLQ
	// message is archived, unless the retention is shorter than twice that.
	DefaultArchiveMargin = 48 * time.Hour
	// MinArchiveMargin is the least time archive_after may leave before the
	// retention ends: four sweeps of MinSweepEvery.
	MinArchiveMargin = 4 * MinSweepEvery
	// MinSweepEvery and MaxSweepEvery bound how often a running poller
	// invocation archives its job's DLQs (DLQ.SweepEvery).
	MinSweepEvery = 5 * time.Second
	MaxSweepEvery = 15 * time.Minute
	// ArchivePrefix starts the key of every archived DLQ message in the
	// stack bucket (package dlq names the rest).
	ArchivePrefix = "dlq-archive/"
)

// SweepEvery is how often a running poller invocation archives the DLQs of
// its job, when no other invocation of the job did meanwhile: a quarter of
// the time archive_after leaves before SQS drops a message, between
// MinSweepEvery and MaxSweepEvery.
func (d DLQ) SweepEvery() time.Duration {
	return min(max((d.Retention.D()-d.ArchiveAfter.D())/4, MinSweepEvery), MaxSweepEvery)
}

// SweepGap is the longest time job j's DLQs may go unswept: a poller
// invocation sweeps when it starts and every SweepEvery while it runs, so
// where invocations follow each other without a gap that is SweepEvery;
// otherwise a sweep may have to wait for the next tick.
func (f *File) SweepGap(j *Job) time.Duration {
	if f.alwaysInvoked(j) {
		return f.Stack.DLQ.SweepEvery()
	}
	return j.Schedule.D() + f.Stack.DLQ.SweepEvery()
}

// alwaysInvoked reports whether an invocation of job j's poller runs at
// every moment: with idle watch each one reads until its deadline, and a
// poller_timeout at least 15 s longer than the schedule has the next one
// start before it ends.
func (f *File) alwaysInvoked(j *Job) bool {
	return j.Idle == IdleWatch && f.Stack.PollerTimeout.D() >= j.Schedule.D()+15*time.Second
}

// setDLQDefaults fills stack.dlq; the jobs' settings must have their
// defaults already.
func (f *File) setDLQDefaults() {
	d := &f.Stack.DLQ
	if d.Retention == 0 {
		d.Retention = Duration(MaxDLQRetention)
	}
	if d.AlarmAfter == 0 {
		d.AlarmAfter = Duration(DefaultDLQAlarmAfter)
	}
	if d.ArchiveAfter != 0 || d.Retention == zeroGiven {
		return
	}
	r := d.Retention.D()
	margin := min(DefaultArchiveMargin, r/2)
	for _, j := range f.Jobs {
		if j == nil {
			continue
		}
		if !f.alwaysInvoked(j) {
			// A sweep may wait for the next tick.
			margin = max(margin, 2*(j.Schedule.D()+MaxSweepEvery))
		}
	}
	d.ArchiveAfter = Duration(max(r-margin, time.Second))
}

// validateDLQ reports the problems of stack.dlq; the jobs' schedules must be
// valid for the last check to mean anything.
func (f *File) validateDLQ() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("stack.dlq.%s: %s", field, fmt.Sprintf(format, args...)))
	}
	d := f.Stack.DLQ
	r := d.Retention
	retentionOK := false
	switch {
	case r == zeroGiven:
		bad("retention", zeroRefused, MaxDLQRetention)
	case r.D() < MinDLQRetention || r.D() > MaxDLQRetention || r.D()%time.Second != 0:
		bad("retention", "%s must be whole seconds from %s to %s (14 days): SQS's bounds", r.D(), MinDLQRetention, MaxDLQRetention)
	default:
		retentionOK = true
	}
	if a := d.AlarmAfter; a == zeroGiven {
		bad("alarm_after", zeroRefused, DefaultDLQAlarmAfter)
	} else if a.D() < time.Minute {
		bad("alarm_after", "%s must be at least 1m", a.D())
	}
	a := d.ArchiveAfter
	switch {
	case a == zeroGiven:
		bad("archive_after", "0 is not allowed: leave the key out for the default (retention less two days, or less half of it)")
		return errs
	case a.D() < time.Second:
		bad("archive_after", "%s must be at least 1s", a.D())
		return errs
	case !retentionOK:
		return errs
	case r.D()-a.D() < MinArchiveMargin:
		bad("archive_after", "%s must be at least %s shorter than retention (%s), so that a message is archived before SQS drops it", a.D(), MinArchiveMargin, r.D())
		return errs
	}
	for i, j := range f.Jobs {
		if j == nil {
			continue
		}
		if gap := f.SweepGap(j); 2*gap > r.D()-a.D() {
			bad("archive_after", "%s leaves %s before SQS drops a DLQ message, less than twice the %s %s may go between two archive sweeps "+
				"(its poller sweeps at each schedule tick, %s, and every %s while it runs): lower archive_after, raise retention, "+
				"or let the job's invocations overlap (idle watch, stack.poller_timeout at least 15s longer than its schedule)",
				a.D(), r.D()-a.D(), gap, item("jobs", i, j.ID), j.Schedule.D(), d.SweepEvery())
		}
	}
	return errs
}
