package poll_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/metrics"
	"github.com/changes-worker/changes-worker/shared/poll"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/statetable/quarantine"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// hostileRig runs the poller with the real feed client against a scripted
// source, and the real lease and quarantine stores on the local DynamoDB;
// the sender records what would be queued.
type hostileRig struct {
	db      *dynamodb.Client
	table   string
	job     *config.Job
	source  *httptest.Server
	sent    *recordingSender
	metrics *bytes.Buffer
	reads   *readLog
}

// readLog records the since of every _changes request.
type readLog struct {
	mu     sync.Mutex
	sinces []string
}

func (l *readLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sinces = append(l.sinces, s)
}

func (l *readLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.sinces)
}

// newHostileRig serves pages by the since asked for ("" for none); a GET
// of a document answers docs[id].
func newHostileRig(t *testing.T, pages map[string]string, docs map[string]string) *hostileRig {
	t.Helper()
	db := dynamodb.NewFromConfig(testenv.AWS(t))
	table := testenv.Name(t)
	_, err := db.CreateTable(t.Context(), &dynamodb.CreateTableInput{
		TableName:            &table,
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("job_id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("job_id"), KeyType: types.KeyTypeHash}},
	})
	if err != nil {
		t.Fatalf("create table: %v", err)
	}
	t.Cleanup(func() { db.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: &table}) })
	r := &hostileRig{db: db, table: table, sent: &recordingSender{}, metrics: &bytes.Buffer{}, reads: &readLog{}}
	r.source = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if req.URL.Path == "/db/_changes" {
			since := req.URL.Query().Get("since")
			r.reads.add(since)
			page, ok := pages[since]
			if !ok {
				page = `{"results":[],"last_seq":` + strings.TrimSpace(pages["last"]) + `}`
			}
			io.WriteString(w, page)
			return
		}
		if body, ok := docs[strings.TrimPrefix(req.URL.Path, "/db/")]; ok {
			io.WriteString(w, body)
			return
		}
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error":"not_found","reason":"missing"}`)
	}))
	t.Cleanup(r.source.Close)
	r.job = &config.Job{ID: "hostile", Source: config.Source{Type: config.SourceCouchDB, URL: r.source.URL + "/db"},
		Feed:  config.Feed{Limit: 100, Timeout: config.Duration(time.Second), Fetch: config.FetchIncludeDocs, QuarantineAfter: 3},
		Lease: config.Lease{TTL: config.Duration(10 * time.Second)}}
	return r
}

