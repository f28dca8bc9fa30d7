// Package testenv connects tests, the fault library and the benchmarks to the
// local services started by `make up`: LocalStack, moto (S3) and DynamoDB Local, the CouchDB-compatible
// source and PostgreSQL. Their addresses come from the variables that
// localstack/env.sh exports (the AWS SDK's own for AWS), with defaults for a
// shell that did not source it. A test that needs a service which is not
// running fails with a message saying how to start it; it never skips.
//
// Subpackage stack builds a whole isolated pipeline on these services.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/clock"
)

// Defaults match localstack/env.sh.
const (
	DefaultAWSEndpoint      = "http://127.0.0.1:4566"
	DefaultS3Endpoint       = "http://127.0.0.1:4567"
	DefaultDynamoDBEndpoint = "http://127.0.0.1:8000"
	DefaultCouchURL         = "http://127.0.0.1:5984"
	DefaultPostgresDSN      = "postgres://changes:changes@127.0.0.1:5432/changes?sslmode=disable"
)

// DSNEnv is the environment variable that test configurations name for the
// PostgreSQL DSN ({"dsn": {"env": DSNEnv}}). Lookup and Environ always
// answer it, with DSN().
const DSNEnv = "CHANGES_TEST_PG_DSN"

var setAWSEnv sync.Once

// SetAWSEnv points the AWS SDK at the local emulator unless the environment
// already names an endpoint. It only sets variables that are unset, so the
// SDK's own settings (AWS_ENDPOINT_URL and the per-service
// AWS_ENDPOINT_URL_<SERVICE>) always win.
func SetAWSEnv() {
	setAWSEnv.Do(func() {
		if _, ok := os.LookupEnv("AWS_ENDPOINT_URL"); !ok {
			for k, v := range map[string]string{
				"AWS_ENDPOINT_URL_S3":       DefaultS3Endpoint,
				"AWS_ENDPOINT_URL_DYNAMODB": DefaultDynamoDBEndpoint,
			} {
				if _, ok := os.LookupEnv(k); !ok {
					os.Setenv(k, v)
				}
			}
		}
		for k, v := range map[string]string{
			"AWS_ENDPOINT_URL":      DefaultAWSEndpoint,
			"AWS_REGION":            "us-east-1",
			"AWS_ACCESS_KEY_ID":     "test",
			"AWS_SECRET_ACCESS_KEY": "test",
			"S3_USE_PATH_STYLE":     "true",
		} {
			if _, ok := os.LookupEnv(k); !ok {
				os.Setenv(k, v)
			}
		}
	})
}

// Endpoint returns the endpoint URL the AWS SDK uses for service (its SDK
// id, e.g. "DynamoDB", "SQS"): AWS_ENDPOINT_URL_<SERVICE> when set, else
// AWS_ENDPOINT_URL (after SetAWSEnv).
func Endpoint(service string) string {
	SetAWSEnv()
	key := "AWS_ENDPOINT_URL_" + strings.ToUpper(strings.ReplaceAll(service, " ", "_"))
	if v := os.Getenv(key); v != "" {
		return v
	}
	return os.Getenv("AWS_ENDPOINT_URL")
}

// CouchBaseURL returns the base URL of the CouchDB-compatible source:
// CHANGES_TEST_COUCH_URL, else COUCH_URL, else DefaultCouchURL.
func CouchBaseURL() string {
	return strings.TrimRight(firstEnv(DefaultCouchURL, "CHANGES_TEST_COUCH_URL", "COUCH_URL"), "/")
}

// DSN returns the connection string of the test database:
// CHANGES_TEST_PG_DSN, else PG_DSN, else DefaultPostgresDSN.
func DSN() string { return firstEnv(DefaultPostgresDSN, DSNEnv, "PG_DSN") }

// Lookup is the environment of pipelines built for tests: the process
// environment, in which DSNEnv always resolves (to DSN()).
func Lookup(k string) (string, bool) {
	if k == DSNEnv {
		return DSN(), true
	}
	return os.LookupEnv(k)
}

// Environ is the process environment with DSNEnv set, for child processes
// (changesctl) that read test configurations.
func Environ() []string { return append(os.Environ(), DSNEnv+"="+DSN()) }

