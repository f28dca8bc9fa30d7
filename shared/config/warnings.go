package config

import "fmt"

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
		gap := f.StandbyGap(j)
		if gap == 0 {
			continue
		}
		s := j.Schedule.D()
		fix := fmt.Sprintf("a standby at every moment needs a poller timeout of twice the schedule plus %s (%s), which stack.poller_timeout left unset gives",
			formatDuration(PollerStandbyAllowance), 2*s+PollerStandbyAllowance)
		if longest := (MaxPollerTimeout - PollerStandbyAllowance) / 2; s > longest {
			fix = fmt.Sprintf("a standby at every moment needs a schedule of at most %s, since Lambda allows no timeout over %s",
				longest, formatDuration(MaxPollerTimeout))
		}
		ws = append(ws, Warning{item("jobs", i, j.ID) + ".schedule", fmt.Sprintf(
			"with a poller timeout of %s and a schedule of %s, up to %s of every period has no invocation standing by, "+
				"and a poller that crashes then is replaced only at the next tick; %s",
			f.PollerTimeout(j), s, gap, fix)})
	}
	return ws
}
