package main

// writer-postgres: the writer's PostgreSQL throughput relative to a raw pgx
// batched upsert of the same rows.
//
// The same writerDocs documents (small sample orders) are written by each
// variant in batches of writerBatch (one SQS batch) from writerWorkers
// goroutines sharing a pool of as many connections. Each round runs every
// variant once, the order rotating from round to round, each into freshly
// truncated tables, so every variant inserts new rows:
//
//   - raw: one pgx.Batch per batch of INSERT ... ON CONFLICT (doc_id) DO
//     UPDATE into a table shaped like the sink's data table, no version check;
//   - sink: pgsink.Sink.Apply in document mode (versions table, advisory locks,
//     guarded statements);
//   - handler: writer.Handler.Handle on synthetic SQS events carrying the
//     encoded envelopes (decoding and routing included, no SQS network),
//     writing through the same kind of sink.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/pgsink"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/writer"
)

const (
	writerDocs    = 10000
	writerBatch   = 10
	writerWorkers = 4
	writerRounds  = 11
)

func writerPostgres(ctx context.Context, r *results) error {
	pool, err := coreOpenPool(ctx, writerWorkers)
	if err != nil {
		return err
	}
	defer pool.Close()
	name := testenv.UniqueName("bench-wp")
	base := strings.ReplaceAll(name, "-", "_")
	raw := pgx.Identifier{"public", base + "_raw"}
	outs := map[string]config.PostgresOutput{"sink": {Table: base + "_sink"}, "handler": {Table: base + "_handler"}}
	tables := map[string][]pgx.Identifier{"raw": {raw}} // by variant, the data table first
	sinks := map[string]*pgsink.Sink{}
	for variant, out := range outs {
		data, versions, err := pgsink.Tables(out, "pg")
		if err != nil {
			return err
		}
		tables[variant] = []pgx.Identifier{data, versions}
		if sinks[variant], err = pgsink.New(pool, out, "pg"); err != nil {
			return err
		}
	}
	defer coreDropTables(ctx, pool, slices.Concat(tables["raw"], tables["sink"], tables["handler"])...)

	if _, err := pool.Exec(ctx, `CREATE TABLE `+raw.Sanitize()+` (
    doc_id     text PRIMARY KEY,
    rev        text NOT NULL,
    seq        text NOT NULL,
    body       jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)`); err != nil {
		return fmt.Errorf("create raw table: %w", err)
	}
	for _, s := range sinks {
		if err := s.CreateTables(ctx); err != nil {
			return err
		}
	}
	sink := sinks["sink"]

	envs, err := writerEnvelopes(writerDocs)
	if err != nil {
		return err
	}
	handler, events, err := writerHandler(name, sinks["handler"], envs)
	if err != nil {
		return err
	}
	batches := slices.Collect(slices.Chunk(envs, writerBatch))
	r.add("docs", writerDocs, fmt.Sprintf("small orders, batches of %d, %d goroutines, pool of %d", writerBatch, writerWorkers, writerWorkers))

	upsert := `INSERT INTO ` + raw.Sanitize() + ` AS d (doc_id, rev, seq, body, updated_at)
VALUES ($1::text, $2::text, $3::text, $4::jsonb, now())
ON CONFLICT (doc_id) DO UPDATE
SET rev = EXCLUDED.rev, seq = EXCLUDED.seq, body = EXCLUDED.body, updated_at = EXCLUDED.updated_at`
	variants := []struct {
		name  string
		apply func(ctx context.Context, i int) error
	}{
		{"raw", func(ctx context.Context, i int) error {
			b := &pgx.Batch{}
			for _, e := range batches[i] {
				b.Queue(upsert, e.DocID, e.Rev, string(e.Seq), []byte(e.Doc))
			}
			return pool.SendBatch(ctx, b).Close()
		}},
		{"sink", func(ctx context.Context, i int) error {
			return errors.Join(sink.Apply(ctx, batches[i])...)
		}},
		{"handler", func(ctx context.Context, i int) error {
			resp, err := handler.Handle(ctx, events[i])
			if err != nil {
				return err
			}
			if n := len(resp.BatchItemFailures); n > 0 {
				return fmt.Errorf("%d messages failed", n)
			}
			return nil
		}},
	}
	rates := map[string][]float64{}
	var sinkRatios, handlerRatios []float64
	for round := range writerRounds {
		got := map[string]float64{}
		for k := range variants {
			v := variants[(k+round)%len(variants)]
			if err := coreTruncate(ctx, pool, tables[v.name]...); err != nil {
				return err
			}
			d, err := coreParallel(ctx, len(batches), writerWorkers, v.apply)
			if err != nil {
				return fmt.Errorf("round %d %s: %w", round+1, v.name, err)
			}
			if err := coreCountRows(ctx, pool, tables[v.name][0], writerDocs); err != nil {
				return fmt.Errorf("round %d %s: %w", round+1, v.name, err)
			}
			got[v.name] = coreRate(writerDocs, d)
			rates[v.name] = append(rates[v.name], got[v.name])
		}
		sinkRatios = append(sinkRatios, got["sink"]/got["raw"])
		handlerRatios = append(handlerRatios, got["handler"]/got["raw"])
		fmt.Printf("  round %d: raw %.0f, sink %.0f, handler %.0f rows/s\n", round+1, got["raw"], got["sink"], got["handler"])
	}
	for _, v := range variants {
		xs := rates[v.name]
		r.add(v.name+" rows/s", median(slices.Clone(xs)), "median of "+coreJoin(xs, "%.0f"))
	}
	r.add("sink/raw", median(slices.Clone(sinkRatios)), "goal >= 0.7; per round "+coreJoin(sinkRatios, "%.3f"))
	r.add("handler/raw", median(slices.Clone(handlerRatios)), "per round "+coreJoin(handlerRatios, "%.3f"))
	var handlerSink []float64
	for i := range rates["sink"] {
		handlerSink = append(handlerSink, rates["handler"][i]/rates["sink"][i])
	}
	r.add("handler/sink", median(slices.Clone(handlerSink)), "the handler's rate over its own sink's, side by side; per round "+coreJoin(handlerSink, "%.3f"))

	// The handler's own cost, apart from PostgreSQL: the same events through a
	// handler whose sink does nothing, from one goroutine.
	nop, nopEvents, err := writerHandler(name+"-nop", writerNopSink{}, envs)
	if err != nil {
		return err
	}
	var perMsg []float64
	for range 5 {
		start := time.Now()
		for _, ev := range nopEvents {
			if _, err := nop.Handle(ctx, ev); err != nil {
				return err
			}
		}
		perMsg = append(perMsg, float64(time.Since(start).Microseconds())/float64(writerDocs))
	}
	r.add("handler overhead µs per message", median(slices.Clone(perMsg)), "decode, route, metrics, with a sink that does nothing, one goroutine; 5 passes of "+strconv.Itoa(writerDocs)+" messages: "+coreJoin(perMsg, "%.1f"))
	return nil
}

