package syncgateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// countingTransport counts the requests a client sends.
type countingTransport struct {
	n    atomic.Int64
	next http.RoundTripper
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

func countingClient() (*http.Client, *countingTransport) {
	ct := &countingTransport{next: http.DefaultTransport.(*http.Transport).Clone()}
	return &http.Client{Transport: ct}, ct
}

// drain reads a stream until want reports every expected change seen, and
// returns the last state of each document.
func drain(t *testing.T, s *feed.Stream, c *feed.Client, done func(map[string]state) bool) map[string]state {
	t.Helper()
	got := map[string]state{}
	deadline := time.Now().Add(60 * time.Second)
	for !done(got) {
		if time.Now().After(deadline) {
			t.Fatalf("stream did not deliver everything within 60s; have %d documents", len(got))
		}
		b, err := s.Next(t.Context(), time.Second)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		if err := c.FetchDocs(t.Context(), b.Rows); err != nil {
			t.Fatalf("FetchDocs: %v", err)
		}
		for _, r := range b.Rows {
			st := state{Rev: r.Rev, Deleted: r.Deleted, Removed: r.Removed, Revoked: r.Revoked}
			if r.Doc != nil {
				_ = json.Unmarshal(r.Doc, &st.Body)
			}
			got[r.ID] = st
		}
	}
	return got
}

// TestStreamModesSyncGateway: continuous and websocket streams from Sync
// Gateway deliver what a long-poll reader sees, for a channel-restricted
// user, both fetch modes; continuous also reports revocations, websocket
// does not (Sync Gateway takes websocket options from a message that has no
// revocations field).
func TestStreamModesSyncGateway(t *testing.T) {
	t.Parallel()
	eachStreamCase(t, func(t *testing.T, mode, fetch string, db *testenv.SGDatabase, revs map[string]string, put func(string, map[string]any)) {
		put("before", orders(0, "orders"))
		db.WaitCached()
		edit := func(o *feed.Options) { o.Fetch, o.Limit = fetch, 10 }
		c := client(t, db.URL(), "alice", edit)
		_, _, since, _ := readAll(t, c, nil)

		s, err := c.Stream(t.Context(), since, feed.StreamOptions{Mode: mode})
		if err != nil {
			t.Fatalf("Stream: %v", err)
		}
		defer s.Close()
		for i := range 30 {
			put(fmt.Sprintf("s%02d ü/é", i), orders(i, "orders"))
		}
		put("eu", orders(1, "eu"))
		put("s00 ü/é", orders(100, "orders"))
		db.Delete("s01 ü/é", revs["s01 ü/é"])
		put("s02 ü/é", orders(2, "eu")) // moved out
		db.WaitCached()

		want, _, _, _ := readAll(t, client(t, db.URL(), "alice", edit), since)
		got := drain(t, s, c, func(m map[string]state) bool {
			return len(m) == len(want) && m["s02 ü/é"].Removed && m["s01 ü/é"].Deleted && m["s00 ü/é"].Rev == revs["s00 ü/é"]
		})
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("stream differs from long-poll (-longpoll +stream):\n%s", d)
		}

		// A grant, then a revocation of eu.
		db.SetChannels("alice", "orders", "eu")
		db.WaitCached()
		drain(t, s, c, func(m map[string]state) bool { return m["eu"].Rev == revs["eu"] && !m["eu"].Removed })
		db.SetChannels("alice", "orders")
		db.WaitCached()
		revoked := false
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline) && !revoked; {
			b, err := s.Next(t.Context(), 500*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range b.Rows {
				revoked = revoked || (r.ID == "eu" && r.Revoked)
			}
		}
		if wantRevoked := mode == config.ModeContinuous; revoked != wantRevoked {
			t.Errorf("revocation seen on %s: %t, want %t", mode, revoked, wantRevoked)
		}
	})
}

// eachStreamCase runs f as a parallel subtest for every streaming mode of
// Sync Gateway and every fetch mode, on a fresh database in which user alice
// (password alicepw) sees channel "orders"; put writes a document as the
// next revision of the one in revs, which it keeps.
func eachStreamCase(t *testing.T, f func(t *testing.T, mode, fetch string, db *testenv.SGDatabase, revs map[string]string, put func(string, map[string]any))) {
	for _, mode := range []string{config.ModeContinuous, config.ModeWebSocket} {
		for _, fetch := range fetchModes {
			t.Run(mode+"/"+fetch, func(t *testing.T) {
				t.Parallel()
				db := sg.CreateDB(t, "")
				db.PutUser("alice", "alicepw", "orders")
				revs := map[string]string{}
				f(t, mode, fetch, db, revs, func(id string, body map[string]any) { revs[id] = db.Put(id, revs[id], body) })
			})
		}
	}
}

