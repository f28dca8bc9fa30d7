package main

// The core pipeline benchmarks of issue 2 item 10 (one file each):
//
//	poller-throughput  core_poller.go
//	writer-postgres    core_writer.go
//	e2e-latency        core_latency.go
//	poller-memory      core_memory.go
//
// This file holds what they share: the local service addresses, unique
// names, and an isolated stack (its own resource prefix) provisioned on the
// AWS emulator and torn down afterwards.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/provision"
	"github.com/changes-worker/changes-worker/shared/sample"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

func init() {
	register("poller-throughput", pollerThroughput)
	register("writer-postgres", writerPostgres)
	register("e2e-latency", e2eLatency)
	register("poller-memory", pollerMemory)
}

// coreDSNEnv is the environment variable the benchmark configurations name for
// the PostgreSQL DSN; coreLookup answers it with pgDSN when it is unset.
const coreDSNEnv = "PG_DSN"

// coreCouchURL is the CouchDB-compatible source's base URL.
func coreCouchURL() string {
	for _, k := range []string{"CHANGES_TEST_COUCH_URL", "COUCH_URL"} {
		if v := os.Getenv(k); v != "" {
			return strings.TrimRight(v, "/")
		}
	}
	return testenv.DefaultCouchURL
}

// pgDSN is the PostgreSQL connection string.
func pgDSN() string {
	for _, k := range []string{"CHANGES_TEST_PG_DSN", coreDSNEnv} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return testenv.DefaultPostgresDSN
}

// coreLookup is the environment the pipeline resolves secrets from.
func coreLookup(k string) (string, bool) {
	if k == coreDSNEnv {
		return pgDSN(), true
	}
	return os.LookupEnv(k)
}

// coreName returns "bench-<kind>-<8 hex digits>": lowercase letters, digits
// and '-', short enough for a stack prefix, a database or a job id.
func coreName(kind string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "bench-" + kind + "-" + hex.EncodeToString(b)
}

// coreTableName turns a unique name into a PostgreSQL identifier.
func coreTableName(name string) string { return strings.ReplaceAll(name, "-", "_") }

var coreDiscardLog = slog.New(slog.DiscardHandler)

// coreSourceDB is a fresh database on the source, deleted by drop.
type coreSourceDB struct {
	url string
	hc  *http.Client
}

// newCoreSourceDB creates the database name on the source.
func newCoreSourceDB(ctx context.Context, name string) (*coreSourceDB, error) {
	s := &coreSourceDB{url: coreCouchURL() + "/" + name, hc: &http.Client{Timeout: 5 * time.Minute}}
	if err := sample.CreateDB(ctx, s.hc, s.url); err != nil {
		return nil, fmt.Errorf("create source db %s (start the local services with `make up`): %w", name, err)
	}
	return s, nil
}

// load writes n sample orders with bodies padded to about padding bytes.
func (s *coreSourceDB) load(ctx context.Context, n, padding int) error {
	if _, err := sample.Load(ctx, s.hc, s.url, sample.Options{Docs: n, BodyBytes: padding, Seed: 2}); err != nil {
		return fmt.Errorf("load source db: %w", err)
	}
	return nil
}

func (s *coreSourceDB) drop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = sample.DeleteDB(ctx, s.hc, s.url)
}

// coreStack is one isolated pipeline configuration, provisioned on the AWS
// emulator: its own table, queues and bucket, all named after its prefix.
type coreStack struct {
	name string
	cfg  *config.File
	deps *pipeline.Deps
	raw  string // the configuration document
}

// coreStackSettings shape the one job of a stack.
type coreStackSettings struct {
	source        string // database URL
	limit         int
	feedTimeout   string
	pollerTimeout string
	table         string // PostgreSQL table of the output
	createTables  bool
}

// newCoreStack provisions a stack whose job "bench" reads s.source and has one
// PostgreSQL output "pg" (document mode, standard queue).
func newCoreStack(ctx context.Context, name string, s coreStackSettings) (*coreStack, error) {
	testenv.SetAWSEnv()
	if s.feedTimeout == "" {
		s.feedTimeout = "10s"
	}
	if s.pollerTimeout == "" {
		s.pollerTimeout = "60s"
	}
	if s.table == "" {
		s.table = coreTableName(name)
	}
	doc := fmt.Sprintf(`{
  "stack": {"prefix": %q, "bucket": %q, "poller_timeout": %q, "writer_timeout": "30s"},
  "jobs": [{
    "id": "bench",
    "source": {"type": "couchdb", "url": %q},
    "feed": {"limit": %d, "timeout": %q, "fetch": "include_docs"},
    "lease": {"ttl": "10s"},
    "outputs": [{"id": "pg", "type": "postgres", "ordering": "none",
      "postgres": {"dsn": {"env": %q}, "table": %q, "create_tables": %t}}]
  }]
}`, name, name+"-data", s.pollerTimeout, s.source, s.limit, s.feedTimeout, coreDSNEnv, s.table, s.createTables)
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		return nil, fmt.Errorf("bench config: %w", err)
	}
	awsCfg, err := awsconf.Load(ctx)
	if err != nil {
		return nil, err
	}
	deps := pipeline.New(cfg, awsCfg, coreLookup, coreDiscardLog, io.Discard)
	st := &coreStack{name: name, cfg: cfg, deps: deps, raw: doc}
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := provision.Apply(pctx, provision.Clients{DynamoDB: deps.DynamoDB, SQS: deps.SQS, S3: deps.S3}, cfg); err != nil {
		st.close()
		return nil, fmt.Errorf("provision %s (is the AWS emulator running? `make up`): %w", name, err)
	}
	return st, nil
}

// queueURL is the work queue of the stack's one output.
func (s *coreStack) queueURL(ctx context.Context) (string, error) {
	j := s.cfg.Jobs[0]
	name := s.cfg.QueueName(j, j.Outputs[0])
	out, err := s.deps.SQS.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		return "", fmt.Errorf("get queue url %s: %w", name, err)
	}
	return aws.ToString(out.QueueUrl), nil
}

// close deletes the stack's queues, table and bucket (best effort) and
// closes its pools.
func (s *coreStack) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.deps.Close()
	for _, j := range s.cfg.Jobs {
		for _, o := range j.Outputs {
			for _, name := range []string{s.cfg.QueueName(j, o), s.cfg.DLQName(j, o)} {
				if out, err := s.deps.SQS.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name}); err == nil {
					_, _ = s.deps.SQS.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl})
				}
			}
		}
	}
	_, _ = s.deps.DynamoDB.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(s.cfg.TableName())})
	_, _ = s.deps.S3.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(s.cfg.Stack.Bucket)})
}

// coreOpenPool connects to PostgreSQL with at most maxConns connections.
func coreOpenPool(ctx context.Context, maxConns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(pgDSN())
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
func coreDropTables(pool *pgxpool.Pool, tables ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, t := range tables {
		_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{t}.Sanitize())
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