// writerNopSink accepts every change and writes nothing.
type writerNopSink struct{}

func (writerNopSink) Apply(_ context.Context, changes []*change.Envelope) []error {
	return make([]error, len(changes))
}

// writerEnvelopes builds n live changes of distinct documents, in
// observation order, as a poller of generation 1 would send them.
func writerEnvelopes(n int) ([]*change.Envelope, error) {
	rng := rand.New(rand.NewPCG(3, 4))
	now := time.Now().UTC()
	envs := make([]*change.Envelope, n)
	for i := range envs {
		body, err := json.Marshal(sample.Order(i, 1, 0, rng))
		if err != nil {
			return nil, fmt.Errorf("encode order: %w", err)
		}
		envs[i] = &change.Envelope{
			V: change.EnvelopeVersion, Job: "bench", Output: "pg", DocID: sample.ID(i),
			Rev: fmt.Sprintf("1-%032x", rng.Uint64()), Seq: json.RawMessage(strconv.Itoa(i + 1)),
			Version: change.Version{Generation: 1, Counter: int64(i + 1)}, EnqueuedAt: now, Doc: body,
		}
	}
	return envs, nil
}

// writerHandler returns a writer handler whose one route writes through
// sink, and the SQS events carrying envs in batches, as the event source
// mapping would deliver them.
func writerHandler(prefix string, sink deliver.Sink, envs []*change.Envelope) (*writer.Handler, []events.SQSEvent, error) {
	cfg, err := config.Parse(fmt.Appendf(nil, `{"stack": {"prefix": %q}, "jobs": [{"id": "bench",
  "source": {"type": "couchdb", "url": "http://127.0.0.1:5984/unused"},
  "outputs": [{"id": "pg", "type": "postgres", "postgres": {"dsn": {"env": %q}}}]}]}`, prefix, testenv.DSNEnv))
	if err != nil {
		return nil, nil, fmt.Errorf("handler config: %w", err)
	}
	j := cfg.Jobs[0]
	arn := "arn:aws:sqs:us-east-1:000000000000:" + cfg.QueueName(j, j.Outputs[0])
	h := &writer.Handler{
		Config:  cfg,
		Sinks:   func(context.Context, config.Route) (deliver.Sink, error) { return sink, nil },
		SQS:     coreNoSQS{},
		Log:     slog.New(slog.DiscardHandler),
		Metrics: io.Discard,
	}
	var evs []events.SQSEvent
	for k, batch := range slices.Collect(slices.Chunk(envs, writerBatch)) {
		ev := events.SQSEvent{Records: make([]events.SQSMessage, len(batch))}
		for i, e := range batch {
			body, err := json.Marshal(e)
			if err != nil {
				return nil, nil, fmt.Errorf("encode envelope: %w", err)
			}
			ev.Records[i] = events.SQSMessage{
				MessageId:      fmt.Sprintf("m-%d-%d", k, i),
				ReceiptHandle:  fmt.Sprintf("r-%d-%d", k, i),
				Body:           string(body),
				Attributes:     map[string]string{"ApproximateReceiveCount": "1"},
				EventSource:    "aws:sqs",
				EventSourceARN: arn,
				AWSRegion:      "us-east-1",
			}
		}
		evs = append(evs, ev)
	}
	return h, evs, nil
}

