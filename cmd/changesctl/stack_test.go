package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/provision"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/writer"
)

// testStack is one isolated pipeline on the local services, as the
// end-to-end tests build them: its own resource prefix, source database,
// PostgreSQL tables and S3 prefix.
type testStack struct {
	t       *testing.T
	prefix  string
	db      string // source database URL
	table   string // PostgreSQL data table of output "pg" (and "pgfifo": table_fifo)
	cfgPath string
	cfg     *config.File
	deps    *pipeline.Deps
	logs    *bytes.Buffer
}

// Outputs a test stack can have.
const (
	outPG     = "pg"     // postgres, standard queue
	outPGFIFO = "pgfifo" // postgres, FIFO queue (ordering per_document)
	outS3     = "s3"     // s3, standard queue
	outPGMap  = "pgmap"  // postgres in mapping mode: tables <table>_orders and <table>_items
	outHTTP   = "rest"   // http (FIFO queue) to a closed port
)

func newTestStack(t *testing.T, outputs ...string) *testStack {
	t.Helper()
	awsCfg := testenv.AWS(t)
	s := &testStack{t: t, prefix: testenv.Name(t), logs: &bytes.Buffer{}}
	if len(s.prefix) > 26 {
		s.prefix = s.prefix[len(s.prefix)-26:]
	}
	s.prefix = "c" + strings.Trim(s.prefix, "-")
	s.db = testenv.CouchDB(t)
	s.table = strings.ReplaceAll(s.prefix, "-", "_")
	defs := map[string]string{
		outPG:     fmt.Sprintf(`{"id":"pg","type":"postgres","max_receive_count":3,"postgres":{"dsn":{"env":"CHANGES_TEST_PG_DSN"},"table":%q,"create_tables":true}}`, s.table),
		outPGFIFO: fmt.Sprintf(`{"id":"pgfifo","type":"postgres","ordering":"per_document","max_receive_count":3,"postgres":{"dsn":{"env":"CHANGES_TEST_PG_DSN"},"table":"%s_fifo","create_tables":true}}`, s.table),
		outS3:     fmt.Sprintf(`{"id":"s3","type":"s3","max_receive_count":3,"s3":{"prefix":"%s/"}}`, s.prefix),
		outPGMap: fmt.Sprintf(`{"id":"pgmap","type":"postgres","max_receive_count":3,"postgres":{"dsn":{"env":"CHANGES_TEST_PG_DSN"},"table":"%[1]s_map","create_tables":true,
			"mapping":{"tables":[{"name":"%[1]s_orders","columns":[{"name":"n","path":"n","type":"integer"},{"name":"total","path":"total","type":"numeric"}]},
			{"name":"%[1]s_items","parent":"%[1]s_orders","from":"items","columns":[{"name":"sku","path":"sku","type":"text"}]}]}}}`, s.table),
		outHTTP: `{"id":"rest","type":"http","max_receive_count":3,"http":{"url":"http://127.0.0.1:9/docs/{doc_id}"}}`,
	}
	var outs []string
	for _, o := range outputs {
		outs = append(outs, defs[o])
	}
	doc := fmt.Sprintf(`{
		"stack": {"prefix": %q, "bucket": "changes-worker-tests", "poller_timeout": "15s", "writer_timeout": "10s"},
		"jobs": [{"id": "orders", "source": {"type": "couchdb", "url": %q},
			"feed": {"limit": 100, "timeout": "2s"}, "lease": {"ttl": "6s"},
			"outputs": [%s]}]}`, s.prefix, s.db, strings.Join(outs, ","))
	s.cfgPath = filepath.Join(t.TempDir(), "jobs.json")
	if err := os.WriteFile(s.cfgPath, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	var err error
	if s.cfg, err = config.Load(s.cfgPath); err != nil {
		t.Fatalf("load test config: %v", err)
	}
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: s.logs}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s.deps = pipeline.New(s.cfg, awsCfg, lookupEnv, log, io.Discard)
	t.Cleanup(s.deps.Close)
	if _, err := provision.Apply(t.Context(), provision.Clients{DynamoDB: s.deps.DynamoDB, SQS: s.deps.SQS, S3: s.deps.S3}, s.cfg); err != nil {
		t.Fatalf("provision: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pipeline log:\n%s", s.logs.String())
		}
	})
	return s
}

