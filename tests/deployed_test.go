package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	cwtypes "github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	lambdatypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/demo/receiver"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/deployed"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/failure"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/iamcheck"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
	"github.com/changes-worker/changes-worker/tests/faults"
)

// deployedStack is the full CDK stack deployed to the local AWS by
// localstack/deploy.sh (`make localstack-deploy`), its functions run by
// LocalStack on this machine: the test drives the poller through the Lambda
// API or the schedule rule, and the writer runs only when LocalStack's event
// source mappings hand it batches.
type deployedStack struct {
	*testStack
	prefix string
	dsn    string // the PostgreSQL output's DSN; the stack is deployed with a wrong one
	lambda *lambda.Client
	sqs    *sqs.Client
	// calls records every AWS request of the functions and of changesctl;
	// assembly is the deploy's cloud assembly, ctl the changesctl it built.
	calls, assembly, ctl string
}

// Settings of the deployed test stack: short timeouts so that retries,
// redrives and lease takeovers happen within the test.
const (
	deployedPollerTimeout = 20 * time.Second
	deployedWriterTimeout = 5 * time.Second // visibility timeout 30 s
	deployedLeaseTTL      = 6 * time.Second
	// deployedMaxReceive: the pg output's poison document goes to the DLQ on
	// its second receive.
	deployedMaxReceive = 2
)

// TestDeployedStack and TestDeployedStackScheduleAndDLQ each deploy the full
// stack, with a source database, tables and receiver of their own, and
// check in order what the stack as it ships does when LocalStack runs it;
// they run side by side, each with its phases in sequence. Each ends with
// what the functions wrote to their log groups and every AWS request its
// functions (and changesctl) made, in all of its phases, checked against
// the caller's policy.
//
// TestDeployedStack: deployed with a wrong PostgreSQL DSN in its secret,
// corrected by the first subtest; exact delivery to PostgreSQL, HTTP and
// S3 through the event source mappings; a poller killed mid-invocation and
// taken over; changesctl operating the stack; verify --remote.
func TestDeployedStack(t *testing.T) {
	deployedParallel(t)
	d := deployStack(t, true, 1)
	ctx := t.Context()

	t.Run("a wrong DSN secret corrected while the writer is warm", func(t *testing.T) {
		d.checkSecretCorrected(ctx, t)
	})
	t.Run("exact through the event source mappings", func(t *testing.T) {
		d.load(ctx, sample.Options{Docs: 300, UpdateEvery: 4, DeleteEvery: 10})
		d.invokePoller(ctx, t)
		d.waitExact(ctx, t, 3*time.Minute)
	})
	t.Run("poller killed mid-invocation is taken over", func(t *testing.T) {
		d.checkKilledPoller(ctx, t)
	})
	t.Run("log groups hold structured logs and EMF", func(t *testing.T) {
		d.checkLogs(ctx, t)
	})
	t.Run("changesctl operates the deployed stack", func(t *testing.T) {
		d.checkOperator(ctx, t)
	})
	t.Run("verify --remote finds and repairs drift", func(t *testing.T) {
		d.checkRemoteVerify(ctx, t)
	})
	t.Run("every AWS request allowed by its caller's policy", func(t *testing.T) {
		d.checkIAM(t, "changesctl verify")
	})
}

// TestDeployedStackScheduleAndDLQ (see TestDeployedStack): the schedule
// rule starting the poller; a poison document retried, dead-lettered with
// its failure record, alarmed on and redriven as the console does it.
func TestDeployedStackScheduleAndDLQ(t *testing.T) {
	deployedParallel(t)
	d := deployStack(t, false, 4)
	ctx := t.Context()

	// The first delivery has the writer create the PostgreSQL output's
	// tables, which the poison document's trigger needs.
	t.Run("the schedule rule starts the poller", func(t *testing.T) {
		d.checkSchedule(ctx, t)
	})
	t.Run("poison document, DLQ, alarm and console redrive", func(t *testing.T) {
		d.checkPoison(ctx, t)
	})
	t.Run("log groups hold structured logs and EMF", func(t *testing.T) {
		d.checkLogs(ctx, t)
	})
	t.Run("every AWS request allowed by its caller's policy", func(t *testing.T) {
		d.checkIAM(t)
	})
}

