package stack_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver/delivertest"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

func template() *config.File {
	return &config.File{
		Stack: config.Stack{PollerTimeout: config.Duration(15 * time.Second)},
		Jobs: []*config.Job{{ID: "orders", Outputs: []*config.Output{
			{ID: "pg", Type: config.OutputPostgres, Postgres: &config.PostgresOutput{CreateTables: true}},
			{ID: "pg-fifo", Type: config.OutputPostgres, Ordering: config.OrderingPerDocument, Postgres: &config.PostgresOutput{CreateTables: true}},
			{ID: "archive", Type: config.OutputS3, S3: &config.S3Output{Prefix: "archive/"}},
		}}},
	}
}

// A stack names and provisions everything its configuration leaves empty,
// and Close removes all of it.
func TestStackProvisionsAndRemoves(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	testenv.AWS(t)
	pool := testenv.Postgres(t)
	tmpl := template()
	s, err := stack.New(ctx, stack.Options{Name: "selftest", Config: tmpl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(ctx) })

	// Named after the stack.
	if !strings.HasPrefix(s.Name, "selftest-") {
		t.Errorf("name %q, want selftest-<suffix>", s.Name)
	}
	ident := strings.ReplaceAll(s.Name, "-", "_")
	j := s.Config.Jobs[0]
	got := map[string]string{
		"prefix": s.Config.Stack.Prefix, "bucket": s.Config.Stack.Bucket, "source": j.Source.URL, "source type": j.Source.Type,
		"pg table": j.Outputs[0].Postgres.Table, "pg dsn": j.Outputs[0].Postgres.DSN.Env, "pg-fifo table": j.Outputs[1].Postgres.Table,
		"archive bucket": j.Outputs[2].S3.Bucket,
	}
	want := map[string]string{
		"prefix": s.Name, "bucket": s.Name + "-data", "source": testenv.CouchBaseURL() + "/" + s.Name, "source type": config.SourceCouchDB,
		"pg table": ident + "_pg", "pg dsn": testenv.DSNEnv, "pg-fifo table": ident + "_pg_fifo",
		"archive bucket": s.Name + "-data",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("filled settings (-want +got):\n%s", d)
	}
	if s.SourceURL != want["source"] {
		t.Errorf("SourceURL %q, want %q", s.SourceURL, want["source"])
	}
	if tmpl.Stack.Prefix != "" || tmpl.Jobs[0].Source.URL != "" || tmpl.Jobs[0].Outputs[0].Postgres.Table != "" {
		t.Errorf("New changed the caller's configuration: %+v", tmpl.Stack)
	}
	// The file holds the configuration.
	fromFile, err := config.Load(s.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(s.Config, fromFile); d != "" {
		t.Errorf("config file differs from Config (-Config +file):\n%s", d)
	}

	// Provisioned: the source database, the state table, the queues, the bucket.
	if code := status(t, http.MethodGet, s.SourceURL); code != http.StatusOK {
		t.Errorf("source database: status %d", code)
	}
	table := s.Config.TableName()
	if _, err := s.Deps.DynamoDB.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &table}); err != nil {
		t.Errorf("state table: %v", err)
	}
	var queues []string
	for _, o := range j.Outputs {
		q, err := s.Queues(ctx, j.ID, o.ID)
		if err != nil {
			t.Fatal(err)
		}
		if q.FIFO != (o.ID == "pg-fifo") {
			t.Errorf("queues of %s: fifo %v", o.ID, q.FIFO)
		}
		queues = append(queues, q.WorkName, q.DLQName)
	}
	bucket := s.Config.Stack.Bucket
	if _, err := s.Deps.S3.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: aws.String("archive/x.json"), Body: bytes.NewReader([]byte(`{}`))}); err != nil {
		t.Fatalf("put object: %v", err)
	}

	// What the writer creates: the output's tables, resolved as the sink names them.
	for _, o := range j.Outputs[:2] {
		if _, err := s.Deps.Sink(ctx, config.Route{Job: j, Output: o}); err != nil {
			t.Fatal(err)
		}
	}
	data, versions, err := s.PostgresTables("orders", "pg")
	if err != nil {
		t.Fatal(err)
	}
	if want := (pgx.Identifier{"public", ident + "_pg_versions"}); !cmp.Equal(versions, want) {
		t.Errorf("versions table %v, want %v", versions, want)
	}
	if !exists(t, pool, data) || !exists(t, pool, versions) {
		t.Fatalf("tables %v and %v not created", data, versions)
	}
	if _, _, err := s.PostgresTables("orders", "archive"); err == nil {
		t.Error("PostgresTables of an s3 output: no error")
	}

	// Documents in the source database.
	seq0, err := s.UpdateSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a1, err := s.PutDoc(ctx, "a/1", map[string]any{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := s.PutDoc(ctx, "a/1", map[string]any{"n": 2, "_rev": a1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutDoc(ctx, "a/1", map[string]any{"n": 3, "_rev": a1}); err == nil || !strings.Contains(err.Error(), "409") {
		t.Errorf("put of a stale revision: %v, want a 409 conflict", err)
	}
	b1, err := s.PutDoc(ctx, "b", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteDoc(ctx, "b", b1); err != nil {
		t.Fatal(err)
	}
	winners, err := s.SourceWinners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(map[string]string{"a/1": a2}, winners); d != "" {
		t.Errorf("source winners (-want +got):\n%s", d)
	}
	if seq, err := s.UpdateSeq(ctx); err != nil || len(seq) == 0 || string(seq) == string(seq0) {
		t.Errorf("update_seq %s after four writes (%v), was %s", seq, err, seq0)
	}

	// The log is captured.
	s.Deps.Log.Info("captured line", "doc_id", "x")
	if !strings.Contains(s.Logs().String(), `msg="captured line" doc_id=x`) {
		t.Errorf("log not captured:\n%s", s.Logs().String())
	}

	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if code := status(t, http.MethodGet, s.SourceURL); code != http.StatusNotFound {
		t.Errorf("source database after Close: status %d, want 404", code)
	}
	if _, err := s.Deps.DynamoDB.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &table}); err == nil {
		t.Error("state table still there after Close")
	}
	for _, name := range queues {
		if _, err := s.Deps.SQS.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name}); err == nil {
			t.Errorf("queue %s still there after Close", name)
		}
	}
	if _, err := s.Deps.S3.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &bucket}); err == nil {
		t.Errorf("bucket %s still there after Close", bucket)
	}
	for _, tbl := range []pgx.Identifier{data, versions} {
		if exists(t, pool, tbl) {
			t.Errorf("table %v still there after Close", tbl)
		}
	}
	if _, err := os.Stat(s.ConfigPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("config file after Close: %v", err)
	}
}

