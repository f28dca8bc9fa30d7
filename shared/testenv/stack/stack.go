// Package stack builds one isolated pipeline on the local services, from a
// configuration given as a Go value: its resources provisioned as
// `changesctl bootstrap` provisions them (shared/provision), its source
// database, its PostgreSQL tables named after it, the pipeline's
// dependencies with their log captured, and a Close that removes everything
// it created. The CLI tests, the end-to-end and fault tests, the fault
// library (tests/faults) and the benchmarks (tests/bench) all build their
// pipelines with it.
//
// It is a plain package, not a test file, so that programs can import it; it
// is separate from testenv because packages whose own tests use testenv are
// among the pipeline's dependencies.
package stack

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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go"
	"github.com/jackc/pgx/v5"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/pgsink"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/provision"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/verify"
)

// Options shape a stack.
type Options struct {
	// Name labels the stack; testenv.UniqueName makes it unique. Default
	// "stack".
	Name string
	// Config is the configuration to provision; New works on a copy. What
	// it leaves empty the stack fills before applying the defaults:
	//   - stack.prefix: the stack's name, so that the state table, the
	//     queues and the bucket ("<name>-data") are its own;
	//   - a job's source URL: a database the stack creates on the source
	//     (SourceURL), of type couchdb;
	//   - a PostgreSQL output's DSN: testenv.DSNEnv; and in document mode
	//     its table: "<name>_<output id>" with '_' for '-'.
	// Close removes what the stack named, not what the configuration did.
	Config *config.File
	// LogLevel is the level of the captured pipeline log. Default info.
	LogLevel slog.Level
	// HTTPClient, when set, wraps the AWS SDK's HTTP client of the
	// pipeline (fault injection: lost answers, added latency).
	HTTPClient func(aws.HTTPClient) aws.HTTPClient
	// SourceBase, when set, is the base URL at which the jobs reach the
	// source in place of testenv.CouchBaseURL(): a proxy to it (fault
	// injection: slow answers). The stack still creates its database, and
	// SourceURL names it, on the source itself.
	SourceBase string
	// Secrets are environment variables that only this stack's pipeline
	// sees: a secret reference {"env": name} resolves here first, then with
	// testenv.Lookup. For credentials a test makes up.
	Secrets map[string]string
}

// Stack is one provisioned pipeline. Its fields are set by New; Close
// removes what New created.
type Stack struct {
	Name string
	// Config is the configuration as loaded from ConfigPath, which holds it
	// (for changesctl, in process or as a child process).
	Config     *config.File
	ConfigPath string
	// SourceURL is the database the stack created on the source for the
	// jobs that named none; empty when every job named its source.
	SourceURL string
	// Deps are the pipeline's dependencies, built as the functions build
	// them, resolving secrets with Options.Secrets and testenv.Lookup. Their log and metrics
	// go to Logs and Metrics.
	Deps *pipeline.Deps
	// Leases is the job items' store (lease and checkpoint).
	Leases *lease.Store

	dir       string
	hc        *http.Client
	logs      *Capture
	metrics   *Capture
	tables    []outputRef // PostgreSQL outputs whose tables the stack named
	ownPrefix bool        // the stack named the AWS resources
	ownBucket bool

	closeOnce sync.Once
	closeErr  error
}

type outputRef struct{ job, output string }

// New provisions a stack. On error, whatever it had created is removed.
func New(ctx context.Context, o Options) (*Stack, error) {
	if o.Config == nil {
		return nil, errors.New("new stack: no configuration")
	}
	if o.Name == "" {
		o.Name = "stack"
	}
	testenv.SetAWSEnv()
	s := &Stack{
		Name:    testenv.UniqueName(o.Name),
		hc:      &http.Client{Timeout: 2 * time.Minute, Transport: sourceTransport},
		logs:    &Capture{},
		metrics: &Capture{},
	}
	var err error
	if s.dir, err = os.MkdirTemp("", "stack-"+s.Name+"-"); err != nil {
		return nil, fmt.Errorf("new stack: %w", err)
	}
	if err := s.build(ctx, o); err != nil {
		if cerr := s.Close(ctx); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, err
	}
	return s, nil
}

