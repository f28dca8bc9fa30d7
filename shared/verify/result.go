package verify

import (
	"encoding/json"
	"fmt"
)

// Result is what one run of verify tells its operator: the comparison's
// figures and counts, up to a number of sample documents per kind of drift,
// and the repair when one ran. It is what `changesctl verify --json` prints
// and what the verify function answers, so its size follows the samples
// asked for, not the number of documents that differ.
type Result struct {
	Job     string           `json:"job"`
	Output  string           `json:"output"`
	Report  *Report          `json:"report"`
	Samples map[Kind][]Drift `json:"samples"`
	// Busy says why the pipeline may still have been delivering when the
	// comparison ran (messages queued, changes pending), "" when idle.
	Busy   string        `json:"busy,omitempty"`
	Repair *RepairResult `json:"repair,omitempty"`
	// RepairError is why the repair failed; Repair then says what it had
	// enqueued.
	RepairError string `json:"repair_error,omitempty"`
}

// NewResult returns the result of rep with up to n samples of each kind.
func NewResult(job, output string, rep *Report, n int) *Result {
	r := &Result{Job: job, Output: output, Report: rep, Samples: map[Kind][]Drift{}}
	for _, k := range Kinds {
		if s := rep.Samples(k, n); len(s) > 0 {
			r.Samples[k] = s
		}
	}
	return r
}

// Fit keeps the result's JSON encoding within limit bytes by showing fewer
// samples, halving their number per kind until it fits: the counts stay
// whole. It fails when even no samples do not fit.
func (r *Result) Fit(limit int) error {
	for {
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("encode verify result: %w", err)
		}
		if len(b) <= limit {
			return nil
		}
		most := 0
		for _, s := range r.Samples {
			most = max(most, len(s))
		}
		if most == 0 {
			return fmt.Errorf("encode verify result: %d bytes without samples, more than %d", len(b), limit)
		}
		for k, s := range r.Samples {
			if len(s) > most/2 {
				r.Samples[k] = s[:most/2]
			}
			if len(r.Samples[k]) == 0 {
				delete(r.Samples, k)
			}
		}
	}
}
