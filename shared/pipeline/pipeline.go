// Package pipeline wires the poller and the writer from a configuration file
// and an AWS configuration. The Lambda mains and the local runtime both call
// it, so they run the same code with the same contracts.
package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	lambdatypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/attach"
	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/pgsink"
	"github.com/changes-worker/changes-worker/shared/docid"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/metrics"
	"github.com/changes-worker/changes-worker/shared/poll"
	"github.com/changes-worker/changes-worker/shared/secret"
	"github.com/changes-worker/changes-worker/shared/statetable/halt"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/statetable/outage"
	"github.com/changes-worker/changes-worker/shared/statetable/quarantine"
	"github.com/changes-worker/changes-worker/shared/writer"
)

// Deps are the process-wide dependencies, built once (at cold start).
type Deps struct {
	Config  *config.File
	AWS     aws.Config
	Log     *slog.Logger
	Metrics io.Writer // EMF destination, standard output in Lambda
	Secrets *secret.Resolver

	DynamoDB *dynamodb.Client
	SQS      *sqs.Client
	S3       *s3.Client
	// Lambda and Function are set in a Lambda function: its client and
	// the function's name, with which the writer turns its event source
	// mappings off and on (writer.Mappings).
	Lambda   *lambda.Client
	Function string

	// Now is the clock of the poller and its lease decisions; fault tests
	// skew it. Zero: the system clock.
	Now clock.Clock
	// OnBatch, when set, is told after every batch of a HandleSchedule
	// poller whether its job is caught up (the local runtime's
	// --until-idle). Set it before the first invocation.
	OnBatch func(job string, caughtUp bool)

	mu    sync.Mutex
	pools map[string]*pgxpool.Pool // by connection string and CA
	// keys: the pool key each DSN reference (with its CA) last resolved to.
	keys    map[poolRef]string
	pollers map[string]*poll.Poller
	dlqURLs map[string]string // by queue name
}

// poolRef is a DSN reference with the CA it is used with.
type poolRef struct {
	dsn config.SecretRef
	ca  string
}

// Lookup reads the process environment; tests pass a map instead.
type Lookup func(string) (string, bool)

// Environment variables the functions read.
const (
	EnvConfigFile = "CHANGES_CONFIG_FILE"
	// EnvConfig holds the configuration itself, when no file is named:
	// the stack gives each job's functions their job's configuration so.
	EnvConfig          = "CHANGES_CONFIG"
	EnvBucket          = "CHANGES_BUCKET"
	EnvEnvSecretPrefix = "CHANGES_ENV_SECRET_PREFIX"
	// EnvTaskRoot is where Lambda unpacked the function's code (/var/task
	// on AWS); a relative CHANGES_CONFIG_FILE is taken from there.
	EnvTaskRoot = "LAMBDA_TASK_ROOT"
	// EnvFunctionName is the function's name, which Lambda sets.
	EnvFunctionName = "AWS_LAMBDA_FUNCTION_NAME"
)

// LoadConfig reads the configuration named by CHANGES_CONFIG_FILE or, when
// that is unset, the one CHANGES_CONFIG holds, else the file jobs.json, and
// applies CHANGES_BUCKET. A relative path is taken from LAMBDA_TASK_ROOT
// when that is set, else from the working directory.
func LoadConfig(lookup Lookup) (*config.File, error) {
	f, err := readConfig(lookup)
	if err != nil {
		return nil, err
	}
	if b, ok := lookup(EnvBucket); ok && b != "" {
		OverrideBucket(f, b)
	}
	return f, nil
}

func readConfig(lookup Lookup) (*config.File, error) {
	path, ok := lookup(EnvConfigFile)
	if !ok || path == "" {
		if doc, ok := lookup(EnvConfig); ok && doc != "" {
			f, err := config.Parse([]byte(doc))
			if err != nil {
				return nil, fmt.Errorf("config in %s: %w", EnvConfig, err)
			}
			return f, nil
		}
		path = "jobs.json"
	}
	if root, ok := lookup(EnvTaskRoot); ok && root != "" && !filepath.IsAbs(path) {
		path = filepath.Join(root, path)
	}
	return config.Load(path)
}

