package main

// The benchmarks at cloud latency: every AWS call goes through a proxy
// (faults.NewHTTPProxy, one per endpoint setting in use) that delays it by -aws-latency (15 ms by default, or
// BENCH_AWS_LATENCY), about what an SQS or DynamoDB request costs inside an
// AWS region, and counts the requests by action so the figures come with
// requests per document.
//
//	cloud-poller   cloud_poller.go   poller with real SQS sends / raw feed read
//	cloud-backlog  cloud_backlog.go  backlogs end to end into PostgreSQL
//
// Each figure is shown next to what sets its ceiling: the emulator's own
// send and receive rates through the same proxy, and the poller against a
// stand-in SQS (cloud_sqs.go) that answers after the same latency.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
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
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
	"github.com/changes-worker/changes-worker/tests/faults"
)

func init() {
	register("cloud-poller", cloudPoller)
	register("cloud-backlog", cloudBacklog)
}

var cloudSendConcurrencyFlag = flag.Int("send-concurrency", 0,
	"the cloud benchmarks' job send_concurrency (default: the job default)")

var cloudSendDepthFlag = flag.Int("send-depth", 0,
	"the job send_depth of the stacks the benchmarks build (not failover's); default: the job default")

var cloudLatencyFlag = flag.Duration("aws-latency", cloudDefaultLatency(),
	"latency the cloud-* benchmarks add to every AWS request (env BENCH_AWS_LATENCY)")

func cloudDefaultLatency() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("BENCH_AWS_LATENCY")); err == nil {
		return d
	}
	return 15 * time.Millisecond
}

// cloudEndpoints are the SDK's endpoint settings the proxies stand in for:
// the general one and the per-service ones a local set-up may use.
var cloudEndpoints = []string{"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_S3"}

// cloudAWS is the local AWS behind latency proxies, one in front of each
// endpoint setting in use, and the stand-in SQS (cloud_sqs.go), which
// delays its own answers. From newCloudAWS to close, this process's endpoint
// settings name the proxies.
type cloudAWS struct {
	latency time.Duration
	byEnv   map[string]*faults.Proxy
	saved   map[string]*string // this process's endpoint settings before point
	null    *cloudSQS
	nullSrv *httptest.Server
}

func newCloudAWS(latency time.Duration) (*cloudAWS, error) {
	testenv.SetAWSEnv()
	c := &cloudAWS{latency: latency, byEnv: map[string]*faults.Proxy{}}
	for _, env := range cloudEndpoints {
		raw := os.Getenv(env)
		if raw == "" {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			c.close()
			return nil, fmt.Errorf("%s %q is not a URL with a host", env, raw)
		}
		if c.byEnv[env], err = faults.NewHTTPProxy(u.Host); err != nil {
			c.close()
			return nil, err
		}
	}
	if c.byEnv["AWS_ENDPOINT_URL"] == nil {
		c.close()
		return nil, errors.New("AWS_ENDPOINT_URL is not set")
	}
	c.null = newCloudSQS()
	c.nullSrv = httptest.NewServer(c.null)
	c.setLatency(latency)
	c.point()
	return c, nil
}

func (c *cloudAWS) proxies() []*faults.Proxy {
	var ps []*faults.Proxy
	for _, env := range cloudEndpoints {
		if p := c.byEnv[env]; p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

func (c *cloudAWS) setLatency(d time.Duration) {
	for _, p := range c.proxies() {
		p.SetLatency(d)
	}
	c.null.latency.Store(int64(d))
}

// env is the environment that points a process at the proxies.
func (c *cloudAWS) env() []string {
	var env []string
	for _, e := range cloudEndpoints {
		if p := c.byEnv[e]; p != nil {
			env = append(env, e+"="+p.URL())
		}
	}
	return env
}

// standInEnv is env with SQS at the stand-in.
func (c *cloudAWS) standInEnv() []string {
	return append(c.env(), "AWS_ENDPOINT_URL_SQS="+c.nullSrv.URL)
}

// point sets the endpoint settings of this process to the proxies until
// close: the SDK reads the per-service ones whenever a client is made.
func (c *cloudAWS) point() {
	c.saved = map[string]*string{}
	for _, kv := range c.env() {
		k, v, _ := strings.Cut(kv, "=")
		if old, ok := os.LookupEnv(k); ok {
			c.saved[k] = &old
		} else {
			c.saved[k] = nil
		}
		os.Setenv(k, v)
	}
}

func (c *cloudAWS) restore() {
	for k, v := range c.saved {
		if v == nil {
			os.Unsetenv(k)
		} else {
			os.Setenv(k, *v)
		}
	}
	c.saved = nil
}

// config loads the SDK configuration (pointed at the proxies).
func (c *cloudAWS) config(ctx context.Context) (aws.Config, error) { return awsconf.Load(ctx, nil) }

// standInSQS is an SQS client for the stand-in.
func (c *cloudAWS) standInSQS(cfg aws.Config) *sqs.Client {
	return sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(c.nullSrv.URL) })
}

