// Command poller is the poller Lambda: on each schedule tick it reads one
// job's _changes feed under the job's lease and queues the changes.
package main

import (
	"context"

	"github.com/changes-worker/changes-worker/functions/internal/lambdamain"
	"github.com/changes-worker/changes-worker/shared/pipeline"
)

func main() {
	lambdamain.Start(context.Background(), "poller", func(d *pipeline.Deps) any { return d.HandleSchedule })
}
