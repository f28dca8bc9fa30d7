package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
	"github.com/changes-worker/changes-worker/shared/writer"
)

// testStack is one isolated pipeline on the local services (stack.ForTest)
// with one job, "orders", and the outputs a test asks for.
type testStack struct {
	*stack.Stack
	t *testing.T
	// mapTable starts the names of the outPGMap output's mapped tables:
	// <mapTable>_orders and <mapTable>_items.
	mapTable string
}

// Outputs a test stack can have.
const (
	outPG      = "pg"      // postgres, standard queue
	outPGFIFO  = "pgfifo"  // postgres, FIFO queue (ordering per_document)
	outPGTotal = "pgtotal" // postgres, FIFO queue (ordering total)
	outS3      = "s3"      // s3, standard queue
	outPGMap   = "pgmap"   // postgres in mapping mode: tables <table>_orders and <table>_items
	outHTTP    = "rest"    // http (FIFO queue) to a closed port
)

func newTestStack(t *testing.T, outputs ...string) *testStack {
	t.Helper()
	defs := map[string]*config.Output{
		outPG:      {ID: outPG, Type: config.OutputPostgres, Postgres: &config.PostgresOutput{CreateTables: true}},
		outPGFIFO:  {ID: outPGFIFO, Type: config.OutputPostgres, Ordering: config.OrderingPerDocument, Postgres: &config.PostgresOutput{CreateTables: true}},
		outPGTotal: {ID: outPGTotal, Type: config.OutputPostgres, Ordering: config.OrderingTotal, Postgres: &config.PostgresOutput{CreateTables: true}},
		outS3:      {ID: outS3, Type: config.OutputS3, S3: &config.S3Output{Prefix: "docs/"}},
		outHTTP:    {ID: outHTTP, Type: config.OutputHTTP, HTTP: &config.HTTPOutput{URL: "http://127.0.0.1:9/docs/{doc_id}"}},
	}
	// The mapped tables are named by the mapping, not by the stack: give
	// them a name of this test's own.
	mapTable := strings.ReplaceAll(testenv.Name(t), "-", "_")
	defs[outPGMap] = &config.Output{ID: outPGMap, Type: config.OutputPostgres, Postgres: &config.PostgresOutput{Table: mapTable + "_map", CreateTables: true, Mapping: mustMapping(t, mapTable)}}
	job := &config.Job{ID: "orders", Feed: config.Feed{Limit: 100, Timeout: config.Duration(2 * time.Second)}, Lease: config.Lease{TTL: config.Duration(6 * time.Second)}}
	for _, o := range outputs {
		out := defs[o]
		out.MaxReceiveCount = 3
		job.Outputs = append(job.Outputs, out)
	}
	cfg := &config.File{
		Stack: config.Stack{PollerTimeout: config.Duration(15 * time.Second), WriterTimeout: config.Duration(10 * time.Second)},
		Jobs:  []*config.Job{job},
	}
	return &testStack{Stack: stack.ForTest(t, stack.Options{Config: cfg}), t: t, mapTable: mapTable}
}

// parallelStack marks the test parallel and gives it a test stack with
// these outputs, and the test's context.
func parallelStack(t *testing.T, outputs ...string) (context.Context, *testStack) {
	t.Helper()
	t.Parallel()
	return t.Context(), newTestStack(t, outputs...)
}

// cli runs changesctl in this process with the stack's configuration
// appended to args, stdin as its input, and returns what it printed.
func (s *testStack) cli(ctx context.Context, stdin string, args ...string) (stdout, stderr string, err error) {
	var out, errb bytes.Buffer
	env := &cliEnv{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errb, lookup: testenv.Lookup}
	args = append(append([]string{}, args...), "--config", s.ConfigPath)
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
	q, err := s.Queues(s.t.Context(), "orders", output)
	if err != nil {
		s.t.Fatal(err)
	}
	return q
}

func (s *testStack) depth(url string) int {
	s.t.Helper()
	d, err := dlq.QueueDepth(s.t.Context(), s.Deps.SQS, url)
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
		if _, err := s.Deps.SQS.SendMessage(s.t.Context(), in); err != nil {
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
		Config: s.Config,
		Sinks:  func(context.Context, config.Route) (deliver.Sink, error) { return failingSink{err}, nil },
		SQS:    s.Deps.SQS, S3: s.Deps.S3, Log: s.Deps.Log,
	}
	handled := 0
	for {
		out, rerr := s.Deps.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
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
			if _, err := s.Deps.SQS.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: &q.WorkURL, ReceiptHandle: m.ReceiptHandle}); err != nil {
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
	rt := &localrun.Runtime{Deps: s.Deps, Log: s.Deps.Log, Opts: localrun.Options{UntilIdle: true, Tick: time.Second, NoPoller: writerOnly}}
	if err := rt.Run(ctx); err != nil {
		s.t.Fatalf("run until idle: %v", err)
	}
	// The writers' last long polls (1s) were cancelled on our side only: the
	// emulator still hands messages arriving meanwhile to those dead
	// receivers, hiding them for the visibility timeout. Let them expire.
	time.Sleep(1500 * time.Millisecond)
	return rt.Summary()
}

