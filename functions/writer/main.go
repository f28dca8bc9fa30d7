// Command writer is the writer Lambda: it delivers SQS batches of changes to
// their output and reports the failed messages (ReportBatchItemFailures),
// and on its probe schedule tries the outputs whose intake it paused.
package main

import (
	"context"

	"github.com/changes-worker/changes-worker/functions/internal/lambdamain"
	"github.com/changes-worker/changes-worker/shared/pipeline"
)

func main() {
	lambdamain.Start(context.Background(), "writer", func(d *pipeline.Deps) any { return d.Writer().Invoke })
}
