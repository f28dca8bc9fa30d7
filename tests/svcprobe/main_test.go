package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// TestSummary: each service's count, median and slowest answer, then the
// answers slower than the bound or failed, in time order.
func TestSummary(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	answers := []answer{
		{Service: "DynamoDB Local", At: at, Took: 15 * time.Millisecond},
		{Service: "source", At: at, Took: 2 * time.Millisecond},
		{Service: "DynamoDB Local", At: at.Add(time.Second), Took: 31 * time.Second},
		{Service: "DynamoDB Local", At: at.Add(40 * time.Second), Took: 17 * time.Millisecond},
		{Service: "source", At: at.Add(-time.Second), Took: time.Minute, Err: "context deadline exceeded"},
		{Service: "PostgreSQL", At: at, Took: 3 * time.Millisecond, Sessions: 12, Max: 100},
		{Service: "PostgreSQL", At: at.Add(2 * time.Second), Took: 4 * time.Millisecond, Sessions: 97, Max: 100},
		{Service: "PostgreSQL", At: at.Add(3 * time.Second), Took: 2 * time.Millisecond, Err: "connect: too many clients already"},
	}
	var out strings.Builder
	summarize(&out, answers, 5*time.Second)
	want := `
the local services during the run (a request to each every second):
  DynamoDB Local      3 answers (0 failed), median 17ms, slowest 31s at 03:04:06
  PostgreSQL          3 answers (1 failed), median 3ms, slowest 4ms at 03:04:07; most sessions 97 of 100 at 03:04:07
  source              2 answers (1 failed), median 1m0s, slowest 1m0s at 03:04:04
  answers that took more than 5s or failed (at most 20):
    03:04:04 source 1m0s: context deadline exceeded
    03:04:06 DynamoDB Local 31s
    03:04:08 PostgreSQL 2ms: connect: too many clients already
`
	if out.String() != want {
		t.Errorf("summary:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	summarize(&out, answers[:2], 5*time.Second)
	if !strings.HasSuffix(out.String(), "  no answer took more than 5s or failed\n") {
		t.Errorf("summary of quick answers:\n%s", out.String())
	}
}

// TestProbes: each service named in the environment is asked, a server
// error counts as a failure, and no error names the endpoint (COUCH_URL may
// hold credentials). PostgreSQL is the local one: a session counts the
// sessions, and a refused one's error does not hold the password.
func TestProbes(t *testing.T) {
	t.Parallel()
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("X-Amz-Target"))
		if strings.HasPrefix(r.URL.Path, "/broken") {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	env := map[string]string{
		"AWS_ENDPOINT_URL_DYNAMODB": srv.URL, "AWS_ENDPOINT_URL": srv.URL, "AWS_ENDPOINT_URL_S3": srv.URL + "/broken",
		"COUCH_URL": strings.Replace(srv.URL, "http://", "http://admin:sekrit@", 1), "PG_DSN": testenv.PostgresDSN(t),
	}
	ps := probes(func(k string) string { return env[k] })
	var names []string
	for _, p := range ps {
		a := ask(context.Background(), p)
		names = append(names, p.name)
		if wantErr := p.name == "moto S3"; (a.Err != "") != wantErr {
			t.Errorf("%s: error %q, want one: %v", p.name, a.Err, wantErr)
		}
		if p.name == "PostgreSQL" && (a.Sessions < 1 || a.Max < a.Sessions) {
			t.Errorf("PostgreSQL: %d sessions of %d, want its own at least, of max_connections", a.Sessions, a.Max)
		}
	}
	if want := "DynamoDB Local,LocalStack SQS,moto S3,source,PostgreSQL"; strings.Join(names, ",") != want {
		t.Errorf("probes %s, want %s", strings.Join(names, ","), want)
	}
	if want := "POST / DynamoDB_20120810.ListTables|GET /?Action=ListQueues&MaxResults=1 |GET /broken/ |GET / "; strings.Join(got, "|") != want {
		t.Errorf("requests %q, want %q", strings.Join(got, "|"), want)
	}

	down := probes(func(k string) string {
		if k == "COUCH_URL" {
			return "http://admin:sekrit@127.0.0.1:1"
		}
		return ""
	})
	a := ask(context.Background(), down[0])
	if a.Err == "" || strings.Contains(a.Err, "sekrit") || strings.Contains(a.Err, "127.0.0.1:1/") {
		t.Errorf("error of a source that refuses: %q, want one without the URL", a.Err)
	}
	wrong, err := url.Parse(testenv.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	wrong.User = url.UserPassword(wrong.User.Username(), "not-the-sekrit")
	var refused answer
	if err := pgSessions(context.Background(), wrong.String(), &refused); err == nil || strings.Contains(err.Error(), "not-the-sekrit") {
		t.Errorf("session with a wrong password: %v, want an error without the password", err)
	}
	if errorWithoutURL(errors.New("plain")).Error() != "plain" {
		t.Error("an error without a URL changed")
	}
}