func (s *Stack) build(ctx context.Context, o Options) error {
	f, err := copyConfig(o.Config)
	if err != nil {
		return err
	}
	if err := s.fill(ctx, f, o.SourceBase); err != nil {
		return err
	}
	doc, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode stack config: %w", err)
	}
	s.ConfigPath = filepath.Join(s.dir, "jobs.json")
	if err := os.WriteFile(s.ConfigPath, doc, 0o644); err != nil {
		return fmt.Errorf("write stack config: %w", err)
	}
	if s.Config, err = config.Load(s.ConfigPath); err != nil {
		return fmt.Errorf("load stack config: %w", err)
	}
	// The SDK's own lines go to the captured log too, not to the output.
	logger := slog.New(slog.NewTextHandler(s.logs, &slog.HandlerOptions{Level: o.LogLevel}))
	awsCfg, err := awsconf.Load(ctx, logger)
	if err != nil {
		return err
	}
	if o.HTTPClient != nil {
		awsCfg.HTTPClient = o.HTTPClient(awsCfg.HTTPClient)
	}
	lookup := func(k string) (string, bool) {
		if v, ok := o.Secrets[k]; ok {
			return v, true
		}
		return testenv.Lookup(k)
	}
	s.Deps = pipeline.New(s.Config, awsCfg, lookup, logger, s.metrics)
	s.Leases = lease.New(s.Deps.DynamoDB, s.Config.TableName())
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := provision.Apply(pctx, provision.Clients{DynamoDB: s.Deps.DynamoDB, SQS: s.Deps.SQS, S3: s.Deps.S3}, s.Config); err != nil {
		return fmt.Errorf("provision stack %s (start the local services with `make up`): %w", s.Name, err)
	}
	return nil
}

// copyConfig returns a deep copy of f, through its JSON form.
func copyConfig(f *config.File) (*config.File, error) {
	b, err := json.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("copy stack config: %w", err)
	}
	var c config.File
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("copy stack config: %w", err)
	}
	return &c, nil
}

// fill names what f leaves empty after the stack (see Options.Config) and
// creates the source database if a job needs it; the jobs reach it through
// base when set (see Options.SourceBase).
func (s *Stack) fill(ctx context.Context, f *config.File, base string) error {
	if f.Stack.Prefix == "" {
		f.Stack.Prefix = s.Name
		s.ownPrefix, s.ownBucket = true, f.Stack.Bucket == ""
	}
	ident := strings.ReplaceAll(s.Name, "-", "_")
	for _, j := range f.Jobs {
		if j == nil {
			continue // Validate reports it
		}
		if j.Source.URL == "" {
			if s.SourceURL == "" {
				db := testenv.CouchBaseURL() + "/" + s.Name
				if err := sample.CreateDB(ctx, s.hc, db); err != nil {
					return fmt.Errorf("create source database %s (start the local services with `make up`): %w", db, err)
				}
				s.SourceURL = db
			}
			j.Source.URL = s.SourceURL
			if base != "" {
				j.Source.URL = strings.TrimRight(base, "/") + "/" + s.Name
			}
			if j.Source.Type == "" {
				j.Source.Type = config.SourceCouchDB
			}
		}
		for _, o := range j.Outputs {
			if o == nil || o.Postgres == nil {
				continue
			}
			pg := o.Postgres
			if pg.DSN == (config.SecretRef{}) {
				pg.DSN.Env = testenv.DSNEnv
			}
			if pg.Table == "" && pg.Mapping == nil {
				pg.Table = ident + "_" + strings.ReplaceAll(o.ID, "-", "_")
				s.tables = append(s.tables, outputRef{job: j.ID, output: o.ID})
			}
		}
	}
	return nil
}

// ForTest provisions a stack for t, failing the test when a local service
// is not running or provisioning fails. When the test ends the stack is
// closed, and if it failed the end of the pipeline log is logged first.
func ForTest(t testing.TB, o Options) *Stack {
	t.Helper()
	testenv.AWS(t)
	testenv.CouchURL(t)
	testenv.PostgresDSN(t)
	if o.Name == "" {
		o.Name = t.Name()
	}
	ctx := t.Context()
	s, err := New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pipeline log (last 100 lines):\n%s", s.logs.Tail(100))
		}
		if err := s.Close(ctx); err != nil {
			t.Errorf("close stack: %v", err)
		}
	})
	return s
}

