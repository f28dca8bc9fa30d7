// Command writer is the writer Lambda: it delivers SQS batches of changes to
// their output and reports the failed messages (ReportBatchItemFailures).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/pipeline"
)

func main() {
	if err := realMain(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "writer:", err)
		os.Exit(1)
	}
}

func realMain(ctx context.Context) error {
	log := lambdacontext.NewLogger()
	cfg, err := pipeline.LoadConfig(os.LookupEnv)
	if err != nil {
		return err
	}
	awsCfg, err := awsconf.Load(ctx)
	if err != nil {
		return err
	}
	deps := pipeline.New(cfg, awsCfg, os.LookupEnv, log, os.Stdout)
	lambda.Start(deps.Writer().Handle)
	return nil
}
