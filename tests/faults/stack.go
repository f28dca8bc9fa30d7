package faults

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go/logging"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/lease"
	"github.com/changes-worker/changes-worker/shared/pgsink"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/provision"
	"github.com/changes-worker/changes-worker/shared/sample"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// StackOptions shape a stack's one job.
type StackOptions struct {
	// Name makes the stack's resources unique: lowercase letters, digits and
	// '-', at most 20 characters; a random suffix is added.
	Name string
	// TTL is the job's lease TTL. Default 10s.
	TTL time.Duration
	// Limit is the feed's batch size. Default 200.
	Limit int
	// FeedTimeout is the long-poll timeout sent to the source. Default 10s.
	FeedTimeout time.Duration
	// Dir receives the configuration file.
	Dir string
}

// Stack is one isolated pipeline: its own table, queues, source database and
// PostgreSQL tables. Its job "orders" has one PostgreSQL output "pg" on a
// standard queue.
type Stack struct {
	Name       string
	SourceURL  string // the source database
	Table      string // the output's PostgreSQL data table
	ConfigPath string
	Config     *config.File
	Deps       *pipeline.Deps // in-process dependencies (writer, checks)
	Store      *lease.Store
	QueueURL   string
	QueueARN   string
	TTL        time.Duration
	Limit      int // the feed's batch size

	hc   *http.Client
	pool *pgxpool.Pool
}

// NewStack provisions a stack. Close removes its source database and tables.
func NewStack(ctx context.Context, o StackOptions) (*Stack, error) {
	testenv.SetAWSEnv()
	if o.TTL == 0 {
		o.TTL = config.DefaultLeaseTTL
	}
	if o.Limit == 0 {
		o.Limit = 200
	}
	if o.FeedTimeout == 0 {
		o.FeedTimeout = config.DefaultFeedTimeout
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := strings.Trim(o.Name, "-")
	if len(name) > 20 {
		name = name[:20]
	}
	name += "-" + hex.EncodeToString(b)
	s := &Stack{
		Name:      name,
		SourceURL: couchURL() + "/" + name,
		Table:     strings.ReplaceAll(name, "-", "_"),
		TTL:       o.TTL,
		Limit:     o.Limit,
		hc:        &http.Client{Timeout: 2 * time.Minute},
	}
	doc := fmt.Sprintf(`{
  "stack": {"prefix": %q, "bucket": "changes-worker-tests", "poller_timeout": "60s", "writer_timeout": "20s"},
  "jobs": [{"id": %q, "source": {"type": "couchdb", "url": %q},
    "feed": {"limit": %d, "timeout": %q}, "lease": {"ttl": %q},
    "outputs": [{"id": %q, "type": "postgres", "max_receive_count": 20,
      "postgres": {"dsn": {"env": %q}, "table": %q, "create_tables": true}}]}]}
`, name, Job, s.SourceURL, o.Limit, o.FeedTimeout.String(), o.TTL.String(), Output, dsnEnv, s.Table)
	s.ConfigPath = filepath.Join(o.Dir, name+".json")
	if err := os.WriteFile(s.ConfigPath, []byte(doc), 0o644); err != nil {
		return nil, fmt.Errorf("write stack config: %w", err)
	}
	var err error
	if s.Config, err = config.Load(s.ConfigPath); err != nil {
		return nil, fmt.Errorf("load stack config: %w", err)
	}
	awsCfg, err := awsconf.Load(ctx)
	if err != nil {
		return nil, err
	}
	// The SDK warns, now and then, that it could not drain a response the
	// emulator had already closed; the response itself was read in full.
	// Keep the test output to the tests' own messages.
	awsCfg.Logger = logging.Nop{}
	s.Deps = pipeline.New(s.Config, awsCfg, lookup, slog.New(slog.DiscardHandler), io.Discard)
	if _, err := provision.Apply(ctx, provision.Clients{DynamoDB: s.Deps.DynamoDB, SQS: s.Deps.SQS, S3: s.Deps.S3}, s.Config); err != nil {
		s.Deps.Close()
		return nil, fmt.Errorf("provision stack %s (start the local services with `make up`): %w", name, err)
	}
	s.Store = lease.New(s.Deps.DynamoDB, s.Config.TableName())
	if err := s.findQueue(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if err := sample.CreateDB(ctx, s.hc, s.SourceURL); err != nil {
		s.Close()
		return nil, fmt.Errorf("create source database: %w", err)
	}
	if s.pool, err = pgxpool.New(ctx, postgresDSN()); err != nil {
		s.Close()
		return nil, fmt.Errorf("connect postgres: %w", err)
	}
	if err := s.createTables(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Stack) findQueue(ctx context.Context) error {
	j := s.Config.Jobs[0]
	name := s.Config.QueueName(j, j.Outputs[0])
	u, err := s.Deps.SQS.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		return fmt.Errorf("get queue url %s: %w", name, err)
	}
	s.QueueURL = aws.ToString(u.QueueUrl)
	a, err := s.Deps.SQS.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: u.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn},
	})
	if err != nil {
		return fmt.Errorf("get queue arn %s: %w", name, err)
	}
	s.QueueARN = a.Attributes["QueueArn"]
	return nil
}

