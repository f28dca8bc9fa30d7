package awsconf

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/aws/smithy-go/logging"
)

// Logger is the SDK's logger (smithy's logging.Logger) writing to log: the
// SDK's warnings at slog's Warn level, its debug lines at Debug, as the
// message "aws sdk" with the SDK's text under "detail", and with the
// context of the request when the SDK gives one. A nil log discards.
func Logger(log *slog.Logger) logging.Logger {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return sdkLogger{log: log}
}

type sdkLogger struct {
	log *slog.Logger
	ctx context.Context // the request's (WithContext), else nil: slog's default
}

var _ logging.ContextLogger = sdkLogger{}

func (l sdkLogger) Logf(c logging.Classification, format string, v ...any) {
	level := slog.LevelInfo
	switch c {
	case logging.Warn:
		level = slog.LevelWarn
	case logging.Debug:
		level = slog.LevelDebug
	}
	if !l.log.Enabled(l.ctx, level) {
		return
	}
	l.log.Log(l.ctx, level, "aws sdk", "detail", fmt.Sprintf(format, v...))
}

func (l sdkLogger) WithContext(ctx context.Context) logging.Logger {
	return sdkLogger{log: l.log, ctx: ctx}
}