// What the configuration names (a source, a table, a bucket) is the
// caller's: the stack neither creates nor removes it.
func TestStackKeepsWhatTheConfigNames(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testenv.Postgres(t)
	db := testenv.CouchDB(t)
	bucket := testenv.Name(t)
	table := strings.ReplaceAll(testenv.Name(t), "-", "_")
	cfg := template()
	cfg.Stack.Bucket = bucket
	cfg.Jobs[0].Source.URL = db
	cfg.Jobs[0].Source.Type = config.SourceCouchDB
	cfg.Jobs[0].Outputs[0].Postgres.Table = table
	s := stack.ForTest(t, stack.Options{Config: cfg})
	if s.SourceURL != "" {
		t.Errorf("SourceURL %q for a job naming its source", s.SourceURL)
	}
	if _, err := s.PutDoc(ctx, "x", map[string]any{}); err == nil {
		t.Error("PutDoc without a source database of the stack's own: no error")
	}
	j := s.Config.Jobs[0]
	if _, err := s.Deps.Sink(ctx, config.Route{Job: j, Output: j.Outputs[0]}); err != nil {
		t.Fatal(err)
	}
	data, versions, err := s.PostgresTables("orders", "pg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.WithoutCancel(ctx), `DROP TABLE `+data.Sanitize()+`, `+versions.Sanitize())
		_, _ = s.Deps.S3.DeleteBucket(context.WithoutCancel(ctx), &s3.DeleteBucketInput{Bucket: &bucket})
	})
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if code := status(t, http.MethodGet, db); code != http.StatusOK {
		t.Errorf("the job's own source database after Close: status %d", code)
	}
	if !exists(t, pool, data) {
		t.Errorf("the output's own table %s was dropped", table)
	}
	if _, err := s.Deps.S3.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &bucket}); err != nil {
		t.Errorf("the configured bucket after Close: %v", err)
	}
}

