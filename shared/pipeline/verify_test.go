package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
	"github.com/changes-worker/changes-worker/shared/verify"
)

// TestVerifyEventStrict: the verify function refuses an event with a key
// it does not know, naming the key, rather than running a comparison
// alone where a repair was asked for.
func TestVerifyEventStrict(t *testing.T) {
	t.Parallel()
	var ev pipeline.VerifyEvent
	err := json.Unmarshal([]byte(`{"job": "orders", "output": "pg", "repiar": true}`), &ev)
	if err == nil || !strings.Contains(err.Error(), `"repiar"`) {
		t.Errorf("decode an event with a misspelt key: %v, want an error naming it", err)
	}
	if err := json.Unmarshal([]byte(`{"job": "orders", "output": "pg", "repair": true, "lease_wait": "1m", "sample": 0}`), &ev); err != nil {
		t.Fatal(err)
	}
	want := pipeline.VerifyEvent{Job: "orders", Output: "pg", Repair: true, LeaseWait: config.Duration(time.Minute), Sample: ev.Sample}
	if diff := cmp.Diff(want, ev); diff != "" || ev.Sample == nil || *ev.Sample != 0 {
		t.Errorf("decoded event (-want +got):\n%s", diff)
	}
}

// TestHandleVerify runs the verify function's handler on a pipeline whose
// PostgreSQL output lost a document behind the writer's back: it reports
// the document missing, with the samples asked for; a repair in the same
// invocation re-enqueues it under the job's lease, held as
// verify-<request id>; once the writer delivered it the output is in sync.
// Events that name no job or output, or another job's, and a deadline
// that leaves no time, are refused with what was wrong.
func TestHandleVerify(t *testing.T) {
	t.Parallel()
	s := stack.ForTest(t, stack.Options{Config: &config.File{
		Stack: config.Stack{PollerTimeout: config.Duration(10 * time.Second), WriterTimeout: config.Duration(10 * time.Second)},
		Jobs: []*config.Job{{
			ID: "orders", Feed: config.Feed{Limit: 100, Timeout: config.Duration(time.Second)}, Lease: config.Lease{TTL: config.Duration(6 * time.Second)},
			Outputs: []*config.Output{{ID: "pg", Type: config.OutputPostgres, MaxReceiveCount: 3, Postgres: &config.PostgresOutput{CreateTables: true}}},
		}},
	}})
	ctx := t.Context()
	for i := range 5 {
		if _, err := s.PutDoc(ctx, fmt.Sprintf("doc-%d", i), map[string]any{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.RunUntilIdle(ctx, localrun.Options{Tick: time.Second}); err != nil {
		t.Fatal(err)
	}
	data, versions, err := s.PostgresTables("orders", "pg")
	if err != nil {
		t.Fatal(err)
	}
	pool := testenv.Postgres(t)
	for _, id := range []string{"doc-1", "doc-3"} {
		for _, table := range []string{data.Sanitize(), versions.Sanitize()} {
			if _, err := pool.Exec(ctx, "DELETE FROM "+table+" WHERE doc_id = $1", id); err != nil {
				t.Fatal(err)
			}
		}
	}

	one := 1
	res, err := s.Deps.HandleVerify(ctx, pipeline.VerifyEvent{Job: "orders", Output: "pg", Sample: &one})
	if err != nil {
		t.Fatal(err)
	}
	if c := res.Report.Counts; c[verify.Missing] != 2 || len(res.Samples[verify.Missing]) != 1 || res.Samples[verify.Missing][0].DocID != "doc-1" || res.Repair != nil {
		t.Errorf("verify after deleting two documents: counts %v, samples %+v, repair %+v; want 2 missing, doc-1 shown, no repair", c, res.Samples, res.Repair)
	}

	before, err := s.Leases.Get(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	rctx := lambdacontext.NewContext(ctx, &lambdacontext.LambdaContext{AwsRequestID: "req-7"})
	res, err = s.Deps.HandleVerify(rctx, pipeline.VerifyEvent{Job: "orders", Output: "pg", Repair: true, LeaseWait: config.Duration(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if res.RepairError != "" || res.Repair == nil || res.Repair.Live != 2 || res.Repair.Generation != before.Generation+1 {
		t.Fatalf("repair: %+v (error %q), want 2 documents enqueued at generation %d", res.Repair, res.RepairError, before.Generation+1)
	}
	after, err := s.Leases.Get(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if after.Owner != "verify-req-7" || after.Generation != before.Generation+1 {
		t.Errorf("job item after the repair: owner %q, generation %d; want verify-req-7 at %d", after.Owner, after.Generation, before.Generation+1)
	}
	if _, err := s.RunUntilIdle(ctx, localrun.Options{Tick: time.Second, NoPoller: true}); err != nil {
		t.Fatal(err)
	}
	if res, err = s.Deps.HandleVerify(ctx, pipeline.VerifyEvent{Job: "orders", Output: "pg"}); err != nil || !res.Report.Clean() {
		t.Errorf("verify after the repair: %v, %+v; want in sync", err, res)
	}

	for _, c := range []struct {
		name string
		ctx  context.Context
		ev   pipeline.VerifyEvent
		want string
	}{
		{"no output", ctx, pipeline.VerifyEvent{Job: "orders"}, `must name the job and the output`},
		{"another job", ctx, pipeline.VerifyEvent{Job: "billing", Output: "pg"}, `no job "billing" in this function's configuration`},
		{"unknown output", ctx, pipeline.VerifyEvent{Job: "orders", Output: "archive"}, `job orders has no output "archive"`},
		{"no time left", deadlineIn(t, 10*time.Second), pipeline.VerifyEvent{Job: "orders", Output: "pg"}, "did not end within the function's time"},
	} {
		if _, err := s.Deps.HandleVerify(c.ctx, c.ev); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

// deadlineIn returns the test's context with a deadline d from now.
func deadlineIn(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestHandleVerifyReadsSecretsAgain: an operator who corrects a secret the
// verify function read wrong (a DSN PostgreSQL refuses) and runs verify
// again at once gets the corrected one, though the same warm instance
// answers: each invocation reads the secrets again (after the resolver's
// floor), rather than only a poller or writer that was refused.
func TestHandleVerifyReadsSecretsAgain(t *testing.T) {
	t.Parallel()
	s := stack.ForTest(t, stack.Options{Config: &config.File{
		Stack: config.Stack{PollerTimeout: config.Duration(10 * time.Second), WriterTimeout: config.Duration(10 * time.Second)},
		Jobs: []*config.Job{{
			ID: "orders", Feed: config.Feed{Limit: 100, Timeout: config.Duration(time.Second)}, Lease: config.Lease{TTL: config.Duration(6 * time.Second)},
			Outputs: []*config.Output{{ID: "pg", Type: config.OutputPostgres, MaxReceiveCount: 3, Postgres: &config.PostgresOutput{CreateTables: true}}},
		}},
	}})
	ctx := t.Context()
	if _, err := s.PutDoc(ctx, "doc-1", map[string]any{"n": 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RunUntilIdle(ctx, localrun.Options{Tick: time.Second}); err != nil {
		t.Fatal(err)
	}

	// The function's view: the DSN reference resolves through Secrets
	// Manager, as <prefix>/<name>, never through the environment.
	prefix := s.Name + "-secrets"
	name := prefix + "/" + testenv.DSNEnv
	dsn := testenv.PostgresDSN(t)
	wrong, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	wrong.User = url.UserPassword(wrong.User.Username(), "not-the-password")
	sm := secretsmanager.NewFromConfig(s.Deps.AWS)
	if _, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: &name, SecretString: aws.String(wrong.String())}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = sm.DeleteSecret(context.WithoutCancel(ctx), &secretsmanager.DeleteSecretInput{SecretId: &name, ForceDeleteWithoutRecovery: aws.Bool(true)})
	})
	lookup := func(k string) (string, bool) {
		switch k {
		case pipeline.EnvEnvSecretPrefix:
			return prefix + "/", true
		case testenv.DSNEnv:
			return "", false
		}
		return os.LookupEnv(k)
	}
	deps := pipeline.New(s.Config, s.Deps.AWS, lookup, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	t.Cleanup(deps.Close)
	deps.Secrets.Floor = time.Millisecond

	ev := pipeline.VerifyEvent{Job: "orders", Output: "pg"}
	if _, err := deps.HandleVerify(ctx, ev); err == nil {
		t.Fatal("verify with a DSN PostgreSQL refuses: no error")
	}
	if _, err := sm.PutSecretValue(ctx, &secretsmanager.PutSecretValueInput{SecretId: &name, SecretString: &dsn}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	res, err := deps.HandleVerify(ctx, ev)
	if err != nil || !res.Report.Clean() || res.Report.OutputDocs != 1 {
		t.Errorf("verify after the secret was corrected: %v, %+v; want in sync, 1 document", err, res)
	}
}