// Logs returns the pipeline's log (and the AWS SDK's) captured so far.
func (s *Stack) Logs() *Capture { return s.logs }

// Metrics returns the pipeline's metric records (EMF) captured so far.
func (s *Stack) Metrics() *Capture { return s.metrics }

// Output returns a job's output, or an error naming what is missing.
func (s *Stack) Output(job, output string) (*config.Job, *config.Output, error) {
	j := s.Config.Job(job)
	if j == nil {
		return nil, nil, fmt.Errorf("stack %s has no job %q", s.Name, job)
	}
	o := j.Output(output)
	if o == nil {
		return nil, nil, fmt.Errorf("job %s of stack %s has no output %q", job, s.Name, output)
	}
	return j, o, nil
}

// Queues resolves the work queue and DLQ of a job's output.
func (s *Stack) Queues(ctx context.Context, job, output string) (dlq.Queues, error) {
	j, o, err := s.Output(job, output)
	if err != nil {
		return dlq.Queues{}, err
	}
	return dlq.Resolve(ctx, s.Deps.SQS, s.Config, j, o)
}

// PostgresTables returns the tables of a job's PostgreSQL output, as the
// sink names them (pgsink.Tables).
func (s *Stack) PostgresTables(job, output string) (data, versions pgx.Identifier, err error) {
	_, o, err := s.Output(job, output)
	if err != nil {
		return nil, nil, err
	}
	if o.Postgres == nil {
		return nil, nil, fmt.Errorf("output %s of stack %s is not a postgres output", output, s.Name)
	}
	return pgsink.Tables(*o.Postgres, o.ID)
}

// State opens the state reader of a job's output: what the output holds,
// as its sink reports it (pipeline.Deps.State). An http output has none
// (*pipeline.NoStateError).
func (s *Stack) State(ctx context.Context, job, output string) (verify.Output, error) {
	_, o, err := s.Output(job, output)
	if err != nil {
		return nil, err
	}
	return s.Deps.State(ctx, o)
}

