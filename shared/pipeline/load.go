package pipeline

import (
	"context"
	"io"
	"log/slog"

	"github.com/changes-worker/changes-worker/shared/awsconf"
)

// Load is a Lambda function's cold start: the configuration the
// environment names (LoadConfig), the AWS configuration, and the
// dependencies built from them.
func Load(ctx context.Context, lookup Lookup, log *slog.Logger, metricsOut io.Writer) (*Deps, error) {
	cfg, err := LoadConfig(lookup)
	if err != nil {
		return nil, err
	}
	awsCfg, err := awsconf.Load(ctx, log)
	if err != nil {
		return nil, err
	}
	return New(cfg, awsCfg, lookup, log, metricsOut), nil
}
