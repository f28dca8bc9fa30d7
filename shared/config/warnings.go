package config

import (
	"fmt"
	"time"
)

// Warning is what a deploy of a valid file takes but its operator should
// act on: a setting that works against another, or a step the stack cannot
// take for them. changesctl validate prints it and synth shows it.
type Warning struct {
	// Key is the key it is about, as problems name theirs.
	Key  string
	Text string
}

// String is the warning as a problem reads: "key: text".
func (w Warning) String() string { return w.Key + ": " + w.Text }

// StandbyMargin is how long a poller invocation must run on after the next
// schedule tick for the invocation that tick starts to stand by beside it:
// time for that one to start, a cold start included, and wait for the
// lease.
const StandbyMargin = 15 * time.Second

// Standby reports whether, with a poller timeout of pollerTimeout and a
// schedule of schedule, each tick's invocation finds the one before it
// still running, and so stands by to take over the moment it releases the
// lease or fails.
func Standby(schedule, pollerTimeout time.Duration) bool {
	return pollerTimeout >= schedule+StandbyMargin
}

// warnings are the file's warnings: the stack's, then each job's.
// bucketGiven says whether the file names stack.bucket (defaults fill it
// in).
func (f *File) warnings(bucketGiven bool) []Warning {
	var ws []Warning
	if bucketGiven {
		// S3 replaces a bucket's lifecycle configuration as a whole, so
		// the stack never changes that of a bucket it does not own.
		ws = append(ws, Warning{"stack.bucket", fmt.Sprintf("%s is an existing bucket, whose lifecycle configuration the stack leaves as it is: "+
			"add a rule that expires the objects under %s (docs/deploy.md shows it) and check it with `changesctl bucket check --config FILE`; "+
			"without it, claim checks are never deleted", f.Stack.Bucket, ClaimCheckPrefix)})
	}
	for i, j := range f.Jobs {
		if t := f.Stack.PollerTimeout.D(); !Standby(j.Schedule.D(), t) {
			ws = append(ws, Warning{item("jobs", i, j.ID) + ".schedule", fmt.Sprintf(
				"stack.poller_timeout (%s) does not outlast the schedule (%s) by %s: no invocation stands by to take over, "+
					"so a busy feed waits for the next tick after each invocation and a crashed poller is replaced only then; "+
					"make stack.poller_timeout at least %s, or the schedule shorter",
				t, j.Schedule.D(), formatDuration(StandbyMargin), j.Schedule.D()+StandbyMargin)})
		}
	}
	return ws
}
