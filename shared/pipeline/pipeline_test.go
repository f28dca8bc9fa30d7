package pipeline

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/secret"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// TestHTTPSinkResolvesEverySecret: the writer's HTTP sink gets the headers
// given by reference and the url_secret from the secret resolver.
func TestHTTPSinkResolvesEverySecret(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var path, key, source string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		path, key, source = r.URL.EscapedPath(), r.Header.Get("X-Api-Key"), r.Header.Get("X-Source")
	}))
	t.Cleanup(srv.Close)
	f, err := config.Parse([]byte(`{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"outputs":[
		{"id":"h","type":"http","http":{"url":"` + srv.URL + `/hooks/{secret}/{doc_id}","url_secret":{"env":"HOOK_PATH"},
			"headers":{"X-Api-Key":{"env":"API_KEY"},"X-Source":"demo"}}}]}]}`))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	env := map[string]string{"HOOK_PATH": "T1/B2", "API_KEY": "k-9"}
	d := &Deps{Config: f, Secrets: &secret.Resolver{Lookup: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}}
	j := f.Jobs[0]
	s, err := d.Sink(t.Context(), config.Route{Job: j, Output: j.Outputs[0]})
	if err != nil {
		t.Fatalf("open sink: %v", err)
	}
	c := &change.Envelope{V: 1, Job: "a", Output: "h", DocID: "d1", Rev: "1-a", Seq: []byte(`1`),
		Version: change.Version{Generation: 1, Counter: 1}, Doc: []byte(`{"_id":"d1"}`)}
	if err := s.Apply(t.Context(), []*change.Envelope{c})[0]; err != nil {
		t.Fatalf("apply: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join([]string{path, key, source}, " "); got != "/hooks/T1/B2/d1 k-9 demo" {
		t.Errorf("endpoint saw %q, want %q", got, "/hooks/T1/B2/d1 k-9 demo")
	}

	delete(env, "API_KEY")
	if _, err := d.Sink(t.Context(), config.Route{Job: j, Output: j.Outputs[0]}); err == nil || !strings.Contains(err.Error(), "X-Api-Key") {
		t.Errorf("open sink without the header's secret: got %v, want an error naming X-Api-Key", err)
	}
}

// Against PostgreSQL: a DSN reference that resolves to another connection
// string (a rotated secret) gets a new pool, and the old pool is closed once
// no reference resolves to its connection string any more; references that
// resolve to the same one share a pool; Close closes the rest.
func TestPoolClosedWhenItsDSNRotates(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	base := testenv.PostgresDSN(t)
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	dsn := func(app string) string { return base + sep + "application_name=" + app }
	var mu sync.Mutex
	env := map[string]string{"DSN_A": dsn("rotate-1"), "DSN_B": dsn("rotate-1")}
	set := func(k, v string) {
		mu.Lock()
		defer mu.Unlock()
		env[k] = v
	}
	d := &Deps{Secrets: &secret.Resolver{Lookup: func(k string) (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		v, ok := env[k]
		return v, ok
	}}}
	a := &config.PostgresOutput{DSN: config.SecretRef{Env: "DSN_A"}, MaxConns: 2}
	b := &config.PostgresOutput{DSN: config.SecretRef{Env: "DSN_B"}, MaxConns: 2}
	pool := func(pg *config.PostgresOutput) *pgxpool.Pool {
		t.Helper()
		p, err := d.Pool(ctx, pg)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Ping(ctx); err != nil {
			t.Fatalf("ping a pool just returned: %v", err)
		}
		return p
	}
	// closed waits for a pool to be closed, at most a few seconds.
	closed := func(p *pgxpool.Pool) bool {
		for range 50 {
			if err := p.Ping(ctx); err != nil {
				return true
			}
			time.Sleep(100 * time.Millisecond)
		}
		return false
	}
	first := pool(a)
	if pool(b) != first {
		t.Fatal("two references to the same connection string got two pools")
	}
	set("DSN_A", dsn("rotate-2"))
	second := pool(a)
	if second == first {
		t.Fatal("a rotated DSN got the old pool")
	}
	if err := first.Ping(ctx); err != nil {
		t.Fatalf("the pool of a DSN another reference still resolves to was closed: %v", err)
	}
	set("DSN_B", dsn("rotate-3"))
	third := pool(b)
	if !closed(first) {
		t.Error("the pool of a connection string no reference resolves to any more is still open")
	}
	d.Close()
	if !closed(second) || !closed(third) {
		t.Error("Close left a pool open")
	}
}
