package tests

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/statetable/halt"
)

// A halting output (per_document) that answers 429 for longer than its
// messages' receives would last: on the real SQS redrive, nothing reaches the
// DLQ and nothing halts, because the writer keeps a waiting change in flight
// and pauses the output's intake before its max_receive_count-th receive, so
// that its receives stop until the probe finds the output back. The work
// queue's redrive limit is lowered from SQS's 1000 to max_receive_count + 1,
// so that a change whose receives went on would be dead-lettered by SQS
// within the test instead of after 1000 of them.
func TestHaltBackpressureSQSRedrive(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	const maxReceive = 3
	var refused atomic.Int32
	s := newStack(t, stackOptions{
		outputs: []string{"rest"}, maxReceive: maxReceive,
		rest: func(o *config.Output) {
			o.Ordering, o.OnFailure = config.OrderingPerDocument, config.OnFailureHalt
		},
		// At one receive a second (Retry-After: 1), about twelve receives.
		wrapRest: tooManyRequestsFor(12*time.Second, &refused),
	})
	q, err := s.Queues(ctx, "orders", "rest")
	if err != nil {
		t.Fatal(err)
	}
	policy := fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":"%d"}`, q.DLQARN, maxReceive+1)
	if _, err := s.Deps.SQS.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{
		QueueUrl: &q.WorkURL, Attributes: map[string]string{"RedrivePolicy": policy},
	}); err != nil {
		t.Fatal(err)
	}
	s.load(ctx, sample.Options{Docs: 20, Seed: 21})
	sum0 := s.runUntilIdle(ctx, localrun.Options{})

	if d := cmp.Diff(s.sourceState(ctx), s.httpState()); d != "" {
		t.Errorf("receiver (-want +got):\n%s", d)
	}
	if msgs := receiveAll(t, s, "rest"); len(msgs) != 0 {
		t.Errorf("DLQ holds %d messages, want none", len(msgs))
	}
	halts, err := (&halt.Store{DB: s.Deps.DynamoDB, Table: s.Config.TableName()}).List(ctx, "orders", "rest")
	if err != nil {
		t.Fatal(err)
	}
	if len(halts) != 0 {
		t.Errorf("%d groups halted, want none for backpressure (first: %+v)", len(halts), halts[0])
	}
	st := sum0.Outputs["orders/rest"]
	if st.Deferred == 0 || refused.Load() == 0 {
		t.Errorf("stats %+v after %d refusals: want deferrals", st, refused.Load())
	}
	t.Logf("refused %d requests, deferred %d messages, retried %d, delivered %d", refused.Load(), st.Deferred, st.Retried, st.Delivered)
}