// AWS returns an SDK configuration for the local emulator, failing the test
// when an endpoint it names does not answer.
func AWS(t testing.TB) aws.Config {
	t.Helper()
	SetAWSEnv()
	for _, e := range awsEndpoints() {
		mustDial(t, e, "the AWS emulator")
	}
	// The SDK's warnings go to stderr; its debug lines nowhere.
	cfg, err := awsconf.Load(t.Context(), slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatalf("load aws config: %v", err)
	}
	return cfg
}

// awsEndpoints are the distinct endpoint URLs the environment names, the
// general one and the per-service ones.
func awsEndpoints() []string {
	seen := map[string]bool{}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "AWS_ENDPOINT_URL") && v != "" {
			seen[v] = true
		}
	}
	out := make([]string, 0, len(seen))
	for v := range seen {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// CouchURL returns the base URL of the CouchDB-compatible source, failing
// the test when it does not answer.
func CouchURL(t testing.TB) string {
	t.Helper()
	return mustDial(t, CouchBaseURL(), "the CouchDB-compatible source")
}

// CouchDB creates a fresh database on the source and returns its URL. It is
// deleted when the test ends.
func CouchDB(t testing.TB) string {
	t.Helper()
	db := CouchURL(t) + "/" + Name(t)
	req, _ := http.NewRequest(http.MethodPut, db, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("create database: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		t.Fatalf("create database %s: status %d", db, resp.StatusCode)
	}
	t.Cleanup(func() {
		req, _ := http.NewRequest(http.MethodDelete, db, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	return db
}

// PostgresDSN returns the connection string of the test database, failing
// the test when PostgreSQL does not answer.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	return mustDial(t, DSN(), "PostgreSQL")
}

// Postgres returns a pool on the test database, closed when the test ends.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	// Not t.Context() alone: it is cancelled before cleanups run, and
	// cleanups (dropping a test's tables) open pools too.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, PostgresDSN(t))
	if err != nil {
		t.Fatalf("connect postgres: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("ping postgres: %v (start the local services with `make up`)", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Name returns a name unique to this test run (UniqueName of the test's
// name).
func Name(t testing.TB) string { return UniqueName(t.Name()) }

var unsafe = regexp.MustCompile(`[^a-z0-9]+`)

// UniqueName returns the last 16 characters of label, lowercased, with runs
// of other characters than letters and digits made '-', followed by '-' and
// 8 random hex digits: at most 26 characters of lowercase letters, digits and
// '-', starting with a letter, so usable as a database, a stack prefix, a job
// id, a queue name part, or (with '_' for '-') a PostgreSQL table.
func UniqueName(label string) string {
	n := strings.Trim(unsafe.ReplaceAllString(strings.ToLower(label), "-"), "-")
	if len(n) > 16 {
		n = strings.TrimLeft(n[len(n)-16:], "-")
	}
	if n == "" || n[0] < 'a' || n[0] > 'z' {
		n = "t" + n
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return n + "-" + hex.EncodeToString(b)
}

// firstEnv returns the first of keys set to a non-empty value, else def.
func firstEnv(def string, keys ...string) string {
	for _, k := range keys {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return def
}

// mustDial fails the test unless a TCP connection to the host of rawURL
// succeeds; it returns rawURL.
func mustDial(t testing.TB, rawURL, what string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("parse %s address: %v", what, err)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), map[string]string{"https": "443", "http": "80", "postgres": "5432"}[u.Scheme])
	}
	c, err := net.DialTimeout("tcp", host, 2*time.Second)
	if err != nil {
		t.Fatalf("%s is not reachable at %s: %v (start the local services with `make up`)", what, host, err)
	}
	c.Close()
	return rawURL
}

// ErrTimeout is what Poll returns when its condition did not hold in time.
var ErrTimeout = errors.New("condition not met in time")

// Poll evaluates cond at once and then every interval until it holds
// (Poll returns nil) or fails (its error), until timeout has passed since
// the call (ErrTimeout), or until ctx is done (ctx.Err()).
func Poll(ctx context.Context, timeout, interval time.Duration, cond func(context.Context) (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		if ok, err := cond(ctx); ok || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return ErrTimeout
		}
		if err := clock.Sleep(ctx, interval); err != nil {
			return err
		}
	}
}