// TestDeployedFailover deploys the stack with the job's defaults (schedule
// 1m, the default poller timeout, lease TTL 10s), lets its schedule rule
// start the poller while documents keep arriving, and kills with SIGKILL the
// bootstrap of the execution environment that holds the lease (the job
// item's host names its log stream), and only that one: an invocation that
// was standing by takes the lease over, as a failover at the next
// generation, and PostgreSQL ends holding exactly the source's documents.
// The new holder invokes its own function to start a standby beside it, as
// the IAM policy allows: a new invocation marks the job item as standing by
// within the lease TTL of the takeover plus a few seconds. How long a
// takeover takes is the deployed-failover benchmark's to say.
func TestDeployedFailover(t *testing.T) {
	deployedParallel(t)
	ctx := t.Context()
	cfg := &config.File{
		Stack: config.Stack{LogRetentionDays: 1},
		Jobs: []*config.Job{{
			ID:      "orders",
			Outputs: []*config.Output{{ID: "pg", Type: config.OutputPostgres, Postgres: &config.PostgresOutput{CreateTables: true}}},
		}},
	}
	d := deployTestStack(t, deployOptions{name: "failover", cfg: cfg, env: []string{testenv.DSNEnv + "=" + testenv.PostgresDSN(t)}, recordCalls: true, rank: 3})
	s := d.testStack
	job := s.Config.Jobs[0]

	load := faults.Adopt(s.Stack).StartLoad(ctx, faults.LoadOptions{Rate: 5, Max: 100000, For: 15 * time.Minute, Seed: 5})
	defer load.Stop()
	stop, err := faults.StartSchedule(ctx, eventbridge.NewFromConfig(s.Deps.AWS), s.Config.ScheduleName(job))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(context.WithoutCancel(t.Context())); err != nil {
			t.Errorf("stop the schedule: %v", err)
		}
	})

	// A holder that has checkpointed, and another invocation standing by.
	ttl := job.Lease.TTL.D()
	standbys := map[string]bool{}
	var victim *lease.State
	err = testenv.Poll(ctx, 5*time.Minute, 200*time.Millisecond, func(ctx context.Context) (bool, error) {
		st, err := s.Leases.Get(ctx, "orders")
		if err != nil {
			return false, err
		}
		now := time.Now()
		if st.Standby != "" && st.Standby != st.Owner && now.Sub(st.StandbySeenAt) < ttl {
			standbys[st.Standby] = true
		}
		victim = st
		return st.Held(now) && st.Checkpoint != nil && !st.CheckpointAt.Before(st.AcquiredAt) && standbys[st.Standby], nil
	})
	if err != nil {
		t.Fatalf("no holder with an invocation standing by beside it (last: %+v): %v", victim, err)
	}
	before, err := faults.Bootstraps(s.Config.FunctionName(job, config.FunctionPoller))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := faults.KillBootstrap(s.Config.FunctionName(job, config.FunctionPoller), victim.Host)
	if err != nil {
		t.Fatalf("kill the holder %s (generation %d) in %s, bootstraps %+v: %v", victim.Owner, victim.Generation, victim.Host, before, err)
	}
	t.Logf("killed bootstrap %d of the holder %s (generation %d); %d poller bootstraps were running", pid, victim.Owner, victim.Generation, len(before))

	var next *lease.State
	err = testenv.Poll(ctx, 3*time.Minute, 200*time.Millisecond, func(ctx context.Context) (bool, error) {
		st, err := s.Leases.Get(ctx, "orders")
		if err != nil {
			return false, err
		}
		next = st
		return st.Generation > victim.Generation && st.Checkpoint != nil && !st.CheckpointAt.Before(st.AcquiredAt), nil
	})
	if err != nil {
		t.Fatalf("no new holder checkpointed after the kill (last: %+v): %v", next, err)
	}
	if next.Generation != victim.Generation+1 || next.TakeoverKind != lease.Failover || next.Owner == victim.Owner {
		t.Errorf("after the kill: generation %d taken by %s as %q, want generation %d taken over from %s as %q",
			next.Generation, next.Owner, next.TakeoverKind, victim.Generation+1, victim.Owner, lease.Failover)
	}
	if !standbys[next.Owner] {
		t.Errorf("the new holder %s was not seen standing by before the kill (standbys seen: %v)", next.Owner, slices.Sorted(maps.Keys(standbys)))
	}
	d.checkFailoverStandby(ctx, t, next, standbys)

	if _, err := load.Stop(); err != nil {
		t.Fatal(err)
	}
	want := s.sourceState(ctx)
	var got map[string]string
	err = testenv.Poll(ctx, 3*time.Minute, 2*time.Second, func(ctx context.Context) (bool, error) {
		got = s.pgState(ctx)
		return maps.Equal(got, want), nil
	})
	if err != nil {
		t.Fatalf("PostgreSQL not exact after the failover (-source +pg):\n%s", cmp.Diff(want, got))
	}
	d.checkIAM(t)
}