// TestStreamModesRefused: a mode the source does not offer fails at once,
// permanently; a stream from a closed server fails transiently.
func TestStreamModesRefused(t *testing.T) {
	t.Parallel()
	db := sg.CreateDB(t, "")
	db.PutUser("alice", "alicepw", "orders")
	c := client(t, db.URL(), "alice", nil)
	if _, err := c.Stream(t.Context(), nil, feed.StreamOptions{Mode: config.ModeEventSource}); !errors.Is(err, feed.ErrModeUnsupported) {
		t.Errorf("eventsource on Sync Gateway: %v", err)
	}
	bad := client(t, db.URL(), "alice", func(o *feed.Options) { o.Password = "wrong" })
	for _, mode := range []string{config.ModeContinuous, config.ModeWebSocket} {
		_, err := bad.Stream(t.Context(), nil, feed.StreamOptions{Mode: mode})
		var se *feed.StatusError
		if !errors.As(err, &se) || se.Status != http.StatusUnauthorized || feed.Transient(err) {
			t.Errorf("%s with a wrong password: %v, want a permanent 401", mode, err)
		}
	}

	// pouchdb-server streams continuous, and answers eventsource as a normal feed.
	couch := testenv.CouchDB(t)
	pc, err := feed.New(feed.Options{SourceType: config.SourceCouchDB, URL: couch})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pc.Stream(t.Context(), nil, feed.StreamOptions{Mode: config.ModeEventSource, Heartbeat: time.Second}); !errors.Is(err, feed.ErrModeUnsupported) || feed.Transient(err) {
		t.Errorf("eventsource on pouchdb-server: %v, want permanent ErrModeUnsupported", err)
	}
}

// figures is one mode's measurement.
type figures struct {
	source, mode      string
	changes, requests int64
	p50, p95, max     time.Duration
}