// OverrideBucket points the stack bucket, and every S3 output that used it,
// at bucket (the deployed stack's generated bucket name).
func OverrideBucket(f *config.File, bucket string) {
	old := f.Stack.Bucket
	f.Stack.Bucket = bucket
	for _, j := range f.Jobs {
		for _, o := range j.Outputs {
			if o.S3 != nil && o.S3.Bucket == old {
				o.S3.Bucket = bucket
			}
		}
	}
}

// New builds the shared dependencies. Its logger shows document ids as
// stack.doc_ids says (docid.Logger). In a Lambda function (the environment
// names it) they include the Lambda client.
func New(f *config.File, awsCfg aws.Config, lookup Lookup, log *slog.Logger, metricsOut io.Writer) *Deps {
	prefix, _ := lookup(EnvEnvSecretPrefix)
	fn, _ := lookup(EnvFunctionName)
	var lc *lambda.Client
	if fn != "" {
		lc = lambda.NewFromConfig(awsCfg)
	}
	return &Deps{
		Lambda:   lc,
		Function: fn,
		Config:   f,
		AWS:      awsCfg,
		Log:      docid.Logger(log, docid.Exposure(f.Stack.DocIDs)),
		Metrics:  metricsOut,
		Secrets:  &secret.Resolver{Lookup: lookup, SM: secretsmanager.NewFromConfig(awsCfg), EnvSecretPrefix: prefix},
		DynamoDB: dynamodb.NewFromConfig(awsCfg),
		SQS:      sqs.NewFromConfig(awsCfg),
		S3:       s3.NewFromConfig(awsCfg, awsconf.S3Options),
	}
}

// Poller builds the poller of one job.
func (d *Deps) Poller(ctx context.Context, jobID string) (*poll.Poller, error) {
	j := d.Config.Job(jobID)
	if j == nil {
		return nil, fmt.Errorf("build poller: no job %q in the configuration", jobID)
	}
	rec := metrics.New(d.Metrics, map[string]string{"Job": j.ID})
	fc, err := d.feed(ctx, j, sourceMeter(rec))
	if err != nil {
		return nil, fmt.Errorf("build poller %s: %w", j.ID, err)
	}
	targets := make([]fanout.Target, 0, len(j.Outputs))
	for _, o := range j.Outputs {
		name := d.Config.QueueName(j, o)
		out, err := d.SQS.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
		if err != nil {
			return nil, fmt.Errorf("build poller %s: get queue url %s: %w", j.ID, name, err)
		}
		targets = append(targets, fanout.NewTarget(o, aws.ToString(out.QueueUrl)))
	}
	quarantined := &quarantine.Store{DB: d.DynamoDB, Table: d.Config.TableName(), Clock: d.Now}
	var source poll.Feed = fc
	if a := j.Attachments; a != nil && a.Enabled {
		source = &attach.Feed{
			Inner: fc,
			Stage: &attach.Stage{Config: a, Source: fc, S3: d.S3, Log: d.Log.With("job", j.ID), Job: j.ID, Quarantine: quarantined,
				IDs: docid.Exposure(d.Config.Stack.DocIDs)},
			OnStats: func(s attach.Stats) {
				rec.Add(metrics.AttachmentsUploaded, float64(s.Uploaded), metrics.Count)
				rec.Add(metrics.AttachmentsPresent, float64(s.Present), metrics.Count)
				rec.Add(metrics.AttachmentsSkipped, float64(s.Skipped), metrics.Count)
				rec.Add(metrics.AttachmentBytesUploaded, float64(s.Bytes), metrics.Bytes)
				rec.Add(metrics.AttachmentsQuarantined, float64(s.Quarantined), metrics.Count)
			},
		}
	}
	var onFailover func(context.Context)
	if d.Lambda != nil {
		// Beside the new holder's first read, which it must not delay.
		onFailover = func(ctx context.Context) { go d.startStandby(ctx, j.ID) }
	}
	source, sender := scrubbed(docid.Exposure(d.Config.Stack.DocIDs), source,
		&fanout.Sender{SQS: d.SQS, S3: d.S3, Bucket: d.Config.Stack.Bucket, Stack: d.Config.Stack.Prefix, MaxBytes: d.Config.Stack.MaxMessageBytes, Concurrency: j.SendConcurrency})
	return &poll.Poller{
		Job:        j,
		Feed:       source,
		OpenStream: openStream(fc, j.Feed.Mode),
		Leases:     &lease.Store{DB: d.DynamoDB, Table: d.Config.TableName(), Clock: d.Now},
		Sender:     sender,
		Targets:    targets,
		SendDepth:  j.SendDepth,
		Quarantine: quarantined,
		Log:        d.Log,
		Metrics:    rec,
		Clock:      d.Now,
		OnFailover: onFailover,
	}, nil
}

