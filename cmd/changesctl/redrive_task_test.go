package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/dlq"
)

// TestRedriveMoveTask redrives DLQs whose messages the work queue's redrive
// policy moved there seconds earlier, well inside SQS's 5-minute FIFO
// deduplication window.
//
// Standard queue: `dlq redrive --mode task` runs an SQS message move task
// and every message is back on the work queue exactly once.
//
// FIFO queue: a move task keeps a message's deduplication id, and a work
// queue that saw the id in the last 5 minutes drops the moved message after
// the DLQ let go of it (LocalStack does so with the id the redrive policy
// kept). So `--mode task` is refused and moves nothing, and the default mode
// copies with a deduplication id per DLQ message: every message is back.
func TestRedriveMoveTask(t *testing.T) {
	t.Parallel()
	eachDLQKind(t, func(t *testing.T, s *testStack, output string, q dlq.Queues) {
		ctx := t.Context()
		const n = 25
		want := map[string]int{}
		var envs []*change.Envelope
		for i := range n {
			id := fmt.Sprintf("doc-%02d", i)
			envs = append(envs, envelope(output, id, "1-a", 2, int64(i+1)))
			want[id] = 1
		}
		s.enqueue(q, envs...)
		s.exhaustReceives(q, n)

		if output == outPGFIFO {
			_, _, err := s.cli(ctx, "", "dlq", "redrive", "--output", output, "--mode", "task")
			if err == nil || !strings.Contains(err.Error(), "not used on a FIFO dlq") {
				t.Fatalf("redrive --mode task on a FIFO dlq: %v, want a refusal", err)
			}
			if d := s.depth(q.DLQURL); d != n {
				t.Fatalf("dlq holds %d after the refused task, want %d", d, n)
			}
			out := s.mustCLI(ctx, "dlq", "redrive", "--output", output)
			if !strings.Contains(out, "(copy, because the dlq is FIFO") || !strings.Contains(out, fmt.Sprintf("%d messages back", n)) {
				t.Errorf("redrive said:\n%s", out)
			}
		} else {
			out := s.mustCLI(ctx, "dlq", "redrive", "--output", output, "--mode", "task")
			if !strings.Contains(out, "(task, task ") || !strings.Contains(out, fmt.Sprintf("%d messages back", n)) || !strings.Contains(out, "0 left in the dlq") {
				t.Errorf("redrive said:\n%s", out)
			}
		}
		if d := s.depth(q.DLQURL); d != 0 {
			t.Errorf("dlq holds %d after the redrive, want 0", d)
		}
		got := countByDoc(s.census(q.WorkURL, true))
		for id, c := range got {
			if want[id] == 0 {
				t.Errorf("work queue holds unknown document %q", id)
			} else if c != 1 {
				t.Errorf("work queue holds %q %d times, want once", id, c)
			}
		}
		for id := range want {
			if got[id] == 0 {
				t.Errorf("%q is lost: neither on the dlq nor on the work queue", id)
			}
		}
	})
}

// exhaustReceives receives the messages of a work queue without deleting
// them, with a 1-second visibility timeout, until its redrive policy has
// moved n messages to the DLQ (as when the writer timed out on every
// receive). A FIFO work queue's redrive policy allows SQS's 1,000 receives
// (its writer counts max_receive_count itself): it is lowered to the
// output's max_receive_count first, so that SQS moves them within the test.
func (s *testStack) exhaustReceives(q dlq.Queues, n int) {
	s.t.Helper()
	ctx := s.t.Context()
	if q.FIFO {
		_, o, err := s.Output(q.Job, q.Output)
		if err != nil {
			s.t.Fatal(err)
		}
		policy := fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":"%d"}`, q.DLQARN, o.MaxReceiveCount)
		if _, err := s.Deps.SQS.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{
			QueueUrl: &q.WorkURL, Attributes: map[string]string{"RedrivePolicy": policy},
		}); err != nil {
			s.t.Fatal(err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for s.depth(q.DLQURL) < n {
		if time.Now().After(deadline) {
			s.t.Fatalf("the redrive policy moved %d of %d messages to the dlq within a minute", s.depth(q.DLQURL), n)
		}
		if _, err := s.Deps.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: &q.WorkURL, MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 1,
		}); err != nil {
			s.t.Fatal(err)
		}
	}
}
