package tests

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// deployedDLQRetention is the DLQs' retention in TestDeployedDLQArchive,
// SQS's shortest: a change is archived 30 s after it was queued and the
// test waits past the retention.
const deployedDLQRetention = config.MinDLQRetention

// TestDeployedDLQArchive deploys the full stack with a one-minute DLQ
// retention and follows a failed change through it as LocalStack runs the
// functions: the writer dead-letters a change the HTTP output refuses, the
// deployed poller (invoked one invocation after another, as its schedule
// and overlapping timeout do) archives it to the stack's bucket before SQS
// would drop it, it is still there past the retention, `changesctl dlq list`
// reports it archived, `dlq redrive` sends it back and the writer delivers
// it.
func TestDeployedDLQArchive(t *testing.T) {
	deployedParallel(t)
	ctx := t.Context()
	bin := changesctl(t)
	const poison = "poison"
	var refuse atomic.Bool
	refuse.Store(true)
	recv, base := refusingReceiver(t, poison, &refuse)
	cfg := &config.File{
		Stack: config.Stack{
			// Overlapping invocations sweep the DLQ every 7.5 s, a quarter
			// of the 30 s archive_after leaves.
			PollerTimeout:    config.Duration(80 * time.Second),
			WriterTimeout:    config.Duration(deployedWriterTimeout),
			LogRetentionDays: 1,
			DLQ:              config.DLQ{Retention: config.Duration(deployedDLQRetention)},
		},
		Jobs: []*config.Job{{
			ID:    "orders",
			Feed:  config.Feed{Limit: 100, Timeout: config.Duration(2 * time.Second)},
			Lease: config.Lease{TTL: config.Duration(deployedLeaseTTL)},
			Outputs: []*config.Output{{ID: "rest", Type: config.OutputHTTP, MaxReceiveCount: 2,
				HTTP: &config.HTTPOutput{URL: base + "/docs/{doc_id}", Timeout: config.Duration(3 * time.Second)}}},
		}},
	}
	d := deployTestStack(t, deployOptions{name: "deployed-archive", cfg: cfg, recv: recv, rank: 2})
	s, prefix := d.Stack, d.prefix
	q, err := s.Queues(ctx, "orders", "rest")
	if err != nil {
		t.Fatal(err)
	}
	archive := dlq.NewArchive(s.Deps.S3, s.Config, s.Config.Jobs[0], s.Config.Jobs[0].Outputs[0])
	inArchive := func(ctx context.Context) (dlq.Stats, error) { return archive.Stats(ctx) }

	// The poller, one invocation after another until the test is done.
	pollCtx, stopPolling := context.WithCancel(ctx)
	var polling sync.WaitGroup
	polling.Go(func() {
		for pollCtx.Err() == nil {
			out, err := d.invoke(pollCtx)
			switch {
			case pollCtx.Err() != nil:
			case err != nil:
				t.Errorf("invoke the poller: %v", err)
				return
			case out.FunctionError != nil:
				t.Errorf("poller: %s: %s", aws.ToString(out.FunctionError), out.Payload)
				return
			}
		}
	})
	defer func() {
		stopPolling()
		polling.Wait()
	}()

	for _, id := range []string{"a", poison} {
		if _, err := s.PutDoc(ctx, id, map[string]any{"type": "order"}); err != nil {
			t.Fatal(err)
		}
	}
	// Dead-lettered, then archived before SQS would drop it.
	var sentAt time.Time
	err = testenv.Poll(ctx, 2*time.Minute, time.Second, func(ctx context.Context) (bool, error) {
		d, err := dlq.QueueDepth(ctx, s.Deps.SQS, q.DLQURL)
		if err != nil {
			return false, err
		}
		st, err := inArchive(ctx)
		return d.Total()+st.Count > 0, err
	})
	if err != nil {
		t.Fatalf("the refused change never reached the DLQ: %v", err)
	}
	err = testenv.Poll(ctx, deployedDLQRetention, time.Second, func(ctx context.Context) (bool, error) {
		d, err := dlq.QueueDepth(ctx, s.Deps.SQS, q.DLQURL)
		if err != nil {
			return false, err
		}
		st, err := inArchive(ctx)
		sentAt = st.Oldest
		return d.Total() == 0 && st.Count == 1, err
	})
	if err != nil {
		t.Fatalf("the deployed poller did not archive the dead-lettered change within %s: %v", deployedDLQRetention, err)
	}
	var m dlq.Message
	var readErr error
	if err := archive.Keys(ctx, func(k dlq.ArchivedKey) bool {
		m, readErr = archive.Read(ctx, k.Key)
		return false
	}); err != nil || readErr != nil || m.Archived == nil {
		t.Fatalf("read the archived change: %v, %v", err, readErr)
	}
	if m.DocID() != poison || m.Failure.HTTPStatus != http.StatusBadRequest || m.Archived.At.Sub(m.SentAt) >= deployedDLQRetention {
		t.Fatalf("archived %+v, want %s's HTTP 400, archived within %s of its queueing", m, poison, deployedDLQRetention)
	}

	// Past the retention, still archived; listed as such.
	if wait := time.Until(sentAt.Add(deployedDLQRetention + 5*time.Second)); wait > 0 {
		time.Sleep(wait)
	}
	if st, err := inArchive(ctx); err != nil || st.Count != 1 {
		t.Fatalf("archive after the DLQ's retention: %+v, %v; want the change", st, err)
	}
	list := runCLI(t, bin, s, "dlq", "list", "--output", "rest")
	for _, w := range []string{"1 archived", "http_status", "http 400", "dlq-archive/" + prefix + "/orders/rest/"} {
		if !strings.Contains(list, w) {
			t.Errorf("dlq list lacks %q:\n%s", w, list)
		}
	}

	// Redriven and delivered by the deployed writer.
	refuse.Store(false)
	if out := runCLI(t, bin, s, "dlq", "redrive", "--output", "rest"); !strings.Contains(out, "1 messages back on "+q.WorkName) || !strings.Contains(out, "1 from the archive") {
		t.Errorf("dlq redrive said:\n%s", out)
	}
	err = testenv.Poll(ctx, 2*time.Minute, time.Second, func(context.Context) (bool, error) {
		docs, err := recv.Docs()
		_, ok := docs[poison]
		return ok, err
	})
	if err != nil {
		t.Errorf("the redriven change was not delivered: %v", err)
	}
	if st, err := inArchive(ctx); err != nil || st.Count != 0 {
		t.Errorf("archive after the redrive: %+v, %v; want empty", st, err)
	}
	if d, err := dlq.QueueDepth(ctx, s.Deps.SQS, q.DLQURL); err != nil || d.Total() != 0 {
		t.Errorf("DLQ after the redrive: %+v, %v; want empty", d, err)
	}
}
