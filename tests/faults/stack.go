package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/pgsink"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

// StackOptions shape a stack's one job.
type StackOptions struct {
	// Name labels the stack's resources (testenv.UniqueName makes them
	// unique).
	Name string
	// TTL is the job's lease TTL. Default 10s.
	TTL time.Duration
	// Limit is the feed's batch size. Default 200.
	Limit int
	// FeedTimeout is the long-poll timeout sent to the source. Default 10s.
	FeedTimeout time.Duration
	// SendConcurrency is the job's send_concurrency. Default
	// SendConcurrency.
	SendConcurrency int
	// Fetch is the job's feed.fetch. Default include_docs.
	Fetch string
	// SourceBase, when set, is the base URL at which the pollers reach the
	// source: a proxy to it (see stack.Options.SourceBase).
	SourceBase string
}

// Stack is one isolated pipeline (testenv/stack): its own table, queues,
// source database and PostgreSQL tables. Its job "orders" has one
// PostgreSQL output "pg" on a standard queue, whose writes an audit table
// records (Applications).
type Stack struct {
	*stack.Stack
	QueueURL string
	QueueARN string
	TTL      time.Duration
	Limit    int // the feed's batch size

	hc             *http.Client
	pool           *pgxpool.Pool
	data, versions pgx.Identifier // the output's tables
	state          *pgsink.State  // the output's state reader
}

// NewStack provisions a stack. Close removes it.
func NewStack(ctx context.Context, o StackOptions) (*Stack, error) {
	if o.TTL == 0 {
		o.TTL = config.DefaultLeaseTTL
	}
	if o.Limit == 0 {
		o.Limit = 200
	}
	if o.FeedTimeout == 0 {
		o.FeedTimeout = config.DefaultFeedTimeout
	}
	if o.SendConcurrency == 0 {
		o.SendConcurrency = SendConcurrency
	}
	cfg := &config.File{
		Stack: config.Stack{PollerTimeout: config.Duration(time.Minute), WriterTimeout: config.Duration(20 * time.Second)},
		Jobs: []*config.Job{{
			ID:    Job,
			Feed:  config.Feed{Limit: o.Limit, Timeout: config.Duration(o.FeedTimeout), Fetch: o.Fetch},
			Lease: config.Lease{TTL: config.Duration(o.TTL)},
			// The requests in flight a fenced poller may still finish.
			SendConcurrency: o.SendConcurrency,
			Outputs: []*config.Output{{ID: Output, Type: config.OutputPostgres, MaxReceiveCount: 20,
				Postgres: &config.PostgresOutput{CreateTables: true}}},
		}},
	}
	base, err := stack.New(ctx, stack.Options{Name: o.Name, Config: cfg, SourceBase: o.SourceBase})
	if err != nil {
		return nil, err
	}
	s := &Stack{Stack: base, TTL: o.TTL, Limit: o.Limit, hc: &http.Client{Timeout: 2 * time.Minute}}
	if err := s.prepare(ctx); err != nil {
		return nil, errors.Join(err, s.Close(ctx))
	}
	return s, nil
}

// prepare finds the output's queue and creates its tables with the audit.
func (s *Stack) prepare(ctx context.Context) error {
	q, err := s.Queues(ctx, Job, Output)
	if err != nil {
		return err
	}
	s.QueueURL, s.QueueARN = q.WorkURL, q.WorkARN
	if s.data, s.versions, err = s.PostgresTables(Job, Output); err != nil {
		return err
	}
	out := s.Config.Jobs[0].Outputs[0]
	if s.pool, err = s.Deps.Pool(ctx, out.Postgres); err != nil {
		return err
	}
	sink, err := pgsink.New(s.pool, *out.Postgres, out.ID)
	if err != nil {
		return fmt.Errorf("postgres sink: %w", err)
	}
	if s.state, err = pgsink.NewState(s.pool, *out.Postgres, out.ID); err != nil {
		return err
	}
	if err := sink.CreateTables(ctx); err != nil {
		return err
	}
	return s.createAudit(ctx)
}

// auditName names the audit table, its trigger functions and its triggers
// after the output's data table; audit quotes it in the data table's schema.
func (s *Stack) auditName(suffix string) string { return s.data[len(s.data)-1] + "_audit" + suffix }

func (s *Stack) audit(suffix string) string {
	return pgx.Identifier{s.data[0], s.auditName(suffix)}.Sanitize()
}