// auditTable records, with its transaction id, every write to the output's
// data table and every write to its versions table, so that writes which
// did not come with a raise of the document's version can be counted.
func (s *Stack) auditTable() string    { return s.Table + "_audit" }
func (s *Stack) versionsTable() string { return s.Table + "_versions" }

// createTables creates the output's tables as the writer would, and
// triggers that fill the audit table.
func (s *Stack) createTables(ctx context.Context) error {
	out := s.Config.Jobs[0].Outputs[0]
	sink, err := pgsink.New(s.pool, *out.Postgres, out.ID)
	if err != nil {
		return fmt.Errorf("postgres sink: %w", err)
	}
	if err := sink.CreateTables(ctx); err != nil {
		return err
	}
	audit := pgx.Identifier{s.auditTable()}.Sanitize()
	vfn := pgx.Identifier{s.Table + "_audit_v"}.Sanitize()
	dfn := pgx.Identifier{s.Table + "_audit_d"}.Sanitize()
	stmts := []string{
		// kind: 'version' (a versions row written; raised when its
		// (generation, counter) went up or it is new) or 'data' (a data row
		// inserted, updated or deleted).
		`CREATE TABLE IF NOT EXISTS ` + audit + ` (
    doc_id text NOT NULL, kind text NOT NULL, raised boolean NOT NULL, txid bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp())`,
		`CREATE OR REPLACE FUNCTION ` + vfn + `() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ` + audit + ` (doc_id, kind, raised, txid)
    VALUES (NEW.doc_id, 'version',
            TG_OP = 'INSERT' OR (NEW.generation, NEW.counter) > (OLD.generation, OLD.counter), txid_current());
    RETURN NULL;
END $$`,
		`CREATE OR REPLACE FUNCTION ` + dfn + `() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ` + audit + ` (doc_id, kind, raised, txid)
    VALUES (CASE WHEN TG_OP = 'DELETE' THEN OLD.doc_id ELSE NEW.doc_id END, 'data', false, txid_current());
    RETURN NULL;
END $$`,
		`CREATE TRIGGER ` + pgx.Identifier{s.Table + "_audit_vt"}.Sanitize() + ` AFTER INSERT OR UPDATE ON ` +
			pgx.Identifier{s.versionsTable()}.Sanitize() + ` FOR EACH ROW EXECUTE FUNCTION ` + vfn + `()`,
		`CREATE TRIGGER ` + pgx.Identifier{s.Table + "_audit_dt"}.Sanitize() + ` AFTER INSERT OR UPDATE OR DELETE ON ` +
			pgx.Identifier{s.Table}.Sanitize() + ` FOR EACH ROW EXECUTE FUNCTION ` + dfn + `()`,
	}
	for _, q := range stmts {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("create audit triggers: %w", err)
		}
	}
	return nil
}

// Close deletes the source database and the PostgreSQL tables, and closes
// the in-process clients. The AWS resources stay (the emulator is scratch).
func (s *Stack) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = sample.DeleteDB(ctx, s.hc, s.SourceURL)
	if s.pool != nil {
		for _, t := range []string{s.Table, s.versionsTable(), s.auditTable()} {
			_, _ = s.pool.Exec(ctx, `DROP TABLE IF EXISTS `+pgx.Identifier{t}.Sanitize()+` CASCADE`)
		}
		for _, f := range []string{s.Table + "_audit_v", s.Table + "_audit_d"} {
			_, _ = s.pool.Exec(ctx, `DROP FUNCTION IF EXISTS `+pgx.Identifier{f}.Sanitize()+`()`)
		}
		s.pool.Close()
	}
	s.Deps.Close()
}

// LoadSample writes n sample orders into the source (a backlog).
func (s *Stack) LoadSample(ctx context.Context, n int) error {
	if _, err := sample.Load(ctx, s.hc, s.SourceURL, sample.Options{Docs: n, UpdateEvery: 5, DeleteEvery: 11, Seed: 11}); err != nil {
		return fmt.Errorf("load sample: %w", err)
	}
	return nil
}

// UpdateSeq is the source database's current update sequence (pouchdb and
// CouchDB 1.x give an integer).
func (s *Stack) UpdateSeq(ctx context.Context) (int64, error) {
	var info struct {
		UpdateSeq json.RawMessage `json:"update_seq"`
	}
	if err := s.getJSON(ctx, s.SourceURL, &info); err != nil {
		return 0, err
	}
	return SeqNumber(info.UpdateSeq)
}

// SeqNumber reads an integer sequence (a JSON number or a string holding
// one); a nil seq is 0, the beginning of the feed.
func SeqNumber(seq json.RawMessage) (int64, error) {
	if len(seq) == 0 {
		return 0, nil
	}
	txt := strings.Trim(string(seq), `"`)
	n, err := strconv.ParseInt(txt, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("seq %s is not an integer", seq)
	}
	return n, nil
}

