package main

// The core pipeline benchmarks (one file each):
//
//	poller-throughput  core_poller.go
//	writer-postgres    core_writer.go
//	e2e-latency        core_latency.go
//	poller-memory      core_memory.go
//
// This file holds what they share: an isolated stack (testenv/stack) with
// one job reading a source database of its own into one PostgreSQL output,
// loading that source, and PostgreSQL helpers.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

func init() {
	register("poller-throughput", pollerThroughput)
	register("writer-postgres", writerPostgres)
	register("e2e-latency", e2eLatency)
	register("poller-memory", pollerMemory)
}

// coreStackSettings shape the one job of a stack.
type coreStackSettings struct {
	limit         int
	feedTimeout   time.Duration // default 10s
	pollerTimeout time.Duration // default 60s
	createTables  bool
	logLevel      slog.Level  // of the captured pipeline log; default info
	source        *modeSource // the source the job reads; nil: the stack's own database
}

// newCoreStack provisions a stack named after kind whose job "bench" reads
// the stack's own source database and has one PostgreSQL output "pg"
// (document mode, standard queue).
func newCoreStack(ctx context.Context, kind string, s coreStackSettings) (*stack.Stack, error) {
	if s.feedTimeout == 0 {
		s.feedTimeout = 10 * time.Second
	}
	if s.pollerTimeout == 0 {
		s.pollerTimeout = time.Minute
	}
	cfg := &config.File{
		Stack: config.Stack{PollerTimeout: config.Duration(s.pollerTimeout), WriterTimeout: config.Duration(30 * time.Second)},
		Jobs: []*config.Job{{
			ID:    "bench",
			Feed:  config.Feed{Limit: s.limit, Timeout: config.Duration(s.feedTimeout), Fetch: config.FetchIncludeDocs},
			Lease: config.Lease{TTL: config.Duration(10 * time.Second)},
			Outputs: []*config.Output{{ID: "pg", Type: config.OutputPostgres, Ordering: config.OrderingNone,
				Postgres: &config.PostgresOutput{CreateTables: s.createTables}}},
			SendDepth: *cloudSendDepthFlag, // zero: the default
		}},
	}
	if s.source != nil {
		cfg.Jobs[0].Source = config.Source{Type: s.source.kind, URL: s.source.read, Auth: s.source.auth}
	}
	return stack.New(ctx, stack.Options{Name: "bench-" + kind, Config: cfg, LogLevel: s.logLevel})
}

// coreLoaded returns the stack open provisions once load has written n
// documents of about size bytes into its source database, and how long
// load took. On an error the stack is closed.
func coreLoaded(ctx context.Context, open func() (*stack.Stack, error), load func(ctx context.Context, db string, n, size int) error, n, size int) (*stack.Stack, time.Duration, error) {
	st, err := open()
	if err != nil {
		return nil, 0, err
	}
	t0 := time.Now()
	if err := load(ctx, st.SourceURL, n, size); err != nil {
		coreClose(ctx, st)
		return nil, 0, err
	}
	return st, time.Since(t0), nil
}

// coreClose closes a stack, printing what it could not remove.
func coreClose(ctx context.Context, st interface{ Close(context.Context) error }) {
	if err := st.Close(ctx); err != nil {
		fmt.Printf("  cleanup: %v\n", err)
	}
}

// coreSourceClient writes to the source; loads of tens of thousands of
// documents take minutes.
var coreSourceClient = &http.Client{Timeout: 5 * time.Minute}

// coreLoad writes n sample orders with bodies padded to about padding bytes
// into the source database db.
func coreLoad(ctx context.Context, db string, n, padding int) error {
	if _, err := sample.Load(ctx, coreSourceClient, db, sample.Options{Docs: n, BodyBytes: padding, Seed: 2}); err != nil {
		return fmt.Errorf("load source db: %w", err)
	}
	return nil
}

// coreOpenPool connects to PostgreSQL with at most maxConns connections.
func coreOpenPool(ctx context.Context, maxConns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(testenv.DSN())
	if err != nil {
		return nil, errors.New("parse postgres dsn: malformed connection string")
	}
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping postgres (start the local services with `make up`): %w", err)
	}
	return pool, nil
}

// coreDropTables drops tables (best effort), with a context of its own.
func coreDropTables(ctx context.Context, pool *pgxpool.Pool, tables ...pgx.Identifier) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, t := range tables {
		_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+t.Sanitize())
	}
}

// coreRate is n per second over d.
func coreRate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// coreMillis is d in milliseconds.
func coreMillis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// coreJoin formats a sample for a note.
func coreJoin(xs []float64, format string) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(parts, " ")
}