// createAudit creates the audit table, which records, with its transaction
// id, every write to the output's data table and every write to its versions
// table, so that writes which did not come with a raise of the document's
// version can be counted.
func (s *Stack) createAudit(ctx context.Context) error {
	audit := s.audit("")
	vfn, dfn := s.audit("_v"), s.audit("_d")
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
		`CREATE TRIGGER ` + pgx.Identifier{s.auditName("_vt")}.Sanitize() + ` AFTER INSERT OR UPDATE ON ` +
			s.versions.Sanitize() + ` FOR EACH ROW EXECUTE FUNCTION ` + vfn + `()`,
		`CREATE TRIGGER ` + pgx.Identifier{s.auditName("_dt")}.Sanitize() + ` AFTER INSERT OR UPDATE OR DELETE ON ` +
			s.data.Sanitize() + ` FOR EACH ROW EXECUTE FUNCTION ` + dfn + `()`,
	}
	for _, q := range stmts {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("create audit triggers: %w", err)
		}
	}
	return nil
}

// Close removes the audit table and functions, then the stack
// (stack.Stack.Close: its tables, source database and AWS resources).
func (s *Stack) Close(ctx context.Context) error {
	var errs []error
	if s.pool != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, err := s.pool.Exec(dctx, `DROP TABLE IF EXISTS `+s.audit("")); err != nil {
			errs = append(errs, fmt.Errorf("drop audit table: %w", err))
		}
		for _, f := range []string{"_v", "_d"} {
			if _, err := s.pool.Exec(dctx, `DROP FUNCTION IF EXISTS `+s.audit(f)+`() CASCADE`); err != nil {
				errs = append(errs, fmt.Errorf("drop audit function: %w", err))
			}
		}
	}
	errs = append(errs, s.Stack.Close(ctx))
	return errors.Join(errs...)
}

// LoadSample writes n sample orders into the source (a backlog).
func (s *Stack) LoadSample(ctx context.Context, n int) error {
	if _, err := sample.Load(ctx, s.hc, s.SourceURL, sample.Options{Docs: n, UpdateEvery: 5, DeleteEvery: 11, Seed: 11}); err != nil {
		return fmt.Errorf("load sample: %w", err)
	}
	return nil
}

// updateSeq is the source database's current update sequence as a number
// (pouchdb and CouchDB 1.x give an integer).
func (s *Stack) updateSeq(ctx context.Context) (int64, error) {
	seq, err := s.Stack.UpdateSeq(ctx)
	if err != nil {
		return 0, err
	}
	return SeqNumber(seq)
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

// PGVersions returns doc id → the last change the output applied to it,
// deletions included, as its state reader reads them (pgsink.State.Applied).
func (s *Stack) PGVersions(ctx context.Context) (map[string]deliver.Stored, error) {
	got := map[string]deliver.Stored{}
	err := s.state.Applied(ctx, func(d deliver.Stored) error {
		got[d.ID] = d
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the output's versions: %w", err)
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
	audit := s.audit("")
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

// errNotCaughtUp is returned by WaitCaughtUp when it gives up.
var errNotCaughtUp = errors.New("job did not catch up with the source")

// WaitCaughtUp waits until the job's checkpoint reaches the source's update
// sequence (take it once the source stopped changing). It gives up once the
// checkpoint has not moved for stall, or after four times stall in all: a
// busy machine slows the job down, a stall stops it.
func (s *Stack) WaitCaughtUp(ctx context.Context, stall time.Duration) error {
	start := time.Now()
	moved, at := start, "unknown"
	for {
		want, err := s.updateSeq(ctx)
		if err != nil {
			return err
		}
		st, err := s.Leases.Get(ctx, Job)
		if err == nil {
			if got, err := SeqNumber(st.Checkpoint); err == nil && got >= want {
				return nil
			}
			if cp := checkpointOf(st); cp != at {
				moved, at = time.Now(), cp
			}
		}
		switch {
		case time.Since(moved) > stall:
			return fmt.Errorf("%w: its checkpoint stayed at %s for %s (update_seq %d)", errNotCaughtUp, at, stall, want)
		case time.Since(start) > 4*stall:
			return fmt.Errorf("%w within %s (update_seq %d, checkpoint %s)", errNotCaughtUp, 4*stall, want, at)
		}
		if err := clock.Sleep(ctx, 200*time.Millisecond); err != nil {
			return fmt.Errorf("%w: %w (update_seq %d, checkpoint %s)", errNotCaughtUp, err, want, at)
		}
	}
}

func checkpointOf(st *lease.State) string {
	if st == nil {
		return "unknown"
	}
	return string(st.Checkpoint)
}
