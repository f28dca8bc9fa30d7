package deliver

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/changes-worker/changes-worker/shared/change"
)

// EachDocument applies changes one at a time with apply, for sinks that write
// one document per request. Different documents run in parallel, at most
// parallelism at once; changes of one document run one after another, oldest
// version first. check validates a change before anything is sent; its error
// (or apply's) is that change's result. A change that has not started when
// ctx ends fails transient.
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
	sem := make(chan struct{}, parallelism)
	var wg sync.WaitGroup
	for _, id := range order {
		idx := groups[id]
		slices.SortStableFunc(idx, func(a, b int) int { return changes[a].Version.Compare(changes[b].Version) })
		wg.Go(func() {
			for _, i := range idx {
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					errs[i] = TransientError("timeout", fmt.Errorf("apply change %s: %w", changes[i].DocID, ctx.Err()))
					continue
				}
				errs[i] = apply(ctx, changes[i])
				<-sem
			}
		})
	}
	wg.Wait()
	return errs
}