// TestFeedModeFigures measures, for each way of reading the feed, the time
// from a write's answer to its row reaching the reader (include_docs, so no
// fetch) and the requests sent to the source per 1,000 changes, on Sync
// Gateway and pouchdb-server, with eight writers writing 1,000 documents as
// fast as the source takes them. It prints the figures (go test -v) and
// checks only that every change arrived.
func TestFeedModeFigures(t *testing.T) {
	const docs = 1000
	var mu sync.Mutex
	var all []figures
	run := func(t *testing.T, source, mode string, newClient func(hc *http.Client) *feed.Client, write func(i int)) {
		hc, ct := countingClient()
		c := newClient(hc)
		b, err := c.Changes(t.Context(), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		since := b.LastSeq
		for !b.CaughtUp() {
			if b, err = c.Changes(t.Context(), since, 0); err != nil {
				t.Fatal(err)
			}
			since = b.LastSeq
		}
		ct.n.Store(0)
		written := make([]time.Time, docs)
		var wmu sync.Mutex
		var writing sync.WaitGroup
		const writers = 8
		for w := range writers {
			writing.Go(func() {
				for i := w; i < docs; i += writers {
					write(i)
					wmu.Lock()
					written[i] = time.Now()
					wmu.Unlock()
				}
			})
		}
		seen := map[string]time.Time{} // first arrival of each id
		var next func() (*feed.Batch, error)
		if mode == config.ModeLongpoll {
			next = func() (*feed.Batch, error) {
				b, err := c.Changes(t.Context(), since, 2*time.Second)
				if err == nil {
					since = b.LastSeq
				}
				return b, err
			}
		} else {
			s, err := c.Stream(t.Context(), since, feed.StreamOptions{Mode: mode, Heartbeat: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			next = func() (*feed.Batch, error) { return s.Next(t.Context(), 2*time.Second) }
		}
		deadline := time.Now().Add(2 * time.Minute)
		for len(seen) < docs && time.Now().Before(deadline) {
			b, err := next()
			if err != nil {
				t.Fatalf("%s %s: %v", source, mode, err)
			}
			now := time.Now()
			for _, r := range b.Rows {
				if _, ok := seen[r.ID]; !ok && strings.HasPrefix(r.ID, "m") {
					seen[r.ID] = now
				}
			}
		}
		if len(seen) != docs {
			t.Fatalf("%s %s: %d of %d changes arrived", source, mode, len(seen), docs)
		}
		writing.Wait()
		// A row can arrive before its write's answer: that counts as 0.
		var lat []time.Duration
		wmu.Lock()
		for i, w := range written {
			lat = append(lat, max(seen[fmt.Sprintf("m%04d", i)].Sub(w), 0))
		}
		wmu.Unlock()
		slices.Sort(lat)
		f := figures{source: source, mode: mode, changes: docs, requests: ct.n.Load(),
			p50: lat[len(lat)/2], p95: lat[len(lat)*95/100], max: lat[len(lat)-1]}
		mu.Lock()
		all = append(all, f)
		mu.Unlock()
	}

	for _, mode := range []string{config.ModeLongpoll, config.ModeContinuous, config.ModeWebSocket} {
		t.Run("sync_gateway/"+mode, func(t *testing.T) {
			db := sg.CreateDB(t, "")
			db.PutUser("alice", "alicepw", "orders")
			run(t, "sync_gateway", mode, func(hc *http.Client) *feed.Client {
				return client(t, db.URL(), "alice", func(o *feed.Options) { o.HTTPClient = hc })
			}, func(i int) { db.Put(fmt.Sprintf("m%04d", i), "", orders(i, "orders")) })
		})
	}
	for _, mode := range []string{config.ModeLongpoll, config.ModeContinuous} {
		t.Run("couchdb/"+mode, func(t *testing.T) {
			couch := testenv.CouchDB(t)
			run(t, "couchdb (pouchdb-server)", mode, func(hc *http.Client) *feed.Client {
				c, err := feed.New(feed.Options{SourceType: config.SourceCouchDB, URL: couch, HTTPClient: hc})
				if err != nil {
					t.Fatal(err)
				}
				return c
			}, func(i int) {
				req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/m%04d", couch, i), strings.NewReader(`{"n":1}`))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
			})
		})
	}
	t.Logf("%-26s %-11s %9s %9s %9s %9s", "source", "mode", "req/1000", "p50", "p95", "max")
	for _, f := range all {
		t.Logf("%-26s %-11s %9d %9s %9s %9s", f.source, f.mode, f.requests*1000/f.changes,
			f.p50.Round(time.Millisecond), f.p95.Round(time.Millisecond), f.max.Round(time.Millisecond))
	}
}

// TestStreamContinuousCouchDB: pouchdb-server's continuous feed delivers what
// its long-poll feed does (writes, updates, deletes), both fetch modes.
func TestStreamContinuousCouchDB(t *testing.T) {
	t.Parallel()
	for _, fetch := range fetchModes {
		t.Run(fetch, func(t *testing.T) {
			t.Parallel()
			couch := testenv.CouchDB(t)
			newC := func() *feed.Client {
				c, err := feed.New(feed.Options{SourceType: config.SourceCouchDB, URL: couch, Fetch: fetch, Limit: 7})
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			c := newC()
			s, err := c.Stream(t.Context(), nil, feed.StreamOptions{Mode: config.ModeContinuous, Heartbeat: time.Second})
			if err != nil {
				t.Fatalf("Stream: %v", err)
			}
			defer s.Close()
			put := func(id, body string) string {
				req, _ := http.NewRequest(http.MethodPut, couch+"/"+url.PathEscape(id), strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var out struct{ Rev string }
				if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Rev == "" {
					t.Fatalf("put %s: %d %v", id, resp.StatusCode, err)
				}
				return out.Rev
			}
			revs := map[string]string{}
			for i := range 20 {
				id := fmt.Sprintf("c%02d é", i)
				revs[id] = put(id, `{"n":1}`)
			}
			revs["c00 é"] = put("c00 é", `{"n":2,"_rev":"`+revs["c00 é"]+`"}`)
			revs["c01 é"] = put("c01 é", `{"_deleted":true,"_rev":"`+revs["c01 é"]+`"}`)
			want, _, _, _ := readAll(t, newC(), nil)
			got := drain(t, s, c, func(m map[string]state) bool {
				return len(m) == 20 && m["c00 é"].Rev == revs["c00 é"] && m["c01 é"].Deleted
			})
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("continuous differs from long-poll (-longpoll +continuous):\n%s", d)
			}
		})
	}
}
