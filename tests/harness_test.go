// Package tests holds the end-to-end and fault tests: the real poller and
// writer code against the local AWS emulator, the CouchDB-compatible source
// and PostgreSQL, started by `make up`.
package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/lease"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/provision"
	"github.com/changes-worker/changes-worker/shared/receiver"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// stack is one isolated pipeline: its own resource prefix, source database,
// PostgreSQL table, bucket prefix and HTTP receiver.
type sqsMessage = sqstypes.Message

type stack struct {
	t       *testing.T
	prefix  string
	db      string // source database URL
	table   string
	recv    *receiver.Server
	recvURL string
	cfgPath string
	cfg     *config.File
	deps    *pipeline.Deps
	store   *lease.Store
	logs    *strings.Builder
}

type stackOptions struct {
	limit      int
	fetch      string
	ttl        string
	sourceURL  string // overrides the created database (fault tests)
	maxReceive int
	outputs    []string // subset of pg, rest, archive; default all
	// httpClient, when set, wraps the AWS SDK's HTTP client (fault injection).
	httpClient func(aws.HTTPClient) aws.HTTPClient
}

func newStack(t *testing.T, o stackOptions) *stack {
	t.Helper()
	awsCfg := testenv.AWS(t)
	if o.httpClient != nil {
		awsCfg.HTTPClient = o.httpClient(awsCfg.HTTPClient)
	}
	s := &stack{t: t, prefix: testenv.Name(t), logs: &strings.Builder{}}
	if len(s.prefix) > 28 {
		s.prefix = s.prefix[len(s.prefix)-28:]
	}
	s.prefix = "e" + strings.TrimLeft(s.prefix, "-")
	s.db = testenv.CouchDB(t)
	if o.sourceURL != "" {
		s.db = o.sourceURL
	}
	s.table = strings.ReplaceAll(s.prefix, "-", "_")
	var err error
	if s.recv, err = receiver.New(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.recv)
	t.Cleanup(srv.Close)
	s.recvURL = srv.URL
	if o.limit == 0 {
		o.limit = 200
	}
	if o.fetch == "" {
		o.fetch = "include_docs"
	}
	if o.ttl == "" {
		o.ttl = "10s"
	}
	if o.maxReceive == 0 {
		o.maxReceive = 4
	}
	if o.outputs == nil {
		o.outputs = []string{"pg", "rest", "archive"}
	}
	outs := map[string]string{
		"pg":      fmt.Sprintf(`{"id":"pg","type":"postgres","max_receive_count":%d,"postgres":{"dsn":{"env":"CHANGES_TEST_PG_DSN"},"table":%q,"create_tables":true}}`, o.maxReceive, s.table),
		"rest":    fmt.Sprintf(`{"id":"rest","type":"http","max_receive_count":%d,"http":{"url":"%s/docs/{doc_id}","timeout":"5s"}}`, o.maxReceive, s.recvURL),
		"archive": fmt.Sprintf(`{"id":"archive","type":"s3","max_receive_count":%d,"s3":{"prefix":"%s/"}}`, o.maxReceive, s.prefix),
	}
	var selected []string
	for _, id := range o.outputs {
		selected = append(selected, outs[id])
	}
	doc := fmt.Sprintf(`{
		"stack": {"prefix": %q, "bucket": "changes-worker-tests", "poller_timeout": "20s", "writer_timeout": "10s"},
		"jobs": [{"id": "orders", "source": {"type": "couchdb", "url": %q},
			"feed": {"limit": %d, "timeout": "2s", "fetch": %q}, "lease": {"ttl": %q},
			"outputs": [%s]}]}`, s.prefix, s.db, o.limit, o.fetch, o.ttl, strings.Join(selected, ","))
	s.cfgPath = filepath.Join(t.TempDir(), "jobs.json")
	if err := os.WriteFile(s.cfgPath, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if s.cfg, err = config.Load(s.cfgPath); err != nil {
		t.Fatalf("load test config: %v", err)
	}
	log := slog.New(slog.NewTextHandler(&syncWriter{b: s.logs}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s.deps = pipeline.New(s.cfg, awsCfg, lookupEnv, log, io.Discard)
	t.Cleanup(s.deps.Close)
	if _, err := provision.Apply(context.Background(), provision.Clients{DynamoDB: s.deps.DynamoDB, SQS: s.deps.SQS, S3: s.deps.S3}, s.cfg); err != nil {
		t.Fatalf("provision: %v", err)
	}
	s.store = lease.New(s.deps.DynamoDB, s.cfg.TableName())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pipeline log:\n%s", tail(s.logs.String(), 60))
		}
	})
	return s
}