// lookupEnv is the environment of the stack: the test database's DSN
// always resolves.
func lookupEnv(k string) (string, bool) {
	if k == "CHANGES_TEST_PG_DSN" {
		if v := os.Getenv(k); v != "" {
			return v, true
		}
		return testenv.DefaultPostgresDSN, true
	}
	return os.LookupEnv(k)
}

// cli runs changesctl in this process with the stack's configuration
// appended to args, stdin as its input, and returns what it printed.
func (s *testStack) cli(ctx context.Context, stdin string, args ...string) (stdout, stderr string, err error) {
	var out, errb bytes.Buffer
	env := &cliEnv{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errb, lookup: lookupEnv}
	args = append(append([]string{}, args...), "--config", s.cfgPath)
	err = realMain(ctx, env, args)
	return out.String(), errb.String(), err
}

// mustCLI is cli that fails the test on an error.
func (s *testStack) mustCLI(ctx context.Context, args ...string) string {
	s.t.Helper()
	out, errOut, err := s.cli(ctx, "", args...)
	if err != nil {
		s.t.Fatalf("changesctl %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// queues resolves an output's queues.
func (s *testStack) queues(output string) dlq.Queues {
	s.t.Helper()
	j := s.cfg.Jobs[0]
	for _, o := range j.Outputs {
		if o.ID == output {
			q, err := dlq.Resolve(s.t.Context(), s.deps.SQS, s.cfg, j, o)
			if err != nil {
				s.t.Fatal(err)
			}
			return q
		}
	}
	s.t.Fatalf("no output %s", output)
	return dlq.Queues{}
}

func (s *testStack) depth(url string) int {
	s.t.Helper()
	d, err := dlq.QueueDepth(s.t.Context(), s.deps.SQS, url)
	if err != nil {
		s.t.Fatal(err)
	}
	return d.Total()
}

// envelope builds a live change of the stack's job.
func envelope(output, docID, rev string, gen, counter int64) *change.Envelope {
	return &change.Envelope{
		V: change.EnvelopeVersion, Job: "orders", Output: output, DocID: docID, Rev: rev,
		Seq: json.RawMessage(strconv.FormatInt(counter, 10)), EnqueuedAt: time.Now().UTC(),
		Version: change.Version{Generation: gen, Counter: counter},
		Doc:     json.RawMessage(fmt.Sprintf(`{"_id":%q,"_rev":%q,"marker":"BODY-%s-%s"}`, docID, rev, docID, rev)),
	}
}

// enqueue sends changes to an output's work queue as the poller does.
func (s *testStack) enqueue(q dlq.Queues, envs ...*change.Envelope) {
	s.t.Helper()
	for i, e := range envs {
		body, err := json.Marshal(e)
		if err != nil {
			s.t.Fatal(err)
		}
		in := &sqs.SendMessageInput{QueueUrl: &q.WorkURL, MessageBody: aws.String(string(body))}
		if q.FIFO {
			in.MessageGroupId = aws.String(e.DocID)
			in.MessageDeduplicationId = aws.String(fmt.Sprintf("%s-%d-%d-%d", e.DocID, e.Generation, e.Counter, i))
		}
		if _, err := s.deps.SQS.SendMessage(s.t.Context(), in); err != nil {
			s.t.Fatalf("enqueue: %v", err)
		}
	}
}

// failingSink fails every change with one error.
type failingSink struct{ err error }

func (f failingSink) Apply(_ context.Context, changes []*change.Envelope) []error {
	errs := make([]error, len(changes))
	for i := range errs {
		errs[i] = f.err
	}
	return errs
}

// failThroughWriter hands every message of an output's work queue to the
// real writer (writer.Handler) with a sink that fails with err, as the
// local runtime does, so that the writer moves them to the DLQ with their
// reasons. It returns the number of messages handled.
func (s *testStack) failThroughWriter(q dlq.Queues, err error) int {
	s.t.Helper()
	ctx := s.t.Context()
	h := &writer.Handler{
		Config: s.cfg,
		Sinks:  func(context.Context, config.Route) (deliver.Sink, error) { return failingSink{err}, nil },
		SQS:    s.deps.SQS, S3: s.deps.S3, Log: s.deps.Log,
	}
	handled := 0
	for {
		out, rerr := s.deps.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: &q.WorkURL, MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		if rerr != nil {
			s.t.Fatal(rerr)
		}
		if len(out.Messages) == 0 {
			return handled
		}
		ev := events.SQSEvent{}
		for _, m := range out.Messages {
			ev.Records = append(ev.Records, events.SQSMessage{
				MessageId: aws.ToString(m.MessageId), ReceiptHandle: aws.ToString(m.ReceiptHandle), Body: aws.ToString(m.Body),
				Attributes: m.Attributes, EventSource: "aws:sqs", EventSourceARN: q.WorkARN,
			})
		}
		resp, herr := h.Handle(ctx, ev)
		if herr != nil {
			s.t.Fatalf("writer: %v", herr)
		}
		if len(resp.BatchItemFailures) > 0 {
			s.t.Fatalf("writer reported %d failures; a permanent error should go to the DLQ", len(resp.BatchItemFailures))
		}
		for _, m := range out.Messages {
			if _, err := s.deps.SQS.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: &q.WorkURL, ReceiptHandle: m.ReceiptHandle}); err != nil {
				s.t.Fatal(err)
			}
			handled++
		}
	}
}

// run runs the pipeline in this process until it is idle; writerOnly
// leaves the pollers out (the queues drain, the source is not read).
func (s *testStack) run(writerOnly bool) localrun.Summary {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.t.Context(), 3*time.Minute)
	defer cancel()
	rt := &localrun.Runtime{Deps: s.deps, Log: s.deps.Log, Opts: localrun.Options{UntilIdle: true, Tick: time.Second, NoPoller: writerOnly}}
	if err := rt.Run(ctx); err != nil {
		s.t.Fatalf("run until idle: %v", err)
	}
	// The writers' last long polls (1s) were cancelled on our side only: the
	// emulator still hands messages arriving meanwhile to those dead
	// receivers, hiding them for the visibility timeout. Let them expire.
	time.Sleep(1500 * time.Millisecond)
	return rt.Summary()
}