// checkFailoverStandby: after the failover that made holder the holder, its
// function invoked itself (a recorded lambda Invoke of the poller), and an
// invocation not seen before the kill marks the job item as standing by
// beside holder. The schedule's next tick brings one too, within its minute,
// so the time the mark took is logged, not asserted.
func (d *deployedStack) checkFailoverStandby(ctx context.Context, t *testing.T, holder *lease.State, seen map[string]bool) {
	t.Helper()
	poller := d.function("poller")
	err := testenv.Poll(ctx, 30*time.Second, time.Second, func(context.Context) (bool, error) {
		calls, err := awsconf.ReadCalls(d.calls)
		if err != nil {
			return false, err
		}
		for _, c := range calls {
			if c.Caller == poller && c.Service == "Lambda" && c.Operation == "Invoke" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the new holder did not invoke %s to start a standby: %v", poller, err)
	}
	var st *lease.State
	err = testenv.Poll(ctx, 2*time.Minute, 200*time.Millisecond, func(ctx context.Context) (bool, error) {
		st, err = d.Leases.Get(ctx, "orders")
		if err != nil {
			return false, err
		}
		return st.Standby != "" && st.Standby != holder.Owner && !seen[st.Standby] && st.StandbySeenAt.After(holder.AcquiredAt), nil
	})
	if err != nil {
		t.Fatalf("no new invocation stood by beside %s after the failover (last: %+v): %v", holder.Owner, st, err)
	}
	t.Logf("a new invocation %s stood by %s after the takeover", st.Standby, st.StandbySeenAt.Sub(holder.AcquiredAt).Round(100*time.Millisecond))
}

// deployStack deploys the test stack of TestDeployedStack (source
// database, PostgreSQL tables, an HTTP receiver) with deployTestStack, the
// functions' AWS requests recorded. With wrongDSN, the stack's secret holds
// a wrong password for the PostgreSQL output's DSN (d.dsn is the right
// one); rank orders its deploy (deployOptions).
func deployStack(t *testing.T, wrongDSN bool, rank int) *deployedStack {
	t.Helper()
	recv, err := receiver.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(recv)
	t.Cleanup(srv.Close)
	job := &config.Job{
		ID:       "orders",
		Schedule: config.Duration(time.Minute),
		Feed:     config.Feed{Limit: 100, Timeout: config.Duration(2 * time.Second)},
		Lease:    config.Lease{TTL: config.Duration(deployedLeaseTTL)},
		Outputs: []*config.Output{
			{ID: "pg", Type: config.OutputPostgres, MaxReceiveCount: deployedMaxReceive, Postgres: &config.PostgresOutput{CreateTables: true}},
			{ID: "rest", Type: config.OutputHTTP, MaxReceiveCount: 4, HTTP: &config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}", Timeout: config.Duration(3 * time.Second)}},
			{ID: "archive", Type: config.OutputS3, MaxReceiveCount: 4, S3: &config.S3Output{Prefix: "archive/"}},
		},
	}
	cfg := &config.File{
		Stack: config.Stack{
			PollerTimeout:    config.Duration(deployedPollerTimeout),
			WriterTimeout:    config.Duration(deployedWriterTimeout),
			LogRetentionDays: 1,
		},
		Jobs: []*config.Job{job},
	}
	dsn := testenv.PostgresDSN(t)
	secret := dsn
	if wrongDSN {
		wrong, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		wrong.User = url.UserPassword(wrong.User.Username(), "not-the-password")
		secret = wrong.String()
	}
	d := deployTestStack(t, deployOptions{name: "deployed", cfg: cfg, recv: recv,
		env: []string{testenv.DSNEnv + "=" + secret}, recordCalls: true, rank: rank})
	d.dsn = dsn
	return d
}

// deployOptions shape a stack that deployTestStack deploys.
type deployOptions struct {
	// name labels the stack (stack.Options.Name).
	name string
	cfg  *config.File
	// recv is the receiver of the configuration's HTTP output, if any.
	recv *receiver.Server
	// env holds the values of the stack's secrets ({"env": NAME}
	// references), as NAME=value.
	env []string
	// recordCalls has the functions record every AWS request they make in
	// deployedStack.calls, for checkIAM.
	recordCalls bool
	// ahead deploys at once rather than in one of the deploySlots: for the
	// test that waits longest after its deploy.
	ahead bool
	// rank orders the deploys that wait for a slot: the lower first, for
	// the tests that wait longer after their deploy.
	rank int
}

// deploySlots bound the deploys under way (but the one ahead): each takes
// about a minute of both cores, and the machine is shared with the other
// tests, so a few at a time finish sooner than all of them together. The
// deploys that wait for a slot go in the order of their rank.
var deploySlots = newRankedSlots(3)

// deployTestStack deploys the stack of o.cfg for the test with
// localstack/deploy.sh, its schedule rules left disabled, and deletes the
// CloudFormation stack when the test ends. stack.ForTest first provisions
// the table and queues as `changesctl bootstrap` (make demo) does, under the
// names the CloudFormation stack then uses: the deploy must cope with them.
// The stack's readers then use the deployed bucket, and every job's poller
// and writer are Active.
func deployTestStack(t *testing.T, o deployOptions) *deployedStack {
	t.Helper()
	s := &testStack{Stack: stack.ForTest(t, stack.Options{Name: o.name, Config: o.cfg}), t: t, recv: o.recv}
	awsCfg := s.Deps.AWS
	d := &deployedStack{testStack: s, prefix: s.Config.Stack.Prefix, lambda: lambda.NewFromConfig(awsCfg), sqs: sqs.NewFromConfig(awsCfg)}
	cfn := cloudformation.NewFromConfig(awsCfg)
	if o.recordCalls {
		// Not a t.TempDir: the functions may still append to it as the
		// test ends (a standby's invocation), and RemoveAll then finds the
		// directory not empty. It is removed after the stack (cleanups run
		// last first), once the functions are gone.
		dir, err := os.MkdirTemp("", "aws-calls-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for range 10 {
				if err = os.RemoveAll(dir); err == nil {
					return
				}
				time.Sleep(time.Second)
			}
			t.Logf("remove %s: %v", dir, err)
		})
		d.calls = filepath.Join(dir, "aws-calls.jsonl")
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 3*time.Minute)
		defer cancel()
		deleteCFNStack(ctx, t, cfn, d.prefix)
	})
	// Registered after the stack's deletion, so run before it.
	t.Cleanup(func() {
		if t.Failed() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
			defer cancel()
			d.logFunctions(ctx, t, 40)
		}
	})
	buildDir := t.TempDir()
	d.assembly, d.ctl = t.TempDir(), filepath.Join(buildDir, "changesctl")
	if !o.ahead {
		defer deploySlots.take(o.rank)()
	}
	start := time.Now()
	if err := testenv.DeployLocal(t.Context(), testenv.LocalDeploy{
		ConfigPath: s.ConfigPath, BuildDir: buildDir, AssemblyDir: d.assembly, Env: o.env, AWSCalls: d.calls,
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("deployed stack %s in %s", d.prefix, time.Since(start).Round(time.Second))
	bucket, err := deployed.Bucket(t.Context(), cfn, d.prefix)
	if err != nil {
		t.Fatal(err)
	}
	// The functions use the stack's bucket (CHANGES_BUCKET); so do the
	// test's readers, and the stack's cleanup deletes it from the S3 the
	// functions use, where deploy.sh created it.
	if _, err := s.Deps.S3.DeleteBucket(t.Context(), &s3.DeleteBucketInput{Bucket: &s.Config.Stack.Bucket}); err != nil {
		t.Fatal(err)
	}
	pipeline.OverrideBucket(s.Config, bucket)
	for _, job := range s.Config.Jobs {
		for _, fn := range []string{s.Config.FunctionName(job, config.FunctionPoller), s.Config.FunctionName(job, config.FunctionWriter)} {
			got, err := d.lambda.GetFunction(t.Context(), &lambda.GetFunctionInput{FunctionName: &fn})
			if err != nil {
				t.Fatal(err)
			}
			if st := got.Configuration.State; st != lambdatypes.StateActive {
				t.Fatalf("function %s is %s, want Active", fn, st)
			}
		}
	}
	return d
}

// logFunctions logs, for a failed test, what only LocalStack holds: the
// state of each writer's event source mappings, and the last n warnings and
// errors each function wrote to its log group; and PostgreSQL's other
// sessions, with what each waits for (a writer that cannot deliver may wait
// for a lock).
func (d *deployedStack) logFunctions(ctx context.Context, t *testing.T, n int) {
	if conn, err := pgx.Connect(ctx, testenv.DSN()); err != nil {
		t.Logf("PostgreSQL sessions: %v", err)
	} else {
		rows, _ := conn.Query(ctx, `SELECT format('pid %s %s, waits for %s %s, transaction open %s: %s', pid, state, coalesce(wait_event_type, '-'), coalesce(wait_event, '-'),
			coalesce(date_trunc('second', now() - xact_start)::text, '-'), left(regexp_replace(query, '\s+', ' ', 'g'), 120))
			FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() ORDER BY xact_start NULLS LAST`)
		sessions, err := pgx.CollectRows(rows, pgx.RowTo[string])
		conn.Close(ctx)
		t.Logf("PostgreSQL's other sessions (%d), %v:\n%s", len(sessions), err, strings.Join(sessions, "\n"))
	}
	logs := cloudwatchlogs.NewFromConfig(d.Deps.AWS)
	for _, job := range d.Config.Jobs {
		writer := d.Config.FunctionName(job, config.FunctionWriter)
		p := lambda.NewListEventSourceMappingsPaginator(d.lambda, &lambda.ListEventSourceMappingsInput{FunctionName: &writer})
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				t.Logf("event source mappings of %s: %v", writer, err)
				break
			}
			for _, m := range page.EventSourceMappings {
				t.Logf("event source mapping of %s: %s (last result %q)", aws.ToString(m.EventSourceArn), aws.ToString(m.State), aws.ToString(m.LastProcessingResult))
			}
		}
		for _, fn := range []string{d.Config.FunctionName(job, config.FunctionPoller), writer} {
			group := "/aws/lambda/" + fn
			var kept []string
			p := cloudwatchlogs.NewFilterLogEventsPaginator(logs, &cloudwatchlogs.FilterLogEventsInput{LogGroupName: &group})
			for p.HasMorePages() {
				page, err := p.NextPage(ctx)
				if err != nil {
					kept = append(kept, fmt.Sprintf("read %s: %v", group, err))
					break
				}
				for _, ev := range page.Events {
					line := strings.TrimSpace(aws.ToString(ev.Message))
					if strings.Contains(line, `"level":"WARN"`) || strings.Contains(line, `"level":"ERROR"`) || strings.Contains(line, `"errorMessage"`) {
						kept = append(kept, line)
					}
				}
			}
			t.Logf("%s: its last %d warnings and errors (of %d):\n%s", group, min(n, len(kept)), len(kept), strings.Join(kept[max(0, len(kept)-n):], "\n"))
		}
	}
}