// coreNoSQS fails every call: the handler only calls SQS for a failed message,
// which the benchmark then reports.
type coreNoSQS struct{}

var errCoreNoSQS = errors.New("no SQS in this benchmark")

func (coreNoSQS) GetQueueUrl(context.Context, *sqs.GetQueueUrlInput, ...func(*sqs.Options)) (*sqs.GetQueueUrlOutput, error) {
	return nil, errCoreNoSQS
}

func (coreNoSQS) SendMessage(context.Context, *sqs.SendMessageInput, ...func(*sqs.Options)) (*sqs.SendMessageOutput, error) {
	return nil, errCoreNoSQS
}

func (coreNoSQS) ChangeMessageVisibility(context.Context, *sqs.ChangeMessageVisibilityInput, ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error) {
	return nil, errCoreNoSQS
}

func (coreNoSQS) SendMessageBatch(context.Context, *sqs.SendMessageBatchInput, ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	return nil, errCoreNoSQS
}

func (coreNoSQS) ChangeMessageVisibilityBatch(context.Context, *sqs.ChangeMessageVisibilityBatchInput, ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityBatchOutput, error) {
	return nil, errCoreNoSQS
}

// coreParallel runs apply(i) for every i < n from workers goroutines and
// returns the wall time, or the first error.
func coreParallel(ctx context.Context, n, workers int, apply func(ctx context.Context, i int) error) (time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := apply(ctx, i); err != nil {
					once.Do(func() { first = fmt.Errorf("batch %d: %w", i, err); cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), first
}

func coreTruncate(ctx context.Context, pool *pgxpool.Pool, tables ...pgx.Identifier) error {
	for _, t := range tables {
		if _, err := pool.Exec(ctx, "TRUNCATE "+t.Sanitize()); err != nil {
			return fmt.Errorf("truncate %s: %w", t.Sanitize(), err)
		}
	}
	return nil
}

// coreCountRows checks that table holds want rows.
func coreCountRows(ctx context.Context, pool *pgxpool.Pool, table pgx.Identifier, want int) error {
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table.Sanitize()).Scan(&n); err != nil {
		return fmt.Errorf("count rows of %s: %w", table.Sanitize(), err)
	}
	if n != want {
		return fmt.Errorf("%s holds %d rows, want %d", table.Sanitize(), n, want)
	}
	return nil
}
