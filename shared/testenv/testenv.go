// Package testenv connects tests to the local services started by `make up`:
// LocalStack and DynamoDB Local, the CouchDB-compatible source and PostgreSQL. A test that
// needs a service which is not running fails with a message saying how to
// start it; it never skips.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/awsconf"
)

// Defaults match localstack/env.sh.
const (
	DefaultAWSEndpoint      = "http://127.0.0.1:4566"
	DefaultS3Endpoint       = "http://127.0.0.1:4567"
	DefaultDynamoDBEndpoint = "http://127.0.0.1:8000"
	DefaultCouchURL         = "http://127.0.0.1:5984"
	DefaultPostgresDSN      = "postgres://changes:changes@127.0.0.1:5432/changes?sslmode=disable"
)

var setAWSEnv sync.Once

// SetAWSEnv points the AWS SDK at the local services unless the environment
// already names an endpoint. It only sets variables that are unset, and sets
// the S3 (moto) and DynamoDB (DynamoDB Local) endpoints only along with the
// default AWS_ENDPOINT_URL (LocalStack).
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

// AWS returns an SDK configuration for the local services, failing the test
// when LocalStack, the S3 endpoint or DynamoDB Local does not answer.
func AWS(t testing.TB) aws.Config {
	t.Helper()
	SetAWSEnv()
	mustDial(t, os.Getenv("AWS_ENDPOINT_URL"), "the local AWS (LocalStack)")
	if u := os.Getenv("AWS_ENDPOINT_URL_S3"); u != "" {
		mustDial(t, u, "the S3 endpoint (moto)")
	}
	if u := os.Getenv("AWS_ENDPOINT_URL_DYNAMODB"); u != "" {
		mustDial(t, u, "DynamoDB Local")
	}
	cfg, err := awsconf.Load(context.Background())
	if err != nil {
		t.Fatalf("load aws config: %v", err)
	}
	return cfg
}

// CouchURL returns the base URL of the CouchDB-compatible source.
func CouchURL(t testing.TB) string {
	t.Helper()
	u := env("CHANGES_TEST_COUCH_URL", DefaultCouchURL)
	mustDial(t, u, "the CouchDB-compatible source")
	return u
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

// PostgresDSN returns the connection string of the test database.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	dsn := env("CHANGES_TEST_PG_DSN", DefaultPostgresDSN)
	mustDial(t, dsn, "PostgreSQL")
	return dsn
}

// Postgres returns a pool on the test database, closed when the test ends.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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

var unsafe = regexp.MustCompile(`[^a-z0-9]+`)

// Name returns a name unique to this test run, made of lowercase letters,
// digits and '-', usable as a database, table suffix, job id or queue name part.
func Name(t testing.TB) string {
	n := strings.Trim(unsafe.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(n) > 16 {
		n = n[len(n)-16:]
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "t" + strings.Trim(n, "-") + "-" + hex.EncodeToString(b)
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func mustDial(t testing.TB, rawURL, what string) {
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
}
