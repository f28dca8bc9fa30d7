// Package lambdamain starts a Lambda function of the pipeline: it builds the
// dependencies from the function's environment and serves one of their
// handlers.
package lambdamain

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/changes-worker/changes-worker/shared/pipeline"
)

// Start loads the dependencies and serves the handler that handler picks
// from them. When they cannot be loaded it prints the error, prefixed with
// the function's name, and exits with status 1. Its logger, JSON with the
// request id, is also slog's default, for the packages that log through it.
func Start(ctx context.Context, name string, handler func(*pipeline.Deps) any) {
	log := lambdacontext.NewLogger()
	slog.SetDefault(log)
	deps, err := pipeline.Load(ctx, os.LookupEnv, log, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
	lambda.Start(handler(deps))
}