// run runs one invocation of about d.
func (r *hostileRig) run(t *testing.T, d time.Duration) (poll.Result, error) {
	t.Helper()
	fc, err := feed.New(feed.Options{SourceType: r.job.Source.Type, URL: r.job.Source.URL, Limit: r.job.Feed.Limit,
		Fetch: r.job.Feed.Fetch, Slack: time.Second, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p := &poll.Poller{
		Job: r.job, Feed: fc, Leases: lease.New(r.db, r.table), Sender: r.sent,
		Targets:    []fanout.Target{{Output: "o", QueueURL: "unused"}},
		Quarantine: &quarantine.Store{DB: r.db, Table: r.table},
		Log:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		Metrics:    metrics.New(r.metrics, map[string]string{"Job": r.job.ID}),
	}
	return p.Run(t.Context(), poll.Invocation{Owner: "test", Host: "h", Deadline: time.Now().Add(d)})
}

// checkpoint reads the stored checkpoint.
func (r *hostileRig) checkpoint(t *testing.T) string {
	t.Helper()
	st, err := lease.New(r.db, r.table).Get(t.Context(), r.job.ID)
	if err != nil {
		t.Fatal(err)
	}
	return string(st.Checkpoint)
}

// metricSum adds up a metric's values in the EMF records written.
func (r *hostileRig) metricSum(name string) float64 {
	var sum float64
	for _, line := range strings.Split(r.metrics.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		switch v := rec[name].(type) {
		case float64:
			sum += v
		case []any:
			for _, x := range v {
				f, _ := x.(float64)
				sum += f
			}
		}
	}
	return sum
}

// recordingSender records the changes it is given.
type recordingSender struct {
	mu      sync.Mutex
	changes []*change.Envelope
}

func (s *recordingSender) Send(_ context.Context, _ []fanout.Target, changes []*change.Envelope, fence fanout.Fence) (fanout.Stats, error) {
	if err := fence(); err != nil {
		return fanout.Stats{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.changes = append(s.changes, changes...)
	return fanout.Stats{Messages: len(changes)}, nil
}

func (s *recordingSender) docs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, c := range s.changes {
		ids = append(ids, c.DocID+"@"+c.Rev)
	}
	return ids
}

// TestRunQuarantinesARowThatNamesNoDocument: a row with no id between two
// good ones is read again QuarantineAfter times, then recorded in the
// quarantine with its reason and raw bytes and skipped; the job moves on,
// and the documents around it are queued.
func TestRunQuarantinesARowThatNamesNoDocument(t *testing.T) {
	t.Parallel()
	bad := `{"seq":2,"changes":[{"rev":"1-x"}]}`
	r := newHostileRig(t, map[string]string{
		"": `{"results":[{"seq":1,"id":"a","changes":[{"rev":"1-a"}],"doc":{"_id":"a","_rev":"1-a"}},` + bad +
			`,{"seq":3,"id":"b","changes":[{"rev":"1-b"}],"doc":{"_id":"b","_rev":"1-b"}}],"last_seq":3}`,
		"1":    `{"results":[` + bad + `,{"seq":3,"id":"b","changes":[{"rev":"1-b"}],"doc":{"_id":"b","_rev":"1-b"}}],"last_seq":3}`,
		"last": `3`,
	}, nil)
	if _, err := r.run(t, 5*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := r.sent.docs(); !slices.Equal(got, []string{"a@1-a", "b@1-b"}) {
		t.Errorf("queued %v, want a and b", got)
	}
	if got := r.checkpoint(t); got != `3` {
		t.Errorf("checkpoint %s, want 3 (past the quarantined row)", got)
	}
	entries, err := quarantine.List(t.Context(), r.db, r.table, r.job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("quarantine holds %+v, want the one row", entries)
	}
	e := entries[0]
	if e.Kind != quarantine.Row || string(e.Seq) != `2` || string(e.After) != `1` || string(e.Raw) != bad ||
		e.Reason != "the row has no id" || e.Attempts != 3 || e.FirstSeen.IsZero() {
		t.Errorf("entry %+v, want row 2 after 1, its bytes, its reason, 3 attempts", e)
	}
	if got := r.reads.all(); slices.Index(got, "3") < 0 || len(slices.DeleteFunc(slices.Clone(got), func(s string) bool { return s != "1" })) != 2 {
		t.Errorf("reads from %q, want the row read again from 1 twice, then on from 3", got)
	}
	if n := r.metricSum(metrics.MalformedRows); n != 1 {
		t.Errorf("MalformedRows = %v, want 1", n)
	}
}

// TestRunFetchesARowWithoutRevision: a row that names a document but has no
// changes list (and one with no seq) is a change of that document: its
// current winner is fetched and queued.
func TestRunFetchesARowWithoutRevision(t *testing.T) {
	t.Parallel()
	r := newHostileRig(t, map[string]string{
		"":     `{"results":[{"seq":1,"id":"x"},{"seq":null,"id":"y","changes":[{"rev":"2-y"}]},{"seq":3,"id":"z","changes":[{"rev":"1-z"}]}],"last_seq":3}`,
		"last": `3`,
	}, map[string]string{"x": `{"_id":"x","_rev":"4-x","v":1}`})
	r.job.Feed.Fetch = config.FetchBulkGet
	r.source.Config.Handler = withBulkGet(r.source.Config.Handler, map[string]string{
		"y 2-y": `{"_id":"y","_rev":"2-y"}`, "z 1-z": `{"_id":"z","_rev":"1-z"}`,
	})
	if _, err := r.run(t, 4*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := r.sent.docs(); !slices.Equal(got, []string{"x@4-x", "y@2-y", "z@1-z"}) {
		t.Errorf("queued %v, want x at its winner, y and z", got)
	}
	if got := r.checkpoint(t); got != `3` {
		t.Errorf("checkpoint %s, want 3", got)
	}
}

// withBulkGet answers _bulk_get from answers keyed "id rev".
func withBulkGet(next http.Handler, answers map[string]string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/db/_bulk_get" {
			next.ServeHTTP(w, req)
			return
		}
		var in struct {
			Docs []struct{ ID, Rev string } `json:"docs"`
		}
		json.NewDecoder(req.Body).Decode(&in)
		var results []string
		for _, d := range in.Docs {
			body, ok := answers[d.ID+" "+d.Rev]
			if !ok {
				body = `null`
			}
			results = append(results, `{"id":"`+d.ID+`","docs":[{"ok":`+body+`}]}`)
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"results":[`+strings.Join(results, ",")+`]}`)
	})
}

// TestRunBlockedPage: a page that cannot be parsed from a position is never
// skipped (nothing says where it ends): the checkpoint stays, the poller
// keeps reading it, and from the third failure it is recorded as blocked in
// the quarantine and counted in MalformedPages.
func TestRunBlockedPage(t *testing.T) {
	t.Parallel()
	r := newHostileRig(t, map[string]string{
		"":  `{"results":[{"seq":1,"id":"a","changes":[{"rev":"1-a"}],"doc":{"_id":"a","_rev":"1-a"}}],"last_seq":1}`,
		"1": `{"results":[{"seq":2,"id":"b","chan`,
	}, nil)
	res, err := r.run(t, 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "malformed response") {
		t.Errorf("Run = %v, want the malformed page's error", err)
	}
	if got := r.checkpoint(t); got != `1` || string(res.Checkpoint) != `1` {
		t.Errorf("checkpoint %s, want 1: the page is not skipped", got)
	}
	entries, lerr := quarantine.List(t.Context(), r.db, r.table, r.job.ID)
	if lerr != nil {
		t.Fatal(lerr)
	}
	if len(entries) != 1 || entries[0].Kind != quarantine.Page || string(entries[0].Seq) != `1` || entries[0].Attempts < 3 ||
		!strings.Contains(entries[0].Reason, "malformed response") {
		t.Fatalf("quarantine holds %+v, want the page blocked at 1 after at least 3 attempts", entries)
	}
	reads := len(slices.DeleteFunc(r.reads.all(), func(s string) bool { return s != "1" }))
	if got := r.metricSum(metrics.MalformedPages); got != float64(reads-2) || got < 1 {
		t.Errorf("MalformedPages = %v after %d failed reads, want one per failure from the third", got, reads)
	}
}

// TestRunCheckpointNeverGoesBack: rows at 8 and 9 with last_seq 3 leave the
// checkpoint at 9.
func TestRunCheckpointNeverGoesBack(t *testing.T) {
	t.Parallel()
	r := newHostileRig(t, map[string]string{
		"": `{"results":[{"seq":8,"id":"a","changes":[{"rev":"1-a"}],"doc":{"_id":"a","_rev":"1-a"}},` +
			`{"seq":9,"id":"b","changes":[{"rev":"1-b"}],"doc":{"_id":"b","_rev":"1-b"}}],"last_seq":3}`,
		"last": `9`,
	}, nil)
	if _, err := r.run(t, 3*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := r.checkpoint(t); got != `9` {
		t.Errorf("checkpoint %s, want 9", got)
	}
	for _, s := range r.reads.all() {
		if s == "3" {
			t.Errorf("the poller read from 3: the checkpoint went back")
		}
	}
}
