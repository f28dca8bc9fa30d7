package main

// The benchmarks at cloud latency: every AWS call goes through a proxy
// (faults.NewHTTPProxy) that delays it by -aws-latency (15 ms by default, or
// BENCH_AWS_LATENCY), about what an SQS or DynamoDB request costs inside an
// AWS region, and counts the requests by action so the figures come with
// requests per document.
//
//	cloud-poller   cloud_poller.go   poller with real SQS sends / raw feed read
//	cloud-backlog  cloud_backlog.go  backlogs end to end into PostgreSQL
//
// Each figure is shown next to what sets its ceiling: the emulator's own
// send and receive rates through the same proxy, and the poller against a
// stand-in SQS that answers at once (cloud_null.go) behind the same latency.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/provision"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/tests/faults"
)

func init() {
	register("cloud-poller", cloudPoller)
	register("cloud-backlog", cloudBacklog)
}

var cloudLatencyFlag = flag.Duration("aws-latency", cloudDefaultLatency(),
	"latency the cloud-* benchmarks add to every AWS request (env BENCH_AWS_LATENCY)")

func cloudDefaultLatency() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("BENCH_AWS_LATENCY")); err == nil {
		return d
	}
	return 15 * time.Millisecond
}

// cloudAWS is the local AWS endpoint behind latency proxies: one in front of
// AWS_ENDPOINT_URL, one in front of AWS_ENDPOINT_URL_DYNAMODB when that is
// set, and one in front of the stand-in SQS.
type cloudAWS struct {
	latency time.Duration
	main    *faults.Proxy
	ddb     *faults.Proxy // nil unless AWS_ENDPOINT_URL_DYNAMODB is set
	null    *faults.Proxy
	nullSrv *httptest.Server
}

func newCloudAWS(latency time.Duration) (*cloudAWS, error) {
	testenv.SetAWSEnv()
	c := &cloudAWS{latency: latency}
	target := func(env string) (string, error) {
		u, err := url.Parse(os.Getenv(env))
		if err != nil || u.Host == "" {
			return "", fmt.Errorf("%s %q is not a URL with a host", env, os.Getenv(env))
		}
		return u.Host, nil
	}
	host, err := target("AWS_ENDPOINT_URL")
	if err != nil {
		return nil, err
	}
	if c.main, err = faults.NewHTTPProxy(host); err != nil {
		return nil, err
	}
	if os.Getenv("AWS_ENDPOINT_URL_DYNAMODB") != "" {
		if host, err = target("AWS_ENDPOINT_URL_DYNAMODB"); err != nil {
			c.close()
			return nil, err
		}
		if c.ddb, err = faults.NewHTTPProxy(host); err != nil {
			c.close()
			return nil, err
		}
	}
	c.nullSrv = httptest.NewServer(&cloudNullSQS{})
	if c.null, err = faults.NewHTTPProxy(strings.TrimPrefix(c.nullSrv.URL, "http://")); err != nil {
		c.close()
		return nil, err
	}
	c.setLatency(latency)
	return c, nil
}

func (c *cloudAWS) proxies() []*faults.Proxy {
	var ps []*faults.Proxy
	for _, p := range []*faults.Proxy{c.main, c.ddb, c.null} {
		if p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

func (c *cloudAWS) setLatency(d time.Duration) {
	for _, p := range c.proxies() {
		p.SetLatency(d)
	}
}

// env is the environment that points a process at the proxies.
func (c *cloudAWS) env() []string {
	env := []string{"AWS_ENDPOINT_URL=" + c.main.URL()}
	if c.ddb != nil {
		env = append(env, "AWS_ENDPOINT_URL_DYNAMODB="+c.ddb.URL())
	}
	return env
}

// config loads the SDK configuration with the proxies as endpoints.
func (c *cloudAWS) config(ctx context.Context) (aws.Config, error) {
	saved := map[string]*string{}
	for _, kv := range c.env() {
		k, v, _ := strings.Cut(kv, "=")
		if old, ok := os.LookupEnv(k); ok {
			saved[k] = &old
		} else {
			saved[k] = nil
		}
		os.Setenv(k, v)
	}
	defer func() {
		for k, v := range saved {
			if v == nil {
				os.Unsetenv(k)
			} else {
				os.Setenv(k, *v)
			}
		}
	}()
	return awsconf.Load(ctx)
}

// nullSQS is an SQS client for the stand-in, through its proxy.
func (c *cloudAWS) nullSQS(cfg aws.Config) *sqs.Client {
	return sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(c.null.URL()) })
}

// requests returns the requests to the local AWS since the last reset, by
// action (the stand-in's are not counted).
func (c *cloudAWS) requests() map[string]int64 {
	out := c.main.Requests()
	if c.ddb != nil {
		for k, v := range c.ddb.Requests() {
			out[k] += v
		}
	}
	return out
}