// function is the deployed name of the orders job's function (poller or writer).
func (d *deployedStack) function(name string) string { return d.prefix + "-orders-" + name }

// invokePoller invokes the poller through the Lambda API, as the schedule
// would, and fails the test on a function error.
func (d *deployedStack) invokePoller(ctx context.Context, t *testing.T) {
	t.Helper()
	if out, err := d.invoke(ctx); err != nil {
		t.Fatal(err)
	} else if out.FunctionError != nil {
		t.Fatalf("poller: %s: %s", aws.ToString(out.FunctionError), out.Payload)
	}
}

func (d *deployedStack) invoke(ctx context.Context) (*lambda.InvokeOutput, error) {
	out, err := d.lambda.Invoke(ctx, &lambda.InvokeInput{
		FunctionName: aws.String(d.function("poller")),
		Payload:      []byte(`{"job":"orders"}`),
	}, func(o *lambda.Options) { o.RetryMaxAttempts = 1 })
	if err != nil {
		return nil, fmt.Errorf("invoke %s: %w", d.function("poller"), err)
	}
	return out, nil
}

// checkSecretCorrected: the stack was deployed with a wrong PostgreSQL DSN
// in its secret (a placeholder not yet filled in, a typo). The writer holds
// the pg output's changes, dead-letters none, while the other outputs
// deliver; once the secret is corrected the warm writer reads it again and
// delivers them, with no redeploy and no configuration update.
func (d *deployedStack) checkSecretCorrected(ctx context.Context, t *testing.T) {
	// Documents of their own: the next subtest loads the sample set.
	for i := range 40 {
		if _, err := d.PutDoc(ctx, fmt.Sprintf("secret-%02d", i), map[string]any{"total": i}); err != nil {
			t.Fatal(err)
		}
	}
	d.invokePoller(ctx, t)
	want := d.sourceState(ctx)
	if err := testenv.Poll(ctx, 2*time.Minute, 2*time.Second, func(ctx context.Context) (bool, error) {
		return maps.Equal(d.httpState(), want) && maps.Equal(d.s3State(ctx), want), nil
	}); err != nil {
		t.Fatalf("rest and archive not exact while the pg secret is wrong: %v", err)
	}
	q, err := d.Queues(ctx, "orders", "pg")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := d.Revs(ctx, "orders", "pg"); err == nil && len(got) != 0 {
		t.Fatalf("PostgreSQL holds %d documents written with a wrong DSN", len(got))
	}
	if n := d.queueDepth(ctx, t, q.DLQURL); n != 0 {
		t.Fatalf("DLQ %s holds %d messages while the secret is wrong, want none", q.DLQName, n)
	}
	secret := d.prefix + "/" + testenv.DSNEnv
	if _, err := secretsmanager.NewFromConfig(d.Deps.AWS).PutSecretValue(ctx, &secretsmanager.PutSecretValueInput{
		SecretId: &secret, SecretString: &d.dsn,
	}); err != nil {
		t.Fatal(err)
	}
	corrected := time.Now()
	d.waitExact(ctx, t, 2*time.Minute)
	t.Logf("pg exact %s after the secret was corrected", time.Since(corrected).Round(time.Second))
	if n := d.queueDepth(ctx, t, q.DLQURL); n != 0 {
		t.Errorf("DLQ %s holds %d messages, want none", q.DLQName, n)
	}
}

// queueDepth returns the messages of a queue, visible and in flight.
func (d *deployedStack) queueDepth(ctx context.Context, t *testing.T, url string) int {
	t.Helper()
	out, err := d.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &url, AttributeNames: []sqstypes.QueueAttributeName{
		sqstypes.QueueAttributeNameApproximateNumberOfMessages, sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
	}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range out.Attributes {
		i, err := strconv.Atoi(v)
		if err != nil {
			t.Fatal(err)
		}
		n += i
	}
	return n
}