// standbyInvokeTimeout bounds the request that starts a standby after a
// failover.
const standbyInvokeTimeout = 2 * time.Second

// startStandby invokes this poller function for job once, asynchronously,
// as its invocation has just taken the lease over by failover. The
// invocation that stood by is now the holder, and the schedule adds the next
// one only at its next tick: without this, a second crash within the same
// schedule period would wait for that tick. A failure is logged only: the
// next tick brings a standby all the same.
func (d *Deps) startStandby(ctx context.Context, job string) {
	ctx, cancel := context.WithTimeout(ctx, standbyInvokeTimeout)
	defer cancel()
	payload, err := json.Marshal(ScheduleEvent{Job: job})
	if err == nil {
		_, err = d.Lambda.Invoke(ctx, &lambda.InvokeInput{
			FunctionName:   &d.Function,
			InvocationType: lambdatypes.InvocationTypeEvent,
			Payload:        payload,
		})
	}
	if err != nil {
		d.Log.WarnContext(ctx, "start a standby after the failover", "job", job, "function", d.Function, "error", err)
		return
	}
	d.Log.InfoContext(ctx, "started a standby after the failover", "job", job, "function", d.Function)
}

// openStream is how the poller opens the job's streaming feed; nil for
// longpoll, which reads pages only.
func openStream(fc *feed.Client, mode string) poll.OpenStream {
	if mode == "" || mode == config.ModeLongpoll {
		return nil
	}
	return func(ctx context.Context, since json.RawMessage) (poll.Stream, error) {
		s, err := fc.Stream(ctx, since, feed.StreamOptions{Mode: mode})
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}

// Feed builds the feed client of a job, with its credentials resolved.
func (d *Deps) Feed(ctx context.Context, j *config.Job) (*feed.Client, error) {
	return d.feed(ctx, j, nil)
}

// sourceMeter records every request to the source, and "our credentials"
// when it answers 401 or 403. The failures are recorded only when one
// happens: a metric is billed for every month it receives data, and its
// alarm takes no data as none.
func sourceMeter(rec *metrics.Recorder) func(op string, status int, d time.Duration) {
	return func(op string, status int, d time.Duration) {
		rec.Sum(metrics.SourceRequests, 1, metrics.Count)
		if status == http.StatusUnauthorized || status == http.StatusForbidden {
			rec.Sum(metrics.SourceAuthFailures, 1, metrics.Count)
		}
		rec.Add(metrics.SourceRequestTime, float64(d.Microseconds())/1000, metrics.Milliseconds)
	}
}

func (d *Deps) feed(ctx context.Context, j *config.Job, onRequest func(string, int, time.Duration)) (*feed.Client, error) {
	opts := feed.Options{
		SourceType: j.Source.Type, URL: j.Source.URL, Limit: j.Feed.Limit, Fetch: j.Feed.Fetch,
		ActiveOnly: j.Feed.ActiveOnly, Channels: j.Feed.Channels, OnRequest: onRequest,
		MaxAnswerBytes: j.Feed.MaxAnswerBytes, PageBytes: j.Feed.PageBytes,
	}
	if a := j.Source.Auth; a != nil {
		var err error
		if opts.Username, opts.Password, opts.Token, err = d.credentials(ctx, a); err != nil {
			return nil, fmt.Errorf("source auth of %s: %w", j.ID, err)
		}
		opts.Session = a.Type == config.AuthSession
	}
	if t := j.Source.TLS; t != nil {
		opts.CAPEM = []byte(t.CAPEM)
		if t.CAFile != "" {
			b, err := os.ReadFile(t.CAFile)
			if err != nil {
				return nil, fmt.Errorf("source tls of %s: read ca_file: %w", j.ID, err)
			}
			opts.CAPEM = b
		}
	}
	c, err := feed.New(opts)
	if err != nil {
		return nil, fmt.Errorf("source of %s: %w", j.ID, err)
	}
	return c, nil
}

// Writer builds the writer handler for every output of the configuration.
// In a Lambda function its intake is the function's event source mappings;
// elsewhere it has none, and the host sets its own (the local runtime).
func (d *Deps) Writer() *writer.Handler {
	var intake writer.Intake
	if d.Lambda != nil {
		intake = &writer.Mappings{Lambda: d.Lambda, Function: d.Function, Config: d.Config}
	}
	return &writer.Handler{
		Intake:  intake,
		Config:  d.Config,
		Sinks:   d.Sink,
		SQS:     d.SQS,
		S3:      d.S3,
		Log:     d.Log,
		Metrics: d.Metrics,
		Halts:   &halt.Store{DB: d.DynamoDB, Table: d.Config.TableName()},
		Outages: &outage.Store{DB: d.DynamoDB, Table: d.Config.TableName()},
		Secrets: d.Secrets,
	}
}

// Sink opens the sink of one route.
func (d *Deps) Sink(ctx context.Context, r config.Route) (deliver.Sink, error) {
	impl, err := d.implementation(r.Output)
	if err != nil {
		return nil, err
	}
	return impl.sink(ctx, r.Output)
}

// Pool returns the pgx pool of an output's DSN and postgres.tls: one per
// connection string and CA, shared by the outputs whose references resolve
// to it. When a reference resolves to another connection string than before
// (a rotated secret, read again after an outage), the pool of the old one is
// closed once no reference resolves to it any more: at once for new
// requests, and its connections as the requests holding them finish. Close
// closes the rest. A DSN that may connect without TLS unless it says so is
// refused (pgsink.PoolConfig). Safe for concurrent use.
func (d *Deps) Pool(ctx context.Context, pg *config.PostgresOutput) (*pgxpool.Pool, error) {
	dsn, err := d.Secrets.Resolve(ctx, pg.DSN)
	if err != nil {
		return nil, fmt.Errorf("postgres dsn: %w", err)
	}
	key, ref := dsn, poolRef{dsn: pg.DSN}
	if pg.TLS != nil {
		ref.ca = "\x00" + pg.TLS.CAFile + "\x00" + pg.TLS.CAPEM
		key += ref.ca
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok := d.pools[key]
	if !ok {
		cfg, err := pgsink.PoolConfig(dsn, pg.TLS)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = int32(pg.MaxConns)
		if p, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			return nil, fmt.Errorf("open postgres pool: %w", err)
		}
		if d.pools == nil {
			d.pools = map[string]*pgxpool.Pool{}
		}
		d.pools[key] = p
	}
	if d.keys == nil {
		d.keys = map[poolRef]string{}
	}
	old, seen := d.keys[ref]
	d.keys[ref] = key
	if seen && old != key && !d.resolvedTo(old) {
		if stale := d.pools[old]; stale != nil {
			delete(d.pools, old)
			// Close waits for the connections in use: not under the lock.
			go stale.Close()
		}
	}
	return p, nil
}

// resolvedTo reports whether a DSN reference last resolved to key. The
// caller holds mu.
func (d *Deps) resolvedTo(key string) bool {
	for _, v := range d.keys {
		if v == key {
			return true
		}
	}
	return false
}

// Close releases pools.
func (d *Deps) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.pools {
		p.Close()
	}
	d.pools, d.keys = nil, nil
}

func (d *Deps) credentials(ctx context.Context, a *config.Auth) (user, pass, token string, err error) {
	switch a.Type {
	case config.AuthBasic, config.AuthSession:
		pass, err = d.Secrets.Resolve(ctx, *a.Password)
		return a.Username, pass, "", err
	case "bearer":
		token, err = d.Secrets.Resolve(ctx, *a.Token)
		return "", "", token, err
	}
	return "", "", "", fmt.Errorf("auth type %q", a.Type)
}

// Hostname names where a lease holder runs, for the job item (`host` in
// changesctl status --json): in a Lambda execution environment its log
// stream, which holds that environment's records; elsewhere the machine's
// name.
func Hostname() string {
	if s := lambdacontext.LogStreamName; s != "" {
		return s
	}
	h, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return h
}