func (c *cloudAWS) resetRequests() {
	c.main.ResetRequests()
	if c.ddb != nil {
		c.ddb.ResetRequests()
	}
}

func (c *cloudAWS) close() {
	for _, p := range c.proxies() {
		p.Close()
	}
	if c.nullSrv != nil {
		c.nullSrv.Close()
	}
}

// cloudPerDoc formats request counts per document: "SQS.SendMessageBatch
// 0.100, DynamoDB.UpdateItem 0.004, ...", largest first.
func cloudPerDoc(counts map[string]int64, docs int) string {
	keys := slices.Collect(maps.Keys(counts))
	slices.SortFunc(keys, func(a, b string) int {
		if counts[a] != counts[b] {
			return int(counts[b] - counts[a])
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.4f", k, float64(counts[k])/float64(docs)))
	}
	return strings.Join(parts, ", ")
}

// cloudSum adds the counts of the actions named.
func cloudSum(counts map[string]int64, actions ...string) int64 {
	var n int64
	for _, a := range actions {
		n += counts[a]
	}
	return n
}

// cloudOutput is one output of a cloud stack's job.
type cloudOutput struct {
	id, kind string // kind: postgres, s3 or http
	table    string // postgres
	fifo     bool
}

func (o cloudOutput) json() string {
	ordering := "none"
	if o.fifo {
		ordering = "per_document"
	}
	switch o.kind {
	case "postgres":
		return fmt.Sprintf(`{"id": %q, "type": "postgres", "ordering": %q,
      "postgres": {"dsn": {"env": %q}, "table": %q, "create_tables": true}}`, o.id, ordering, coreDSNEnv, o.table)
	case "s3":
		return fmt.Sprintf(`{"id": %q, "type": "s3", "ordering": %q, "s3": {"prefix": %q}}`, o.id, ordering, o.id+"/")
	default:
		return fmt.Sprintf(`{"id": %q, "type": "http", "ordering": %q, "http": {"url": "http://127.0.0.1:9/{doc_id}"}}`, o.id, ordering)
	}
}

// cloudStack is an isolated configuration (its own prefix) whose job "bench"
// reads source with the outputs given, provisioned through the proxies.
type cloudStack struct {
	cfg  *config.File
	deps *pipeline.Deps
	raw  string
}

func newCloudStack(ctx context.Context, cw *cloudAWS, name, source string, limit int, outputs ...cloudOutput) (*cloudStack, error) {
	outs := make([]string, len(outputs))
	for i, o := range outputs {
		outs[i] = o.json()
	}
	doc := fmt.Sprintf(`{
  "stack": {"prefix": %q, "bucket": %q, "poller_timeout": "5m", "writer_timeout": "30s"},
  "jobs": [{
    "id": "bench",
    "source": {"type": "couchdb", "url": %q},
    "feed": {"limit": %d, "timeout": "2s", "fetch": "include_docs"},
    "lease": {"ttl": "10s"},
    "outputs": [%s]
  }]
}`, name, name+"-data", source, limit, strings.Join(outs, ",\n    "))
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		return nil, fmt.Errorf("cloud bench config: %w", err)
	}
	awsCfg, err := cw.config(ctx)
	if err != nil {
		return nil, err
	}
	deps := pipeline.New(cfg, awsCfg, coreLookup, coreDiscardLog, io.Discard)
	st := &cloudStack{cfg: cfg, deps: deps, raw: doc}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := provision.Apply(pctx, provision.Clients{DynamoDB: deps.DynamoDB, SQS: deps.SQS, S3: deps.S3}, cfg); err != nil {
		st.close()
		return nil, fmt.Errorf("provision %s (is the AWS emulator running? `make up`): %w", name, err)
	}
	return st, nil
}

// queueURLs returns the work queue URL of every output, in order.
func (s *cloudStack) queueURLs(ctx context.Context) ([]string, error) {
	j := s.cfg.Jobs[0]
	var urls []string
	for _, o := range j.Outputs {
		name := s.cfg.QueueName(j, o)
		out, err := s.deps.SQS.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
		if err != nil {
			return nil, fmt.Errorf("get queue url %s: %w", name, err)
		}
		urls = append(urls, aws.ToString(out.QueueUrl))
	}
	return urls, nil
}

// purge empties the work queues (the emulator keeps them in memory).
func (s *cloudStack) purge(ctx context.Context) {
	urls, _ := s.queueURLs(ctx)
	for _, u := range urls {
		_, _ = s.deps.SQS.PurgeQueue(ctx, &sqs.PurgeQueueInput{QueueUrl: aws.String(u)})
	}
}

// close deletes what newCloudStack created, reusing the core stack's
// teardown.
func (s *cloudStack) close() {
	(&coreStack{cfg: s.cfg, deps: s.deps}).close()
}
