package deliver

import (
	"context"
	"fmt"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/changes-worker/changes-worker/shared/change"
)

// EachDocument applies changes one at a time with apply, for sinks that write
// one document per request. Different documents run in parallel, at most
// parallelism at once; changes of one document run one after another, oldest
// version first. check validates a change before anything is sent; its error
// (or apply's) is that change's result, and one change's failure stops no
// other. A change that has not started when ctx ends fails transient.
//
// When ctx carries a Pacer (WithPacer), the pacer may lower parallelism and
// is told how long each apply took.
func EachDocument(ctx context.Context, changes []*change.Envelope, parallelism int,
	check func(*change.Envelope) error, apply func(context.Context, *change.Envelope) error) []error {
	pacer := pacerFrom(ctx)
	if pacer != nil {
		parallelism = max(1, min(parallelism, pacer.Limit(parallelism)))
	}
	errs := make([]error, len(changes))
	groups := map[string][]int{}
	var order []string
	for i, c := range changes {
		if err := check(c); err != nil {
			errs[i] = err
			continue
		}
		if _, ok := groups[c.DocID]; !ok {
			order = append(order, c.DocID)
		}
		groups[c.DocID] = append(groups[c.DocID], i)
	}
	var g errgroup.Group
	g.SetLimit(parallelism)
	for _, id := range order {
		idx := groups[id]
		slices.SortStableFunc(idx, func(a, b int) int { return changes[a].Version.Compare(changes[b].Version) })
		g.Go(func() error {
			for _, i := range idx {
				if err := ctx.Err(); err != nil {
					errs[i] = TransientError("timeout", fmt.Errorf("apply change %s: %w", changes[i].DocID, err))
					continue
				}
				start := time.Now()
				errs[i] = apply(ctx, changes[i])
				if pacer != nil {
					pacer.Observe(time.Since(start), errs[i])
				}
			}
			return nil // each change's error is in errs
		})
	}
	_ = g.Wait()
	return errs
}

// Pacer is told how long each request to an output took and decides how
// many may run at once; the writer's backpressure tracker is one.
type Pacer interface {
	// Limit returns the parallelism to use instead of max (1..max).
	Limit(max int) int
	// Observe records one request's duration and its result.
	Observe(d time.Duration, err error)
}

type pacerKey struct{}

// WithPacer returns a context whose EachDocument calls are paced by p.
func WithPacer(ctx context.Context, p Pacer) context.Context {
	return context.WithValue(ctx, pacerKey{}, p)
}

func pacerFrom(ctx context.Context) Pacer {
	p, _ := ctx.Value(pacerKey{}).(Pacer)
	return p
}

// Observe tells ctx's pacer, if any, how long one request to the output took
// and how it ended; sinks that do not use EachDocument call it.
func Observe(ctx context.Context, d time.Duration, err error) {
	if p := pacerFrom(ctx); p != nil {
		p.Observe(d, err)
	}
}