// pgRev returns the revision and version of a document in output pg's
// tables ("" when it has no data row).
func (s *testStack) pgRev(table, docID string) (rev string, v change.Version) {
	s.t.Helper()
	pool := testenv.Postgres(s.t)
	err := pool.QueryRow(s.t.Context(), `SELECT coalesce(d.rev, ''), v.generation, v.counter FROM `+pgx.Identifier{table + "_versions"}.Sanitize()+
		` v LEFT JOIN `+pgx.Identifier{table}.Sanitize()+` d USING (doc_id) WHERE v.doc_id = $1`, docID).Scan(&rev, &v.Generation, &v.Counter)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", v
	}
	if err != nil {
		s.t.Fatalf("read %s of %s: %v", table, docID, err)
	}
	return rev, v
}

// putDoc writes a document to the source and returns its new revision.
func (s *testStack) putDoc(id string, body map[string]any, rev string) string {
	s.t.Helper()
	if rev != "" {
		body["_rev"] = rev
	}
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(s.t.Context(), http.MethodPut, s.db+"/"+url.PathEscape(id), bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Rev string `json:"rev"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode >= 300 {
		s.t.Fatalf("put %s: status %d, %v", id, resp.StatusCode, err)
	}
	return r.Rev
}

// deleteDoc deletes a document in the source.
func (s *testStack) deleteDoc(id, rev string) {
	s.t.Helper()
	req, _ := http.NewRequestWithContext(s.t.Context(), http.MethodDelete, s.db+"/"+url.PathEscape(id)+"?rev="+url.QueryEscape(rev), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		s.t.Fatalf("delete %s: status %d", id, resp.StatusCode)
	}
}

// exitCode is the status main would exit with for err.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		return int(ee)
	}
	return 1
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// errPermanent is an output's permanent refusal of a change.
var errPermanent = &deliver.Error{Class: deliver.Permanent, Reason: "http_status", HTTPStatus: 422, Err: errors.New("rejected")}