// SourceWinners returns doc id → winning revision of every live document.
func (s *Stack) SourceWinners(ctx context.Context) (map[string]string, error) {
	var all struct {
		Rows []struct {
			ID    string `json:"id"`
			Value struct {
				Rev string `json:"rev"`
			} `json:"value"`
		} `json:"rows"`
	}
	if err := s.getJSON(ctx, s.SourceURL+"/_all_docs", &all); err != nil {
		return nil, err
	}
	got := make(map[string]string, len(all.Rows))
	for _, r := range all.Rows {
		got[r.ID] = r.Value.Rev
	}
	return got, nil
}

func (s *Stack) getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return fmt.Errorf("read source: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("read source %s: status %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("decode source answer: %w", err)
	}
	return nil
}

// PGDocs returns doc id → revision of the rows of the output's data table.
func (s *Stack) PGDocs(ctx context.Context) (map[string]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT doc_id, rev FROM `+pgx.Identifier{s.Table}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("read output table: %w", err)
	}
	got := map[string]string{}
	var id, rev string
	_, err = pgx.ForEachRow(rows, []any{&id, &rev}, func() error {
		got[id] = rev
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read output table: %w", err)
	}
	return got, nil
}

// Stored is a document's row in the output's versions table.
type Stored struct {
	Version change.Version
	Rev     string
	Deleted bool
}

// PGVersions returns doc id → the version the output holds.
func (s *Stack) PGVersions(ctx context.Context) (map[string]Stored, error) {
	rows, err := s.pool.Query(ctx, `SELECT doc_id, generation, counter, rev, deleted FROM `+pgx.Identifier{s.versionsTable()}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("read versions table: %w", err)
	}
	got := map[string]Stored{}
	var id string
	var st Stored
	_, err = pgx.ForEachRow(rows, []any{&id, &st.Version.Generation, &st.Version.Counter, &st.Rev, &st.Deleted}, func() error {
		got[id] = st
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read versions table: %w", err)
	}
	return got, nil
}

// Applications counts the changes the output applied (raises of a
// document's version: a versions row inserted, or updated to a greater
// (generation, counter)) and the stale writes: a versions row updated
// without a raise, or a data row inserted, updated or deleted in a
// transaction that did not raise that document's version. A sink that
// applies changes only when newer has no stale write, whatever the
// duplicates, reordering and zombies upstream.
func (s *Stack) Applications(ctx context.Context) (applied, stale int64, err error) {
	audit := pgx.Identifier{s.auditTable()}.Sanitize()
	err = s.pool.QueryRow(ctx, `WITH tx AS (
    SELECT doc_id, txid,
        count(*) FILTER (WHERE kind = 'version' AND raised) AS raised,
        count(*) FILTER (WHERE kind = 'version' AND NOT raised) AS unraised,
        count(*) FILTER (WHERE kind = 'data') AS data
    FROM `+audit+` GROUP BY doc_id, txid)
SELECT coalesce(sum(raised), 0)::bigint,
    (coalesce(sum(unraised), 0) + coalesce(sum(data) FILTER (WHERE raised = 0), 0))::bigint
FROM tx`).Scan(&applied, &stale)
	if err != nil {
		return 0, 0, fmt.Errorf("read audit table: %w", err)
	}
	return applied, stale, nil
}

// Drift compares the output with the source's winners: documents missing
// from PostgreSQL, documents it holds that the source deleted, and documents
// whose revision differs. Empty means equal.
func Drift(source, pg map[string]string) []string {
	var out []string
	for id, rev := range source {
		got, ok := pg[id]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s: missing (source %s)", id, rev))
		case got != rev:
			out = append(out, fmt.Sprintf("%s: rev %s, source %s", id, got, rev))
		}
	}
	for id, rev := range pg {
		if _, ok := source[id]; !ok {
			out = append(out, fmt.Sprintf("%s: rev %s held, deleted in the source", id, rev))
		}
	}
	return out
}

// errNotCaughtUp is returned by WaitCaughtUp when the deadline passes.
var errNotCaughtUp = errors.New("job did not catch up with the source")

// WaitCaughtUp waits until the job's checkpoint reaches the source's update
// sequence (take it once the source stopped changing).
func (s *Stack) WaitCaughtUp(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		want, err := s.UpdateSeq(ctx)
		if err != nil {
			return err
		}
		st, err := s.Store.Get(ctx, Job)
		if err == nil {
			if got, err := SeqNumber(st.Checkpoint); err == nil && got >= want {
				return nil
			}
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return fmt.Errorf("%w within %s (update_seq %d, checkpoint %s)", errNotCaughtUp, timeout, want, checkpointOf(st))
		}
	}
}

func checkpointOf(st *lease.State) string {
	if st == nil {
		return "unknown"
	}
	return string(st.Checkpoint)
}
