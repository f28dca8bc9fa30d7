// Command poller is the poller Lambda: on each schedule tick it reads one
// job's _changes feed under the job's lease and queues the changes.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/changes-worker/changes-worker/shared/pipeline"
)

func main() {
	if err := realMain(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "poller:", err)
		os.Exit(1)
	}
}

func realMain(ctx context.Context) error {
	deps, err := pipeline.Load(ctx, os.LookupEnv, lambdacontext.NewLogger(), os.Stdout)
	if err != nil {
		return err
	}
	lambda.Start(deps.HandleSchedule)
	return nil
}