// Revs returns doc id → revision of every document a job's output holds a
// copy of (deliver.Stored.Held), as its state reader scans the output.
func (s *Stack) Revs(ctx context.Context, job, output string) (map[string]string, error) {
	st, err := s.State(ctx, job, output)
	if err != nil {
		return nil, err
	}
	revs := map[string]string{}
	err = st.Scan(ctx, func(d deliver.Stored) error {
		if d.Held {
			revs[d.ID] = d.Rev
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read output %s of job %s: %w", output, job, err)
	}
	return revs, nil
}

// bodyReader is the state reader of an output that stores documents whole
// (pgsink.State in document mode, s3sink.State).
type bodyReader interface {
	Body(ctx context.Context, docID string) (json.RawMessage, bool, error)
}

// Body returns the body a job's output stores for a document, as its state
// reader reads it, and false when it stores none.
func (s *Stack) Body(ctx context.Context, job, output, docID string) (json.RawMessage, bool, error) {
	st, err := s.State(ctx, job, output)
	if err != nil {
		return nil, false, err
	}
	r, ok := st.(bodyReader)
	if !ok {
		return nil, false, fmt.Errorf("output %s of job %s: its state reader reads no bodies", output, job)
	}
	return r.Body(ctx, docID)
}

// RunUntilIdle hosts the stack's pollers and writers in this process, as
// `changesctl run` does with opts (UntilIdle set, Tick 2s when zero), until
// every job is caught up and its queues are drained, for at most 4 minutes.
func (s *Stack) RunUntilIdle(ctx context.Context, opts localrun.Options) (localrun.Summary, error) {
	opts.UntilIdle = true
	if opts.Tick == 0 {
		opts.Tick = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	rt := &localrun.Runtime{Deps: s.Deps, Opts: opts, Log: s.Deps.Log}
	if err := rt.Run(ctx); err != nil {
		return rt.Summary(), fmt.Errorf("run stack %s until idle: %w", s.Name, err)
	}
	return rt.Summary(), nil
}

// RunInBackground hosts the stack's pollers and writers in this process, as
// `changesctl run` does with opts, until stop is called (or the test ends);
// the test fails if the run ends with an error before that. rt gives the
// run's counters.
func (s *Stack) RunInBackground(t testing.TB, opts localrun.Options) (rt *localrun.Runtime, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rt = &localrun.Runtime{Deps: s.Deps, Opts: opts, Log: s.Deps.Log}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := rt.Run(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("run stack %s: %v", s.Name, err)
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return rt, stop
}

// SourceWinners returns doc id → winning revision of every live document in
// the source database the stack created.
func (s *Stack) SourceWinners(ctx context.Context) (map[string]string, error) {
	var all testenv.AllDocs
	if err := s.source(ctx, http.MethodGet, "/_all_docs", nil, &all); err != nil {
		return nil, fmt.Errorf("read source: %w", err)
	}
	return all.Winners(), nil
}

// UpdateSeq returns the update_seq of the source database the stack
// created, as the source gives it.
func (s *Stack) UpdateSeq(ctx context.Context) (json.RawMessage, error) {
	var info struct {
		UpdateSeq json.RawMessage `json:"update_seq"`
	}
	if err := s.source(ctx, http.MethodGet, "", nil, &info); err != nil {
		return nil, fmt.Errorf("read source database: %w", err)
	}
	return info.UpdateSeq, nil
}

// PutDoc writes a document to the source database the stack created and
// returns its new revision. To update a document, give its current revision
// as body's "_rev".
func (s *Stack) PutDoc(ctx context.Context, id string, body any) (string, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return "", fmt.Errorf("put %s: %w", id, err)
	}
	var res struct {
		Rev string `json:"rev"`
	}
	if err := s.source(ctx, http.MethodPut, "/"+url.PathEscape(id), b, &res); err != nil {
		return "", fmt.Errorf("put %s: %w", id, err)
	}
	return res.Rev, nil
}

// DeleteDoc deletes revision rev of a document in the source database the
// stack created.
func (s *Stack) DeleteDoc(ctx context.Context, id, rev string) error {
	if err := s.source(ctx, http.MethodDelete, "/"+url.PathEscape(id)+"?rev="+url.QueryEscape(rev), nil, nil); err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	return nil
}

// sourceTransport closes a connection to the source once it has been idle
// for 4 s, before pouchdb-server (Node.js, whose keep-alive timeout is 5 s)
// closes it: a request sent on a connection the server is closing at that
// moment meets a reset, and Go does not send a PUT again by itself.
var sourceTransport = func() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.IdleConnTimeout = 4 * time.Second
	return t
}()

// source sends a request to the source database the stack created, with
// body as JSON when not nil, and decodes a 2xx answer into out when not nil.
func (s *Stack) source(ctx context.Context, method, path string, body []byte, out any) error {
	if s.SourceURL == "" {
		return fmt.Errorf("stack %s created no source database", s.Name)
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.SourceURL+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	return nil
}

// Close removes what the stack created or named: the PostgreSQL tables it
// named, the source database it created and, when it named the stack
// prefix, the queues, the state table and (unless the configuration named
// one) the bucket with its objects; and it closes the pipeline's pools. It keeps ctx's values but not its cancellation, so it also cleans up
// after a cancelled run. It returns every failure. Calls after the first do
// nothing and return the first one's result.
func (s *Stack) Close(ctx context.Context) error {
	s.closeOnce.Do(func() { s.closeErr = s.close(ctx) })
	return s.closeErr
}

func (s *Stack) close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	var errs []error
	if s.Deps != nil {
		errs = append(errs, s.dropTables(ctx))
		s.Deps.Close()
		if s.ownPrefix {
			errs = append(errs, s.deleteAWS(ctx))
		}
	}
	if s.SourceURL != "" {
		errs = append(errs, sample.DeleteDB(ctx, s.hc, s.SourceURL))
	}
	errs = append(errs, os.RemoveAll(s.dir))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close stack %s: %w", s.Name, err)
	}
	return nil
}

func (s *Stack) dropTables(ctx context.Context) error {
	var errs []error
	for _, t := range s.tables {
		_, o, err := s.Output(t.job, t.output)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		pool, err := s.Deps.Pool(ctx, o.Postgres)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		data, versions, err := pgsink.Tables(*o.Postgres, o.ID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, name := range []pgx.Identifier{data, versions} {
			if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS `+name.Sanitize()+` CASCADE`); err != nil {
				errs = append(errs, fmt.Errorf("drop table %s: %w", name.Sanitize(), err))
			}
		}
	}
	return errors.Join(errs...)
}

func (s *Stack) deleteAWS(ctx context.Context) error {
	var errs []error
	for _, j := range s.Config.Jobs {
		for _, o := range j.Outputs {
			for _, name := range []string{s.Config.QueueName(j, o), s.Config.DLQName(j, o)} {
				u, err := s.Deps.SQS.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
				if err != nil {
					continue // never created
				}
				if _, err := s.Deps.SQS.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: u.QueueUrl}); err != nil {
					errs = append(errs, fmt.Errorf("delete queue %s: %w", name, err))
				}
			}
		}
	}
	table := s.Config.TableName()
	if _, err := s.Deps.DynamoDB.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: &table}); err != nil && !notFound(err) {
		errs = append(errs, fmt.Errorf("delete table %s: %w", table, err))
	}
	if s.ownBucket {
		errs = append(errs, s.deleteBucket(ctx, s.Config.Stack.Bucket))
	}
	return errors.Join(errs...)
}

// deleteBucket deletes every object of bucket, then the bucket.
func (s *Stack) deleteBucket(ctx context.Context, bucket string) error {
	p := s3.NewListObjectsV2Paginator(s.Deps.S3, &s3.ListObjectsV2Input{Bucket: &bucket})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			if notFound(err) {
				return nil
			}
			return fmt.Errorf("list bucket %s: %w", bucket, err)
		}
		if len(page.Contents) == 0 {
			continue
		}
		ids := make([]s3types.ObjectIdentifier, len(page.Contents))
		for i, o := range page.Contents {
			ids[i] = s3types.ObjectIdentifier{Key: o.Key}
		}
		out, err := s.Deps.S3.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: &bucket, Delete: &s3types.Delete{Objects: ids, Quiet: aws.Bool(true)}})
		if err != nil {
			return fmt.Errorf("empty bucket %s: %w", bucket, err)
		}
		if len(out.Errors) > 0 {
			return fmt.Errorf("empty bucket %s: %d objects not deleted, e.g. %s: %s", bucket, len(out.Errors), aws.ToString(out.Errors[0].Key), aws.ToString(out.Errors[0].Message))
		}
	}
	if _, err := s.Deps.S3.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: &bucket}); err != nil && !notFound(err) {
		return fmt.Errorf("delete bucket %s: %w", bucket, err)
	}
	return nil
}

// notFound reports whether err is an AWS answer that the resource does not
// exist.
func notFound(err error) bool {
	var api smithy.APIError
	if !errors.As(err, &api) {
		return false
	}
	switch api.ErrorCode() {
	case "ResourceNotFoundException", "NoSuchBucket":
		return true
	}
	return false
}

// PostgresJob is the configuration of a test pipeline with one job, id,
// reading src with feed f into one PostgreSQL output "pg" that creates its
// tables: a lease TTL of 10s, a poller timeout of 20s and a writer timeout
// of 10s.
func PostgresJob(id string, src config.Source, f config.Feed) *config.File {
	return &config.File{
		Stack: config.Stack{PollerTimeout: config.Duration(20 * time.Second), WriterTimeout: config.Duration(10 * time.Second)},
		Jobs: []*config.Job{{
			ID:     id,
			Source: src,
			Feed:   f,
			Lease:  config.Lease{TTL: config.Duration(10 * time.Second)},
			Outputs: []*config.Output{{ID: "pg", Type: config.OutputPostgres, MaxReceiveCount: 4,
				Postgres: &config.PostgresOutput{CreateTables: true}}},
		}},
	}
}