func lookupEnv(k string) (string, bool) {
	if k == "CHANGES_TEST_PG_DSN" {
		if v := os.Getenv(k); v != "" {
			return v, true
		}
		return testenv.DefaultPostgresDSN, true
	}
	return os.LookupEnv(k)
}

// runUntilIdle runs pollers and writers in this process until idle.
func (s *stack) runUntilIdle(ctx context.Context, opts localrun.Options) localrun.Summary {
	s.t.Helper()
	opts.UntilIdle = true
	if opts.Tick == 0 {
		opts.Tick = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	rt := &localrun.Runtime{Deps: s.deps, Opts: opts, Log: s.deps.Log}
	if err := rt.Run(ctx); err != nil {
		s.t.Fatalf("run until idle: %v", err)
	}
	return rt.Summary()
}

// pgState returns doc id → rev of the rows in the output table.
func (s *stack) pgState(ctx context.Context) map[string]string {
	s.t.Helper()
	pool := testenv.Postgres(s.t)
	rows, err := pool.Query(ctx, "SELECT doc_id, rev FROM "+pgx.Identifier{s.table}.Sanitize())
	if err != nil {
		s.t.Fatalf("read output table: %v", err)
	}
	got := map[string]string{}
	for rows.Next() {
		var id, rev string
		if err := rows.Scan(&id, &rev); err != nil {
			s.t.Fatal(err)
		}
		got[id] = rev
	}
	if err := rows.Err(); err != nil {
		s.t.Fatal(err)
	}
	return got
}

// s3State returns doc id → rev of the objects under the output's prefix, from
// the object metadata.
func (s *stack) s3State(ctx context.Context) map[string]string {
	s.t.Helper()
	c := s3.NewFromConfig(s.deps.AWS, awsconf.S3Options)
	got := map[string]string{}
	p := s3.NewListObjectsV2Paginator(c, &s3.ListObjectsV2Input{Bucket: aws.String(s.cfg.Stack.Bucket), Prefix: aws.String(s.prefix + "/")})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			s.t.Fatalf("list output objects: %v", err)
		}
		for _, o := range page.Contents {
			h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.cfg.Stack.Bucket), Key: o.Key})
			if err != nil {
				s.t.Fatalf("head %s: %v", aws.ToString(o.Key), err)
			}
			if strings.Contains(aws.ToString(o.Key), "_tombstones/") {
				continue
			}
			var body map[string]any
			g, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.cfg.Stack.Bucket), Key: o.Key})
			if err != nil {
				s.t.Fatal(err)
			}
			err = json.NewDecoder(g.Body).Decode(&body)
			g.Body.Close()
			if err != nil {
				s.t.Fatalf("decode %s: %v", aws.ToString(o.Key), err)
			}
			id, _ := body["_id"].(string)
			got[id] = h.Metadata["rev"]
		}
	}
	return got
}

// sourceState returns doc id → winning rev of every live document in the source.
func sourceState(t *testing.T, db string) map[string]string {
	t.Helper()
	resp, err := http.Get(db + "/_all_docs")
	if err != nil {
		t.Fatalf("read source: %v", err)
	}
	defer resp.Body.Close()
	var all struct {
		Rows []struct {
			ID    string `json:"id"`
			Value struct {
				Rev string `json:"rev"`
			} `json:"value"`
		} `json:"rows"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&all); err != nil {
		t.Fatalf("decode _all_docs: %v", err)
	}
	got := map[string]string{}
	for _, r := range all.Rows {
		got[r.ID] = r.Value.Rev
	}
	return got
}

// httpState returns doc id → rev of the documents the receiver holds.
func (s *stack) httpState() map[string]string {
	s.t.Helper()
	got := map[string]string{}
	entries, err := os.ReadDir(s.recv.Dir)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(s.recv.Dir, e.Name()))
		if err != nil {
			s.t.Fatal(err)
		}
		var d struct {
			ID  string `json:"_id"`
			Rev string `json:"_rev"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			s.t.Fatalf("decode %s: %v", e.Name(), err)
		}
		got[d.ID] = d.Rev
	}
	return got
}

type syncWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
