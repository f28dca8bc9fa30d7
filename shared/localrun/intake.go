package localrun

import (
	"context"
	"sync"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/writer"
)

// DefaultProbeEvery is how often the local runtime's writer probes the
// outputs whose intake it paused, when Options.ProbeEvery is zero.
const DefaultProbeEvery = 10 * time.Second

// pauses is the writer's intake under the local runtime, what the event
// source mappings are on Lambda: the receivers of a work queue receive only
// while its intake is not paused. A batch already received when it pauses
// is still handed to the writer, which holds it. Safe for concurrent use;
// the zero value has every intake running.
type pauses struct {
	mu      sync.Mutex
	outputs map[string]bool // "job/output" -> paused
}

var _ writer.Intake = (*pauses)(nil)

// Pause stops the receivers of r's work queue.
func (p *pauses) Pause(ctx context.Context, r config.Route) error {
	p.set(r.Job.ID+"/"+r.Output.ID, true)
	return nil
}

// Resume starts the receivers of r's work queue again.
func (p *pauses) Resume(ctx context.Context, r config.Route) error {
	p.set(r.Job.ID+"/"+r.Output.ID, false)
	return nil
}

func (p *pauses) set(output string, paused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.outputs == nil {
		p.outputs = map[string]bool{}
	}
	p.outputs[output] = paused
}

// paused reports whether the intake of job's output is paused.
func (p *pauses) paused(job, output string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.outputs[job+"/"+output]
}

// probe runs the writer's probe of every job every Options.ProbeEvery, as
// the probe schedule does on Lambda, each with the writer's deadline.
func (r *Runtime) probe(ctx context.Context, h *writer.Handler, jobs []*config.Job) {
	every := r.Opts.ProbeEvery
	if every == 0 {
		every = DefaultProbeEvery
	}
	timeout := r.Opts.WriterTimeout
	if timeout == 0 {
		timeout = r.Deps.Config.Stack.WriterTimeout.D()
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, j := range jobs {
			pctx, cancel := context.WithTimeout(ctx, timeout)
			if err := h.Probe(pctx, j.ID); err != nil {
				r.Log.Error("writer probe failed", "job", j.ID, "error", err)
			}
			cancel()
		}
	}
}
