// Package lambdamain starts a Lambda function of the pipeline: it builds the
// dependencies from the function's environment and serves one of their
// handlers.
package lambdamain

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/version"
)

// Start loads the dependencies and serves the handler that handler picks
// from them. Its first log line, before anything is loaded, names the
// function and the release it runs. When the dependencies cannot be loaded
// it prints the error, prefixed with the function's name, and exits with
// status 1. Its logger, JSON with the request id, is also slog's default,
// for the packages that log through it.
func Start(ctx context.Context, name string, handler func(*pipeline.Deps) any) {
	log := lambdacontext.NewLogger()
	slog.SetDefault(log)
	log.InfoContext(ctx, "starting", "function", name, "version", version.String(), "commit", version.Commit(), "go", runtime.Version())
	deps, err := pipeline.Load(ctx, os.LookupEnv, log, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
	lambda.Start(handler(deps))
}
