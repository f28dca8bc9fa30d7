package deliver

import (
	"context"
	"fmt"
	"slices"

	"golang.org/x/sync/errgroup"

	"github.com/changes-worker/changes-worker/shared/change"
)

// EachDocument applies changes one at a time with apply, for sinks that write
// one document per request. Different documents run in parallel, at most
// parallelism at once; changes of one document run one after another, oldest
// version first. check validates a change before anything is sent; its error
// (or apply's) is that change's result, and one change's failure stops no
// other. A change that has not started when ctx ends fails transient.
func EachDocument(ctx context.Context, changes []*change.Envelope, parallelism int,
	check func(*change.Envelope) error, apply func(context.Context, *change.Envelope) error) []error {
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
				errs[i] = apply(ctx, changes[i])
			}
			return nil // each change's error is in errs
		})
	}
	_ = g.Wait()
	return errs
}
