// Command verify is the verify Lambda of a job: invoked by `changesctl
// verify --remote`, it compares one output with the job's source from
// inside the stack, where both are reachable, repairs what differs when
// asked, and answers with the report.
package main

import (
	"context"

	"github.com/changes-worker/changes-worker/functions/internal/lambdamain"
	"github.com/changes-worker/changes-worker/shared/pipeline"
)

func main() {
	lambdamain.Start(context.Background(), "verify", func(d *pipeline.Deps) any { return d.HandleVerify })
}