// runInBackground runs the pipeline in this process until the test ends,
// failing the test if it stops with an error before that.
func (s *testStack) runInBackground() {
	ctx, cancel := context.WithCancel(s.t.Context())
	rt := &localrun.Runtime{Deps: s.Deps, Log: s.Deps.Log, Opts: localrun.Options{Tick: time.Second}}
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	s.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			s.t.Errorf("run: %v", err)
		}
	})
}

// pgTables returns the data and versions tables of a PostgreSQL output,
// quoted.
func (s *testStack) pgTables(output string) (data, versions string) {
	s.t.Helper()
	d, v, err := s.PostgresTables("orders", output)
	if err != nil {
		s.t.Fatal(err)
	}
	return d.Sanitize(), v.Sanitize()
}

// pgRev returns the revision and version of a document in a PostgreSQL
// output's tables ("" when it has no data row).
func (s *testStack) pgRev(output, docID string) (rev string, v change.Version) {
	s.t.Helper()
	data, versions := s.pgTables(output)
	pool := testenv.Postgres(s.t)
	err := pool.QueryRow(s.t.Context(), `SELECT coalesce(d.rev, ''), v.generation, v.counter FROM `+versions+
		` v LEFT JOIN `+data+` d USING (doc_id) WHERE v.doc_id = $1`, docID).Scan(&rev, &v.Generation, &v.Counter)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", v
	}
	if err != nil {
		s.t.Fatalf("read %s of %s: %v", output, docID, err)
	}
	return rev, v
}

// putDoc writes a document to the source and returns its new revision.
func (s *testStack) putDoc(id string, body map[string]any, rev string) string {
	s.t.Helper()
	if rev != "" {
		body["_rev"] = rev
	}
	rev, err := s.PutDoc(s.t.Context(), id, body)
	if err != nil {
		s.t.Fatal(err)
	}
	return rev
}

// deleteDoc deletes a document in the source.
func (s *testStack) deleteDoc(id, rev string) {
	s.t.Helper()
	if err := s.DeleteDoc(s.t.Context(), id, rev); err != nil {
		s.t.Fatal(err)
	}
}

// tempFile writes content to a file named name in a new temporary
// directory of the test and returns its path.
func tempFile(t *testing.T, name string, content []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, content, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeS3Config writes a configuration with one job, "j", whose one output
// is S3 ("files"), under stack prefix and bucket (none when bucket is
// empty), and returns its path.
func writeS3Config(t *testing.T, prefix, bucket string) string {
	t.Helper()
	b := ""
	if bucket != "" {
		b = fmt.Sprintf(`, "bucket": %q`, bucket)
	}
	return tempFile(t, "jobs.json", fmt.Appendf(nil, `{"stack": {"prefix": %q%s}, "jobs": [{"id": "j", "source": {"type": "couchdb", "url": "http://127.0.0.1:5984/x"},
		"outputs": [{"id": "files", "type": "s3", "s3": {"prefix": "docs/"}}]}]}`, prefix, b))
}

// exitCode is the status main would exit with for err.
func exitCode(err error) int { return exitStatus(err, io.Discard) }

// errPermanent is an output's permanent refusal of a change.
var errPermanent = &deliver.Error{Class: deliver.Permanent, Reason: "http_status", HTTPStatus: 422, Err: errors.New("rejected")}

// mustMapping is the outPGMap output's mapping: an orders table and its
// items, named after table.
func mustMapping(t *testing.T, table string) *config.Mapping {
	t.Helper()
	var m config.Mapping
	doc := fmt.Sprintf(`{"tables":[{"name":"%[1]s_orders","columns":[{"name":"n","path":"n","type":"integer"},{"name":"total","path":"total","type":"numeric"}]},
		{"name":"%[1]s_items","parent":"%[1]s_orders","from":"items","columns":[{"name":"sku","path":"sku","type":"text"}]}]}`, table)
	if err := json.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatalf("mapping: %v", err)
	}
	return &m
}