// Revs and Body read an output through its sink's state reader: a
// PostgreSQL and an S3 output after changes applied by their sinks.
func TestStackReadsOutputs(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	testenv.AWS(t)
	testenv.Postgres(t)
	s := stack.ForTest(t, stack.Options{Name: "reads", Config: template()})
	j := s.Config.Job("orders")
	changes := [][]*change.Envelope{
		{delivertest.Live("a", "1-a", delivertest.V(1, 1)), delivertest.Live("b/1", "1-b", delivertest.V(1, 2))},
		{delivertest.Live("a", "2-a", delivertest.V(1, 3)), delivertest.Deleted("b/1", "2-b", delivertest.V(1, 4))},
	}
	for _, output := range []string{"pg", "archive"} {
		t.Run(output, func(t *testing.T) {
			sink, err := s.Deps.Sink(ctx, config.Route{Job: j, Output: j.Output(output)})
			if err != nil {
				t.Fatal(err)
			}
			for _, batch := range changes {
				if err := errors.Join(sink.Apply(ctx, batch)...); err != nil {
					t.Fatalf("apply: %v", err)
				}
			}
			revs, err := s.Revs(ctx, "orders", output)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(map[string]string{"a": "2-a"}, revs); d != "" {
				t.Errorf("Revs (-want +got):\n%s", d)
			}
			body, ok, err := s.Body(ctx, "orders", output, "a")
			if err != nil || !ok || !strings.Contains(string(body), `"2-a"`) {
				t.Errorf("Body(a) = %s, %v, %v; want the body of 2-a", body, ok, err)
			}
			if body, ok, err := s.Body(ctx, "orders", output, "b/1"); err != nil || ok {
				t.Errorf("Body(b/1) = %s, %v, %v; want none", body, ok, err)
			}
		})
	}
	if _, err := s.Revs(ctx, "orders", "none"); err == nil {
		t.Error("Revs of an output the job lacks: no error")
	}
}

func TestCaptureKeepsTheEnd(t *testing.T) {
	t.Parallel()
	var c stack.Capture
	line := strings.Repeat("x", 1023) + "\n"
	for range 20 * 1024 { // 20 MiB of lines
		if _, err := c.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	c.Write([]byte("last\n"))
	got := c.String()
	if len(got) > 16<<20 || len(got) < 8<<20 {
		t.Errorf("kept %d bytes, want between 8 and 16 MiB", len(got))
	}
	if !strings.HasPrefix(got, "x") || !strings.HasSuffix(got, "last\n") {
		t.Errorf("kept %q...%q: want whole lines up to the last", got[:10], got[len(got)-10:])
	}
	if tail := c.Tail(2); tail != line[:1023]+"\nlast" {
		t.Errorf("Tail(2) = %q", tail)
	}
}

func status(t *testing.T, method, url string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func exists(t *testing.T, pool *pgxpool.Pool, table pgx.Identifier) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(t.Context(), `SELECT to_regclass($1) IS NOT NULL`, table.Sanitize()).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}
