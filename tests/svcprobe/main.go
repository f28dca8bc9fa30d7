// Command svcprobe asks each local service for something small once a
// second while `make test` runs, and prints, when it is stopped (SIGTERM or
// SIGINT), how each answered: how many answers, the median, the slowest and
// when, and every answer slower than -slow. A test that failed because a
// service stopped answering for a while then shows it in the summary, which
// is at the end of make test's output, where a reader of its tail looks.
//
// The services are those localstack/env.sh names: DynamoDB Local
// (AWS_ENDPOINT_URL_DYNAMODB, a ListTables of one), LocalStack's SQS
// (AWS_ENDPOINT_URL, a ListQueues of one), moto's S3 (AWS_ENDPOINT_URL_S3,
// the bucket list), the CouchDB-compatible source (COUCH_URL, its welcome)
// and PostgreSQL (PG_DSN: a new session that counts the server's sessions,
// so that the summary also says how close the run came to
// max_connections, and a run that used them all shows it as failed
// answers). No endpoint is printed: COUCH_URL and PG_DSN may hold
// credentials. Every answer is also written to -log, one JSON object a
// line.
//
//	svcprobe -log .local/logs/services.jsonl
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// answer is one request to one service.
type answer struct {
	Service string        `json:"service"`
	At      time.Time     `json:"at"`
	Took    time.Duration `json:"took_ns"`
	Err     string        `json:"error,omitempty"`
	// Sessions is PostgreSQL's count of sessions, of Max (max_connections).
	Sessions int `json:"sessions,omitempty"`
	Max      int `json:"max_connections,omitempty"`
}

// probe is how one service is asked: ask fills in a's outcome.
type probe struct {
	name string
	ask  func(ctx context.Context, a *answer) error
}

func main() {
	logPath := flag.String("log", "", "write every answer to this file (JSON lines)")
	every := flag.Duration("every", time.Second, "time between two requests to a service")
	slow := flag.Duration("slow", 5*time.Second, "list every answer slower than this")
	flag.Parse()

	var log io.Writer = io.Discard
	if *logPath != "" {
		f, err := os.Create(*logPath)
		if err != nil {
			fmt.Fprintln(os.Stderr, "svcprobe:", err)
			os.Exit(1)
		}
		defer f.Close()
		log = f
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	var mu sync.Mutex
	var answers []answer
	enc := json.NewEncoder(log)
	var wg sync.WaitGroup
	for _, p := range probes(os.Getenv) {
		wg.Go(func() {
			for {
				a := ask(ctx, p)
				if ctx.Err() != nil {
					return
				}
				mu.Lock()
				answers = append(answers, a)
				_ = enc.Encode(a)
				mu.Unlock()
				select {
				case <-ctx.Done():
					return
				case <-time.After(*every):
				}
			}
		})
	}
	wg.Wait()
	summarize(os.Stdout, answers, *slow)
}

// ask times one request; a request still unanswered after a minute is
// recorded as such.
func ask(ctx context.Context, p probe) answer {
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	a := answer{Service: p.name, At: time.Now()}
	err := p.ask(rctx, &a)
	a.Took = time.Since(a.At)
	if err != nil {
		a.Err = err.Error()
	}
	return a
}

// fakeAuth is an Authorization header the local services accept; they do
// not check signatures.
const fakeAuth = "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/%s/aws4_request, SignedHeaders=host, Signature=0"

func probes(getenv func(string) string) []probe {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	request := func(base, path string, header http.Header, body string) func(context.Context, *answer) error {
		return func(ctx context.Context, _ *answer) error {
			method := http.MethodGet
			if body != "" {
				method = http.MethodPost
			}
			req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(base, "/")+path, strings.NewReader(body))
			if err != nil {
				return err
			}
			req.Header = header
			resp, err := client.Do(req)
			if err != nil {
				return errorWithoutURL(err)
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			if resp.StatusCode >= 500 {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			return nil
		}
	}
	var ps []probe
	if u := getenv("AWS_ENDPOINT_URL_DYNAMODB"); u != "" {
		ps = append(ps, probe{"DynamoDB Local", request(u, "/", http.Header{
			"X-Amz-Target": {"DynamoDB_20120810.ListTables"}, "Content-Type": {"application/x-amz-json-1.0"},
			"Authorization": {fmt.Sprintf(fakeAuth, "dynamodb")},
		}, `{"Limit":1}`)})
	}
	if u := getenv("AWS_ENDPOINT_URL"); u != "" {
		ps = append(ps, probe{"LocalStack SQS", request(u, "/?Action=ListQueues&MaxResults=1", http.Header{
			"Authorization": {fmt.Sprintf(fakeAuth, "sqs")},
		}, "")})
	}
	if u := getenv("AWS_ENDPOINT_URL_S3"); u != "" {
		ps = append(ps, probe{"moto S3", request(u, "/", http.Header{"Authorization": {fmt.Sprintf(fakeAuth, "s3")}}, "")})
	}
	if u := getenv("COUCH_URL"); u != "" {
		ps = append(ps, probe{"source", request(u, "/", http.Header{}, "")})
	}
	if dsn := getenv("PG_DSN"); dsn != "" {
		ps = append(ps, probe{"PostgreSQL", func(ctx context.Context, a *answer) error {
			return pgSessions(ctx, dsn, a)
		}})
	}
	return ps
}

// pgSessions opens a session with dsn, as a test's pool does, and has the
// server count its sessions into a. Its errors name neither the DSN nor
// its password.
func pgSessions(ctx context.Context, dsn string, a *answer) error {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return errors.New("PG_DSN is not a PostgreSQL DSN")
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		msg := err.Error()
		if cfg.Password != "" {
			msg = strings.ReplaceAll(msg, cfg.Password, "…")
		}
		return fmt.Errorf("connect: %s", msg)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, `SELECT count(*), current_setting('max_connections')::int FROM pg_stat_activity WHERE backend_type = 'client backend'`).Scan(&a.Sessions, &a.Max)
}

// errorWithoutURL keeps an HTTP client's error but not the URL it names,
// which may hold credentials.
func errorWithoutURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}