// requests returns the requests to the local AWS since the last reset, by
// action (the stand-in's are not counted).
func (c *cloudAWS) requests() map[string]int64 {
	out := map[string]int64{}
	for _, p := range c.byEnv {
		for k, v := range p.Requests() {
			out[k] += v
		}
	}
	return out
}

func (c *cloudAWS) resetRequests() {
	for _, p := range c.byEnv {
		p.ResetRequests()
	}
}

func (c *cloudAWS) close() {
	c.restore()
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
	fifo     bool
}

func (o cloudOutput) output() *config.Output {
	out := &config.Output{ID: o.id, Type: o.kind, Ordering: config.OrderingNone}
	if o.fifo {
		out.Ordering = config.OrderingPerDocument
	}
	switch o.kind {
	case config.OutputPostgres:
		out.Postgres = &config.PostgresOutput{CreateTables: true}
	case config.OutputS3:
		out.S3 = &config.S3Output{Prefix: o.id + "/"}
	default:
		out.HTTP = &config.HTTPOutput{URL: "http://127.0.0.1:9/{doc_id}"}
	}
	return out
}

// newCloudStack provisions an isolated stack (testenv/stack, through the
// proxies) whose job "bench" reads the stack's own source database with
// the outputs given.
func newCloudStack(ctx context.Context, kind string, limit int, outputs ...cloudOutput) (*stack.Stack, error) {
	outs := make([]*config.Output, len(outputs))
	for i, o := range outputs {
		outs[i] = o.output()
	}
	cfg := &config.File{
		Stack: config.Stack{PollerTimeout: config.Duration(5 * time.Minute), WriterTimeout: config.Duration(30 * time.Second)},
		Jobs: []*config.Job{{
			ID:      "bench",
			Feed:    config.Feed{Limit: limit, Timeout: config.Duration(2 * time.Second), Fetch: config.FetchIncludeDocs},
			Lease:   config.Lease{TTL: config.Duration(10 * time.Second)},
			Outputs: outs,
			// Zero: the default.
			SendConcurrency: *cloudSendConcurrencyFlag,
			SendDepth:       *cloudSendDepthFlag,
		}},
	}
	return stack.New(ctx, stack.Options{Name: "bench-" + kind, Config: cfg, LogLevel: slog.LevelWarn})
}

// cloudQueueURLs returns the work queue URL of every output of st's job,
// in order.
func cloudQueueURLs(ctx context.Context, st *stack.Stack) ([]string, error) {
	var urls []string
	for _, o := range st.Config.Jobs[0].Outputs {
		q, err := st.Queues(ctx, "bench", o.ID)
		if err != nil {
			return nil, err
		}
		urls = append(urls, q.WorkURL)
	}
	return urls, nil
}

// cloudPurge empties st's work queues (the emulator keeps them in memory).
func cloudPurge(ctx context.Context, st *stack.Stack) {
	urls, _ := cloudQueueURLs(ctx, st)
	for _, u := range urls {
		_, _ = st.Deps.SQS.PurgeQueue(ctx, &sqs.PurgeQueueInput{QueueUrl: aws.String(u)})
	}
}