// waitExact waits until PostgreSQL, the HTTP receiver and S3 each hold
// exactly the source's live documents at their winning revisions. Each round
// reads the outputs in that order and stops at the first that differs: S3's
// state is a HEAD request per object. It gives up once no output came
// closer to the source for stall (a busy machine makes the functions slow;
// a stall stops them), or after three times stall in all.
func (d *deployedStack) waitExact(ctx context.Context, t *testing.T, stall time.Duration) {
	t.Helper()
	want := d.sourceState(ctx)
	var pgErr error
	// The writer creates the PostgreSQL output's tables when it first
	// opens it: until then there is no table to read.
	pgState := func(ctx context.Context) map[string]string {
		var pg map[string]string
		pg, pgErr = d.Revs(ctx, "orders", "pg")
		return pg
	}
	outputs := []struct {
		name  string
		state func(context.Context) map[string]string
	}{
		{"pg", pgState},
		{"rest", func(context.Context) map[string]string { return d.httpState() }},
		{"archive", d.s3State},
	}
	// The wait goes on while the first output that differs comes closer:
	// fewer documents that differ from the source than it ever had before.
	closest := map[string]int{}
	moved := time.Now()
	err := testenv.Poll(ctx, 3*stall, 2*time.Second, func(ctx context.Context) (bool, error) {
		for _, o := range outputs {
			n := differing(want, o.state(ctx))
			if c, ok := closest[o.name]; !ok || n < c {
				closest[o.name], moved = n, time.Now()
			}
			if n > 0 {
				if time.Since(moved) > stall {
					return false, fmt.Errorf("no output came closer to the source for %s (documents that differ: %v)", stall, closest)
				}
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		// Every output once more, for the diff.
		readCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		got := map[string]map[string]string{}
		for _, o := range outputs {
			got[o.name] = o.state(readCtx)
		}
		for out, g := range got {
			if diff := cmp.Diff(want, g); diff != "" {
				t.Errorf("output %s (-source +output):\n%s", out, diff)
			}
		}
		if pgErr != nil {
			t.Errorf("read the pg output: %v", pgErr)
		}
		if errors.Is(err, testenv.ErrTimeout) {
			err = fmt.Errorf("not within %s", 3*stall)
		}
		t.Fatalf("outputs not exact: %v", err)
	}
}

// differing counts the documents whose revision in got is not the one in
// want: missing, older or newer, or held though want has none.
func differing(want, got map[string]string) int {
	n := 0
	for id, rev := range want {
		if r, ok := got[id]; !ok || r != rev {
			n++
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			n++
		}
	}
	return n
}

// checkSchedule enables the job's rule (faults.StartSchedule), adds a
// document and waits until the poller the rule starts (nobody else invokes
// it) has delivered it; at the end it stops the schedule again.
func (d *deployedStack) checkSchedule(ctx context.Context, t *testing.T) {
	eb := eventbridge.NewFromConfig(d.Deps.AWS)
	rule := d.prefix + "-orders-schedule"
	got, err := eb.DescribeRule(ctx, &eventbridge.DescribeRuleInput{Name: &rule})
	if err != nil {
		t.Fatal(err)
	}
	if got.State != ebtypes.RuleStateDisabled || aws.ToString(got.ScheduleExpression) != "rate(1 minute)" {
		t.Fatalf("rule %s: %s %s, want DISABLED rate(1 minute) as deploy.sh leaves it with SCHEDULES=disabled", rule, got.State, aws.ToString(got.ScheduleExpression))
	}
	if _, err := d.PutDoc(ctx, "scheduled", map[string]any{"total": 1}); err != nil {
		t.Fatal(err)
	}
	stop, err := faults.StartSchedule(ctx, eb, rule)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := stop(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("stop the schedule: %v", err)
		}
	}()
	// LocalStack checks rate rules about once a minute.
	d.waitExact(ctx, t, 3*time.Minute)
}

// checkPoison makes PostgreSQL refuse one document with a transient error
// (SQLSTATE 40001, from a trigger) and checks: the rest of its batch is
// delivered, the document is retried and moved to the DLQ on its
// max_receive_count-th receive with its failure record, the DLQ alarm goes
// to ALARM and notifies its SNS topic, and once the trigger is gone a move
// task from the DLQ to the work queue, as the console's "Start DLQ redrive"
// to a custom destination issues it, delivers the document.
func (d *deployedStack) checkPoison(ctx context.Context, t *testing.T) {
	notes := d.subscribeToAlarms(ctx, t)
	data, _, err := d.PostgresTables("orders", "pg")
	if err != nil {
		t.Fatal(err)
	}
	pool := testenv.Postgres(t)
	fn := pgx.Identifier{data[len(data)-1] + "_poison"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.doc_id = 'poison' THEN RAISE EXCEPTION 'poison document' USING ERRCODE = '40001'; END IF;
  RETURN NEW;
END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TRIGGER poison BEFORE INSERT OR UPDATE ON `+data.Sanitize()+` FOR EACH ROW EXECUTE FUNCTION `+fn+`()`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.WithoutCancel(ctx), `DROP FUNCTION IF EXISTS `+fn+` CASCADE`) })

	ids := []string{"poison"}
	for i := range 20 {
		ids = append(ids, fmt.Sprintf("batchmate-%02d", i))
	}
	for _, id := range ids {
		if _, err := d.PutDoc(ctx, id, map[string]any{"total": len(id)}); err != nil {
			t.Fatal(err)
		}
	}
	d.invokePoller(ctx, t)

	q, err := d.Queues(ctx, "orders", "pg")
	if err != nil {
		t.Fatal(err)
	}
	msg := d.waitDLQ(ctx, t, q)
	attrs := map[string]string{}
	for k, v := range msg.MessageAttributes {
		attrs[k] = aws.ToString(v.StringValue)
	}
	want := map[string]string{
		failure.AttrDocID: "poison", failure.AttrJob: "orders", failure.AttrOutput: "pg",
		failure.AttrClass: "transient", failure.AttrSQLState: "40001", failure.AttrAttempts: strconv.Itoa(deployedMaxReceive),
	}
	for k, v := range want {
		if attrs[k] != v {
			t.Errorf("DLQ message attribute %s = %q, want %q (all: %v)", k, attrs[k], v, attrs)
		}
	}
	pg := d.pgState(ctx)
	src := d.sourceState(ctx)
	for _, id := range ids[1:] {
		if pg[id] != src[id] {
			t.Errorf("batch mate %s: PostgreSQL holds %q, want %q: the rest of the batch must be delivered", id, pg[id], src[id])
		}
	}
	if _, ok := pg["poison"]; ok {
		t.Errorf("the poison document reached PostgreSQL through its trigger")
	}

	d.waitAlarm(ctx, t, notes)

	if _, err := pool.Exec(ctx, `DROP FUNCTION `+fn+` CASCADE`); err != nil {
		t.Fatal(err)
	}
	task, err := d.sqs.StartMessageMoveTask(ctx, &sqs.StartMessageMoveTaskInput{SourceArn: &q.DLQARN, DestinationArn: &q.WorkARN})
	if err != nil {
		t.Fatalf("start message move task %s → %s: %v", q.DLQName, q.WorkName, err)
	}
	t.Logf("move task %s", aws.ToString(task.TaskHandle))
	d.waitExact(ctx, t, 2*time.Minute)
}

// waitDLQ waits for the one message of q's DLQ and returns it; it stays in
// the DLQ (its visibility timeout is set back to zero).
func (d *deployedStack) waitDLQ(ctx context.Context, t *testing.T, q dlq.Queues) sqstypes.Message {
	t.Helper()
	var msg sqstypes.Message
	// The first receive fails at once, the second comes after the visibility
	// timeout (30 s).
	err := testenv.Poll(ctx, 3*time.Minute, 2*time.Second, func(ctx context.Context) (bool, error) {
		out, err := d.sqs.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: &q.DLQURL, MaxNumberOfMessages: 10, MessageAttributeNames: []string{"All"},
		})
		if err != nil {
			return false, err
		}
		if len(out.Messages) == 0 {
			return false, nil
		}
		for _, m := range out.Messages {
			if _, err := d.sqs.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: &q.DLQURL, ReceiptHandle: m.ReceiptHandle}); err != nil {
				return false, err
			}
		}
		if len(out.Messages) != 1 {
			return false, fmt.Errorf("DLQ %s holds %d messages, want the poison document's only", q.DLQName, len(out.Messages))
		}
		msg = out.Messages[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("DLQ %s: %v", q.DLQName, err)
	}
	return msg
}

// subscribeToAlarms subscribes a new queue to the stack's alarm topic and
// returns its URL.
func (d *deployedStack) subscribeToAlarms(ctx context.Context, t *testing.T) string {
	t.Helper()
	cw := cloudwatch.NewFromConfig(d.Deps.AWS)
	alarm := d.dlqAlarm()
	got, err := cw.DescribeAlarms(ctx, &cloudwatch.DescribeAlarmsInput{AlarmNames: []string{alarm}})
	if err != nil || len(got.MetricAlarms) != 1 || len(got.MetricAlarms[0].AlarmActions) != 1 {
		t.Fatalf("alarm %s: %v, %v; want one with one action, the alarm topic", alarm, got, err)
	}
	topic := got.MetricAlarms[0].AlarmActions[0]
	name := d.prefix + "-alarm-notes"
	q, err := d.sqs.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: &name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.sqs.DeleteQueue(context.WithoutCancel(ctx), &sqs.DeleteQueueInput{QueueUrl: q.QueueUrl}) })
	attrs, err := d.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: q.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sns.NewFromConfig(d.Deps.AWS).Subscribe(ctx, &sns.SubscribeInput{
		TopicArn: &topic, Protocol: aws.String("sqs"), Endpoint: aws.String(attrs.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]),
	}); err != nil {
		t.Fatal(err)
	}
	return aws.ToString(q.QueueUrl)
}

func (d *deployedStack) dlqAlarm() string { return d.prefix + "-orders-pg-dlq-not-empty" }

// waitAlarm waits for the DLQ alarm to be in ALARM and for its notification
// on the queue subscribed to the alarm topic.
func (d *deployedStack) waitAlarm(ctx context.Context, t *testing.T, notes string) {
	t.Helper()
	cw := cloudwatch.NewFromConfig(d.Deps.AWS)
	alarm := d.dlqAlarm()
	// LocalStack's SQS publishes queue depths every 20 s (up.sh); its alarm
	// scheduler evaluates a one-minute alarm once a minute.
	err := testenv.Poll(ctx, 4*time.Minute, 5*time.Second, func(ctx context.Context) (bool, error) {
		got, err := cw.DescribeAlarms(ctx, &cloudwatch.DescribeAlarmsInput{AlarmNames: []string{alarm}})
		if err != nil {
			return false, err
		}
		return len(got.MetricAlarms) == 1 && got.MetricAlarms[0].StateValue == cwtypes.StateValueAlarm, nil
	})
	if err != nil {
		t.Fatalf("alarm %s not in ALARM: %v", alarm, err)
	}
	err = testenv.Poll(ctx, time.Minute, time.Second, func(ctx context.Context) (bool, error) {
		out, err := d.sqs.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &notes, MaxNumberOfMessages: 10})
		if err != nil {
			return false, err
		}
		for _, m := range out.Messages {
			var note struct{ Message string }
			if err := json.Unmarshal([]byte(aws.ToString(m.Body)), &note); err != nil {
				return false, fmt.Errorf("decode SNS notification: %w", err)
			}
			var body struct{ AlarmName, NewStateValue string }
			if err := json.Unmarshal([]byte(note.Message), &body); err == nil && body.AlarmName == alarm && body.NewStateValue == "ALARM" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no ALARM notification of %s on the subscribed queue: %v", alarm, err)
	}
}

// checkKilledPoller kills with SIGKILL the bootstrap of the poller
// invocation that holds the lease (the execution environment the job item's
// host names) while documents are being written and delivered; the next
// invocation must take the lease over (a higher generation) and the outputs
// end exact.
func (d *deployedStack) checkKilledPoller(ctx context.Context, t *testing.T) {
	leases := d.Leases
	before, err := leases.Get(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	const docs = 300
	written := make(chan int, docs)
	go func() {
		defer close(written)
		for i := range docs {
			id := fmt.Sprintf("killed-%03d", i)
			rev, err := d.PutDoc(ctx, id, map[string]any{"total": i})
			if err == nil && i%3 == 0 {
				rev, err = d.PutDoc(ctx, id, map[string]any{"_rev": rev, "total": i + 1})
			}
			if err == nil && i%10 == 1 {
				err = d.DeleteDoc(ctx, id, rev)
			}
			if err != nil {
				t.Errorf("write %s: %v", id, err)
				return
			}
			written <- i
			time.Sleep(20 * time.Millisecond)
		}
	}()
	done := make(chan error, 1)
	var killedOut *lambda.InvokeOutput
	go func() {
		out, err := d.invoke(ctx)
		killedOut = out
		done <- err
	}()
	// Kill once the invocation holds the lease and a third of the documents
	// are written.
	for range docs / 3 {
		<-written
	}
	poller := d.function("poller")
	var holder *lease.State
	var killed int
	err = testenv.Poll(ctx, time.Minute, 100*time.Millisecond, func(ctx context.Context) (bool, error) {
		cur, err := leases.Get(ctx, "orders")
		if err != nil || cur.Owner == "" || cur.Owner == before.Owner && cur.Generation == before.Generation {
			return false, err
		}
		holder = cur
		killed, err = faults.KillBootstrap(poller, cur.Host)
		if errors.Is(err, faults.ErrNoBootstrap) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		all, _ := faults.Bootstraps(poller)
		t.Fatalf("poller never held the lease to be killed (last holder %+v, bootstraps %+v): %v", holder, all, err)
	}
	t.Logf("killed bootstrap %d of the holder %s (generation %d)", killed, holder.Owner, holder.Generation)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if killedOut.FunctionError == nil {
		t.Errorf("the killed invocation returned %s without a function error", killedOut.Payload)
	}
	for range written {
	}
	held, err := leases.Get(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	d.invokePoller(ctx, t)
	after, err := leases.Get(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if after.Generation <= held.Generation {
		t.Errorf("lease generation %d after the next invocation, want above the killed one's %d (a takeover)", after.Generation, held.Generation)
	}
	d.waitExact(ctx, t, 3*time.Minute)
}

// checkLogs reads both functions' log groups: every line an invocation
// writes is a platform line (START, END, REPORT), a JSON log record with
// level, message and request id, or an EMF record valid against the
// specification; each function wrote records of both kinds. Each cold start
// wrote its start record, naming the release VERSION names, as deploy.sh
// stamps it.
func (d *deployedStack) checkLogs(ctx context.Context, t *testing.T) {
	logs := cloudwatchlogs.NewFromConfig(d.Deps.AWS)
	release := releaseVersion(t, repoRoot(t))
	for _, fn := range []string{"poller", "writer"} {
		group := "/aws/lambda/" + d.function(fn)
		var records, emf, reports, sdk, starts int
		p := cloudwatchlogs.NewFilterLogEventsPaginator(logs, &cloudwatchlogs.FilterLogEventsInput{LogGroupName: &group})
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				t.Fatalf("read log group %s: %v", group, err)
			}
			for _, ev := range page.Events {
				line := strings.TrimSpace(aws.ToString(ev.Message))
				switch kind, err := classifyLogLine(line); {
				case err != nil:
					t.Errorf("%s: %v: %s", group, err, line)
				case kind == "emf":
					emf++
				case kind == "record":
					records++
				case kind == "report":
					reports++
				case kind == "sdk":
					sdk++
				case kind == "start":
					starts++
					var rec struct{ Function, Version string }
					if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Function != fn || rec.Version != release {
						t.Errorf("%s: start record names function %q version %q, want %s %s: %s", group, rec.Function, rec.Version, fn, release, line)
					}
				}
			}
		}
		t.Logf("%s: %d log records, %d EMF records, %d REPORT lines, %d AWS SDK lines, %d start records", group, records, emf, reports, sdk, starts)
		if records == 0 || emf == 0 || reports == 0 || starts == 0 {
			t.Errorf("%s: %d log records, %d EMF records, %d REPORT lines, %d start records; want some of each", group, records, emf, reports, starts)
		}
	}
}

// classifyLogLine says what a function's log line is: "platform" (START,
// END, a returned error as aws-lambda-go prints it), "report" (REPORT),
// "sdk" (the AWS SDK's own log), "start" (the record a cold start writes
// before any invocation, without request id), "record" (a JSON log record
// with timestamp, level, message and request id), "emf" (an EMF record,
// checked against the specification), or an error.
func classifyLogLine(line string) (string, error) {
	switch {
	case strings.HasPrefix(line, "START RequestId: "), strings.HasPrefix(line, "END RequestId: "):
		return "platform", nil
	case strings.HasPrefix(line, "REPORT RequestId: "):
		return "report", nil
	case strings.HasPrefix(line, "SDK "):
		// The AWS SDK's own logger (retries, checksums), plain text.
		return "sdk", nil
	case !strings.HasPrefix(line, "{"):
		// aws-lambda-go prints a returned error with a timestamp prefix.
		if _, rest, ok := strings.Cut(line, " {"); ok && strings.Contains(rest, `"errorMessage"`) {
			return "platform", nil
		}
		return "", errors.New("neither a platform line nor JSON")
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal([]byte(line), &doc); err != nil {
		return "", fmt.Errorf("decode: %w", err)
	}
	if _, ok := doc["_aws"]; ok {
		return "emf", validateEMF(doc)
	}
	if _, ok := doc["requestId"]; !ok && string(doc["message"]) == `"starting"` {
		for _, k := range []string{"timestamp", "level", "function", "version"} {
			if _, ok := doc[k]; !ok {
				return "", fmt.Errorf("start record without %q", k)
			}
		}
		return "start", nil
	}
	for _, k := range []string{"timestamp", "level", "message", "requestId"} {
		if _, ok := doc[k]; !ok {
			return "", fmt.Errorf("log record without %q", k)
		}
	}
	return "record", nil
}

// validateEMF checks an EMF record against the specification
// (docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html):
// _aws.Timestamp is an integer of milliseconds; _aws.CloudWatchMetrics is a
// non-empty array of directives, each with a Namespace of 1-1024
// characters, Dimensions as arrays of at most 30 dimension keys, and 1-100
// Metrics with a Name, an optional Unit among CloudWatch's units and an
// optional StorageResolution of 1 or 60; every dimension key is a
// top-level member holding a string, and every metric a top-level member
// holding a number or an array of at most 100 numbers.
func validateEMF(doc map[string]json.RawMessage) error {
	var meta struct {
		Timestamp         *json.Number
		CloudWatchMetrics []struct {
			Namespace  string
			Dimensions [][]string
			Metrics    []struct {
				Name              string
				Unit              *string
				StorageResolution *int
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(doc["_aws"]))
	dec.UseNumber()
	if err := dec.Decode(&meta); err != nil {
		return fmt.Errorf("emf: decode _aws: %w", err)
	}
	if meta.Timestamp == nil {
		return errors.New("emf: _aws.Timestamp missing")
	}
	if _, err := meta.Timestamp.Int64(); err != nil {
		return fmt.Errorf("emf: _aws.Timestamp %s is not an integer", *meta.Timestamp)
	}
	if len(meta.CloudWatchMetrics) == 0 {
		return errors.New("emf: _aws.CloudWatchMetrics is empty")
	}
	for _, dir := range meta.CloudWatchMetrics {
		if n := len(dir.Namespace); n == 0 || n > 1024 {
			return fmt.Errorf("emf: namespace %q", dir.Namespace)
		}
		for _, set := range dir.Dimensions {
			if len(set) > 30 {
				return fmt.Errorf("emf: dimension set of %d keys", len(set))
			}
			for _, k := range set {
				var v string
				if err := json.Unmarshal(doc[k], &v); err != nil {
					return fmt.Errorf("emf: dimension %s is not a string member: %s", k, doc[k])
				}
			}
		}
		if n := len(dir.Metrics); n == 0 || n > 100 {
			return fmt.Errorf("emf: %d metrics in a directive", n)
		}
		for _, m := range dir.Metrics {
			if m.Unit != nil && !emfUnits[*m.Unit] {
				return fmt.Errorf("emf: metric %s: unit %q", m.Name, *m.Unit)
			}
			if r := m.StorageResolution; r != nil && *r != 1 && *r != 60 {
				return fmt.Errorf("emf: metric %s: storage resolution %d", m.Name, *r)
			}
			var one float64
			if json.Unmarshal(doc[m.Name], &one) == nil {
				continue
			}
			var many []float64
			if err := json.Unmarshal(doc[m.Name], &many); err != nil || len(many) == 0 || len(many) > 100 {
				return fmt.Errorf("emf: metric %s: value %s is neither a number nor 1-100 numbers", m.Name, doc[m.Name])
			}
		}
	}
	return nil
}

// emfUnits are the units CloudWatch accepts.
var emfUnits = map[string]bool{}

func init() {
	for _, u := range strings.Fields(`Seconds Microseconds Milliseconds Bytes Kilobytes Megabytes Gigabytes Terabytes
		Bits Kilobits Megabits Gigabits Terabits Percent Count Bytes/Second Kilobytes/Second Megabytes/Second
		Gigabytes/Second Terabytes/Second Bits/Second Kilobits/Second Megabits/Second Gigabits/Second
		Terabits/Second Count/Second None`) {
		emfUnits[u] = true
	}
}

// checkOperator runs changesctl's operator commands on the deployed stack
// as an operator would, its requests recorded: status, the checkpoint, the
// DLQ, verify of the PostgreSQL output (its DSN read from the stack's
// secret, CHANGES_ENV_SECRET_PREFIX) and of the S3 output, a redrive of the
// empty DLQ, the bucket's rules.
func (d *deployedStack) checkOperator(ctx context.Context, t *testing.T) {
	env := append(os.Environ(), awsconf.EnvCalls+"="+d.calls, "CHANGES_ENV_SECRET_PREFIX="+d.prefix+"/")
	run := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, d.ctl, append(args, "--config", d.ConfigPath)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, args := range [][]string{
		{"status"},
		{"checkpoint", "get", "--job", "orders"},
		{"dlq", "list", "--job", "orders", "--output", "pg"},
		{"verify", "--job", "orders", "--output", "pg"},
		{"verify", "--job", "orders", "--output", "archive"},
		{"dlq", "redrive", "--job", "orders", "--output", "pg"},
	} {
		if out, err := run(args...); err != nil {
			t.Errorf("changesctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// The local S3 the functions use holds a copy of the stack's bucket
	// without its lifecycle rule (deploy.sh): the check reports it missing,
	// which is not what this test is about.
	if out, err := run("bucket", "check"); err != nil && !strings.Contains(out, "claim-check") {
		t.Errorf("changesctl bucket check: %v\n%s", err, out)
	}
}

// checkIAM evaluates every AWS request the functions and changesctl made
// during the test against the policy of its caller: the function's role in
// the deployed templates, the operator policy of docs/deploy.md for
// changesctl. The poller, the writer and each of callers (changesctl
// commands the test ran) must have made requests.
func (d *deployedStack) checkIAM(t *testing.T, callers ...string) {
	rep := iamcheck.Deployed{AWS: d.Deps.AWS, Calls: d.calls, Assembly: d.assembly, Stack: d.prefix,
		Bucket: d.Config.Stack.Bucket, Root: ".."}.Check(t)
	for _, caller := range append([]string{d.function("poller"), d.function("writer")}, callers...) {
		if rep.ByCaller[caller] == 0 {
			t.Errorf("no request of %s was recorded", caller)
		}
	}
}

// deleteCFNStack deletes the CloudFormation stack and waits for it to go.
func deleteCFNStack(ctx context.Context, t *testing.T, cfn *cloudformation.Client, name string) {
	if _, err := cfn.DeleteStack(ctx, &cloudformation.DeleteStackInput{StackName: &name}); err != nil {
		t.Errorf("delete stack %s: %v", name, err)
		return
	}
	err := testenv.Poll(ctx, 3*time.Minute, 2*time.Second, func(ctx context.Context) (bool, error) {
		_, err := deployed.Bucket(ctx, cfn, name)
		return errors.Is(err, deployed.ErrNoStack), nil
	})
	if err != nil {
		t.Errorf("stack %s not deleted: %v", name, err)
	}
}