// summarize prints, service by service in the order of their names, how it
// answered, then every answer slower than slow or failed.
func summarize(w io.Writer, answers []answer, slow time.Duration) {
	if len(answers) == 0 {
		return
	}
	var order []string
	by := map[string][]answer{}
	for _, a := range answers {
		if _, ok := by[a.Service]; !ok {
			order = append(order, a.Service)
		}
		by[a.Service] = append(by[a.Service], a)
	}
	slices.Sort(order)
	fmt.Fprintf(w, "\nthe local services during the run (a request to each every second):\n")
	var notable []answer
	for _, s := range order {
		as := by[s]
		took := make([]time.Duration, len(as))
		slowest, failed := as[0], 0
		for i, a := range as {
			took[i] = a.Took
			if a.Took > slowest.Took {
				slowest = a
			}
			if a.Err != "" {
				failed++
			}
			if a.Err != "" || a.Took > slow {
				notable = append(notable, a)
			}
		}
		slices.Sort(took)
		fmt.Fprintf(w, "  %-15s %5d answers (%d failed), median %s, slowest %s at %s%s\n",
			s, len(as), failed, round(took[len(took)/2]), round(slowest.Took), slowest.At.UTC().Format("15:04:05"), mostSessions(as))
	}
	if len(notable) == 0 {
		fmt.Fprintf(w, "  no answer took more than %s or failed\n", slow)
		return
	}
	fmt.Fprintf(w, "  answers that took more than %s or failed (at most 20):\n", slow)
	slices.SortFunc(notable, func(a, b answer) int { return a.At.Compare(b.At) })
	for _, a := range notable[:min(20, len(notable))] {
		line := fmt.Sprintf("    %s %s %s", a.At.UTC().Format("15:04:05"), a.Service, round(a.Took))
		if a.Err != "" {
			line += ": " + a.Err
		}
		fmt.Fprintln(w, line)
	}
}

// mostSessions says when a service's answers counted the most sessions, and
// of how many it allows; "" when none counted any.
func mostSessions(as []answer) string {
	most := as[0]
	for _, a := range as {
		if a.Sessions > most.Sessions {
			most = a
		}
	}
	if most.Sessions == 0 {
		return ""
	}
	return fmt.Sprintf("; most sessions %d of %d at %s", most.Sessions, most.Max, most.At.UTC().Format("15:04:05"))
}

func round(d time.Duration) time.Duration {
	if d < 10*time.Millisecond {
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(time.Millisecond)
}
