package tests

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	lambdatypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/statetable/outage"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// TestDeployedHeldChangesKeepOrder deploys the full stack with one job whose
// two outputs are HTTP endpoints on FIFO queues (per_document) that apply
// every request as it comes (blindReceiver), and checks, as LocalStack runs
// it, with both refusing at once for a minute and a half (the probe rule's
// period and more) while documents are updated
// several times each at different moments: one answering 503, the other
// 429 (Retry-After). For each, the writer pauses its event source mapping of
// the output's queue, the probe rule's invocations of the writer resume it
// once the endpoint takes a change again, and the endpoint ends holding
// exactly the newest revision of every document, with nothing
// dead-lettered and the outage record gone.
func TestDeployedHeldChangesKeepOrder(t *testing.T) {
	deployedParallel(t)
	outs := []*heldOutput{
		{name: "503 throughout the outage", id: "unavailable", refuse: unavailable},
		{name: "429 with Retry-After throughout the outage", id: "throttled", refuse: tooManyRequests(3)},
	}
	d := deployBlindStack(t, outs)
	ctx := t.Context()
	// A minute and a half unless CHANGES_TEST_OUTAGE says otherwise: the
	// writer pauses within seconds, so the outage still spans a tick of
	// the probe rule (rate(1 minute)), which finds the endpoint refusing.
	length := 90 * time.Second
	if os.Getenv("CHANGES_TEST_OUTAGE") != "" {
		length = outageLength(t)
	}

	// The poller runs back to back, as its schedule would keep it running.
	pctx, stopPolling := context.WithCancel(ctx)
	var polling sync.WaitGroup
	polling.Go(func() {
		for pctx.Err() == nil {
			if out, err := d.invoke(pctx); err == nil && out.FunctionError != nil {
				t.Logf("poller: %s: %s", aws.ToString(out.FunctionError), out.Payload)
			}
		}
	})
	defer func() { stopPolling(); polling.Wait() }()

	docs := &blindWrites{d: d}
	for i := range 40 {
		docs.put(ctx, t, i)
	}
	for _, o := range outs {
		d.waitBlind(ctx, t, o, 3*time.Minute)
	}

	refused := map[*heldOutput]int64{}
	for _, o := range outs {
		refused[o] = o.recv.refused.Load()
		o.recv.set(o.refuse)
	}
	start := time.Now()
	paused := map[*heldOutput]bool{}
	for i := 0; time.Since(start) < length; i++ {
		docs.put(ctx, t, 40+docs.n)
		if i%8 == 0 {
			for _, o := range outs {
				paused[o] = paused[o] || d.mappingState(ctx, t, o) == "Disabled"
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	for _, o := range outs {
		if !paused[o] {
			t.Errorf("%s: the writer's event source mapping of %s was never disabled while the endpoint refused", o.name, o.queue.WorkName)
		}
		rec, err := d.outages.Get(ctx, "orders", o.id)
		if err != nil || rec == nil || rec.Intake != outage.IntakePaused {
			t.Errorf("%s: outage record while the endpoint refused: %+v, %v; want the intake paused", o.name, rec, err)
		}
	}
	for _, o := range outs {
		o.recv.set(nil)
	}
	back := time.Now()
	for _, o := range outs {
		t.Run(o.name, func(t *testing.T) {
			d.waitBlind(ctx, t, o, 4*time.Minute)
			t.Logf("refused %d requests for %s (the held changes' tries, then the probe's), %d document writes so far; the endpoint equalled the source %s after it accepted again",
				o.recv.refused.Load()-refused[o], length.Round(time.Second), docs.n, time.Since(back).Round(time.Second))
			if st := d.mappingState(ctx, t, o); st != "Enabled" {
				t.Errorf("event source mapping %s after recovery, want Enabled", st)
			}
			if n := d.queueDepth(ctx, t, o.queue.DLQURL); n != 0 {
				t.Errorf("DLQ %s holds %d messages, want none", o.queue.DLQName, n)
			}
			if rec, err := d.outages.Get(ctx, "orders", o.id); err != nil || rec != nil {
				t.Errorf("outage record after recovery: %+v, %v; want none", rec, err)
			}
		})
	}
}

// heldOutput is one HTTP output of TestDeployedHeldChangesKeepOrder: its
// receiver, how it refuses during the outage, and its queues.
type heldOutput struct {
	name   string
	id     string
	refuse func(http.ResponseWriter)
	recv   *blindReceiver
	queue  dlq.Queues
}

// blindWrites updates 40 documents in turn, each write the next revision.
type blindWrites struct {
	d    *blindStack
	mu   sync.Mutex
	revs map[string]string
	n    int
}

func (w *blindWrites) put(ctx context.Context, t *testing.T, i int) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.revs == nil {
		w.revs = map[string]string{}
	}
	id := fmt.Sprintf("doc-%02d", i%40)
	body := map[string]any{"type": "order", "n": i}
	if rev := w.revs[id]; rev != "" {
		body["_rev"] = rev
	}
	rev, err := w.d.PutDoc(ctx, id, body)
	if err != nil {
		t.Fatal(err)
	}
	w.revs[id] = rev
	w.n++
}

// blindStack is the deployed stack of TestDeployedHeldChangesKeepOrder.
type blindStack struct {
	*deployedStack
	outages *outage.Store
}

// deployBlindStack deploys, with localstack/deploy.sh, a stack of one job
// "orders" reading a source database of its own into one HTTP output per
// element of outs (per_document, max_receive_count 3, short outage
// retries), each with a blindReceiver of its own, and deletes it when the
// test ends.
func deployBlindStack(t *testing.T, outs []*heldOutput) *blindStack {
	t.Helper()
	var outputs []*config.Output
	for _, o := range outs {
		o.recv = newBlindReceiver()
		srv := httptest.NewServer(o.recv)
		t.Cleanup(srv.Close)
		out := &config.Output{ID: o.id, Type: config.OutputHTTP, MaxReceiveCount: 3,
			HTTP: &config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}", Timeout: config.Duration(3 * time.Second)}}
		shortOutageRetry(out)
		outputs = append(outputs, out)
	}
	cfg := &config.File{
		Stack: config.Stack{PollerTimeout: config.Duration(deployedPollerTimeout), WriterTimeout: config.Duration(deployedWriterTimeout), LogRetentionDays: 1},
		Jobs: []*config.Job{{
			ID: "orders", Schedule: config.Duration(time.Minute),
			Feed:    config.Feed{Limit: 100, Timeout: config.Duration(2 * time.Second)},
			Lease:   config.Lease{TTL: config.Duration(deployedLeaseTTL)},
			Outputs: outputs,
		}},
	}
	d := deployTestStack(t, deployOptions{name: "blind", cfg: cfg, ahead: true})
	for _, o := range outs {
		var err error
		if o.queue, err = d.Queues(t.Context(), "orders", o.id); err != nil {
			t.Fatal(err)
		}
	}
	return &blindStack{deployedStack: d, outages: &outage.Store{DB: d.Deps.DynamoDB, Table: d.Config.TableName()}}
}

// waitBlind waits until o's receiver holds exactly the source's newest
// revision of every document and o's work queue is empty.
func (d *blindStack) waitBlind(ctx context.Context, t *testing.T, o *heldOutput, limit time.Duration) {
	t.Helper()
	var want, got map[string]string
	err := testenv.Poll(ctx, limit, 2*time.Second, func(ctx context.Context) (bool, error) {
		want, got = d.sourceState(ctx), o.recv.state()
		return maps.Equal(want, got) && d.queueDepth(ctx, t, o.queue.WorkURL) == 0, nil
	})
	if err != nil {
		var older []string
		for id, rev := range want {
			if got[id] != rev {
				older = append(older, fmt.Sprintf("%s at %q, not %q", id, got[id], rev))
			}
		}
		t.Fatalf("endpoint %s does not hold the source's newest revisions after %s (%d of %d differ: %s), work queue %d: %v",
			o.id, limit, len(older), len(want), strings.Join(older[:min(len(older), 5)], "; "), d.queueDepth(ctx, t, o.queue.WorkURL), err)
	}
}

// mappingState returns the state of the writer's event source mapping of
// o's work queue.
func (d *blindStack) mappingState(ctx context.Context, t *testing.T, o *heldOutput) string {
	t.Helper()
	out, err := d.lambda.ListEventSourceMappings(ctx, &lambda.ListEventSourceMappingsInput{FunctionName: aws.String(d.function("writer")), EventSourceArn: &o.queue.WorkARN})
	if err != nil {
		t.Fatal(err)
	}
	var found []lambdatypes.EventSourceMappingConfiguration
	for _, m := range out.EventSourceMappings {
		if aws.ToString(m.EventSourceArn) == o.queue.WorkARN {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d event source mappings of %s, want one", len(found), o.queue.WorkARN)
	}
	return aws.ToString(found[0].State)
}
