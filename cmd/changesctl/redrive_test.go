package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/failure"
	"github.com/changes-worker/changes-worker/shared/fanout"
)

// eachDLQKind runs fn as a parallel subtest on a fresh stack, once for an
// output with a standard DLQ and once for an output with a FIFO DLQ, with
// that output and its queues.
func eachDLQKind(t *testing.T, fn func(t *testing.T, s *testStack, output string, q dlq.Queues)) {
	t.Helper()
	for _, tc := range []struct{ name, output string }{{"standard", outPG}, {"fifo", outPGFIFO}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStack(t, tc.output)
			fn(t, s, tc.output, s.queues(tc.output))
		})
	}
}

// TestRedriveKilledMidway redrives 1,000 messages with the changesctl
// binary, kills it with SIGKILL once it reported a third of them moved, and
// checks where every message is, right after the kill and after a second
// redrive finished the job. Messages are told apart by their document id.
//
// Right after the kill (once the dead process's hidden messages are
// visible again):
//   - no message is lost: every id is on the DLQ or on the work queue;
//   - an id on both queues is one the journal recorded as Sending or Sent
//     (the process died between the send and the delete).
//
// After the second redrive:
//   - the DLQ is empty and every id is on the work queue;
//   - the second redrive deleted the DLQ copies of the ids journaled Sent
//     without sending them again (Recovered), and sent again exactly the
//     ids journaled Sending (Resent: their first send may or may not have
//     reached SQS);
//   - a standard work queue holds every id exactly once, except possibly
//     those Resent ids (at most one batch per worker; none in most runs);
//     a FIFO work queue holds every id exactly once, Resent ones included,
//     because the deduplication id derives from the DLQ message id.
func TestRedriveKilledMidway(t *testing.T) {
	t.Parallel()
	bin := buildCLI(t)
	eachDLQKind(t, func(t *testing.T, s *testStack, output string, q dlq.Queues) {
		ctx := t.Context()
		const n = 1000
		ids := s.fillDLQ(q, n)

		// Redrive with the binary; kill it once a third is done.
		// Copy mode, which this process carries out itself (a move
		// task would go on at SQS after the kill).
		cmd := exec.CommandContext(ctx, bin, "dlq", "redrive", "--config", s.ConfigPath, "--output", output,
			"--mode", "copy", "--visibility", "4s", "--rate", "150")
		cmd.Env = os.Environ()
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		progressLine := regexp.MustCompile(`: (\d+)/(\d+) msgs`)
		var seen []string
		killedAt := -1
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			seen = append(seen, sc.Text())
			if m := progressLine.FindStringSubmatch(sc.Text()); m != nil {
				if done, _ := strconv.Atoi(m[1]); done >= n/3 && killedAt < 0 {
					killedAt = done
					if err := cmd.Process.Kill(); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		werr := cmd.Wait()
		if killedAt < 0 {
			t.Fatalf("the redrive ended (%v) before it could be killed; stderr:\n%s", werr, strings.Join(seen, "\n"))
		}
		t.Logf("killed after %d of %d reported moved", killedAt, n)

		// The dead process's hidden messages come back, and the
		// journal writes it had sent before the kill have landed (a
		// request already on its way is still applied).
		time.Sleep(5 * time.Second)
		j := &dlq.Journal{DB: s.Deps.DynamoDB, Table: s.Config.TableName(), Job: "orders", Output: output}
		journal, err := j.Entries(ctx, s.Deps.DynamoDB)
		if err != nil {
			t.Fatal(err)
		}
		// The journal is keyed by DLQ message id; map it to documents.
		dlqMsgs := s.census(q.DLQURL, false)
		work := s.census(q.WorkURL, false)
		sending, sent := map[string]bool{}, map[string]bool{}
		for _, m := range dlqMsgs {
			switch journal[m.id].State {
			case dlq.Sending:
				sending[m.doc] = true
			case dlq.Sent:
				sent[m.doc] = true
			}
		}
		inDLQ, inWork := countByDoc(dlqMsgs), countByDoc(work)
		both := 0
		for _, id := range ids {
			switch {
			case inDLQ[id] == 0 && inWork[id] == 0:
				t.Errorf("%s is on neither queue after the kill: lost", id)
			case inDLQ[id] > 1 || inWork[id] > 1:
				t.Errorf("%s is %d times on the DLQ and %d times on the work queue after the kill", id, inDLQ[id], inWork[id])
			case inDLQ[id] == 1 && inWork[id] == 1:
				both++
				if !sending[id] && !sent[id] {
					t.Errorf("%s is on both queues but the journal has no entry for it", id)
				}
			}
		}
		if len(inWork) == 0 || len(inDLQ) == 0 {
			t.Fatalf("not killed midway: %d ids on the work queue, %d on the DLQ", len(inWork), len(inDLQ))
		}
		t.Logf("after the kill: %d on the DLQ, %d on the work queue, %d on both (%d journaled sent, %d sending)",
			len(inDLQ), len(inWork), both, len(sent), len(sending))

		// A second redrive finishes the job.
		out := s.mustCLI(ctx, "dlq", "redrive", "--output", output, "--mode", "copy", "--visibility", "4s", "--json")
		var res dlq.Result
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("redrive --json: %v\n%s", err, out)
		}
		// Bound by the whole journal: messages the dead process had
		// received may still be hidden from the census above, and Sent
		// entries of messages it had already deleted are leftovers.
		var journaledSent, journaledSending int64
		for _, e := range journal {
			switch e.State {
			case dlq.Sent:
				journaledSent++
			case dlq.Sending:
				journaledSending++
			}
		}
		if res.Recovered > journaledSent || res.Resent > journaledSending || res.Resent < int64(len(sending)) || res.Done() < int64(len(dlqMsgs)) || res.Left != 0 {
			t.Errorf("second redrive %+v; want recovered <= %d, %d <= resent <= %d, done >= %d, left 0",
				res, journaledSent, len(sending), journaledSending, len(dlqMsgs))
		}
		if left := s.census(q.DLQURL, false); len(left) != 0 {
			t.Errorf("%d messages still on the DLQ after the second redrive", len(left))
		}
		// A duplicate may only come from a send in flight at the kill:
		// none on FIFO (deduplicated), at most the journaled in-flight
		// sends on a standard queue (some of those messages may have been
		// hidden from the census, so the bound is the whole journal's).
		final := countByDoc(s.census(q.WorkURL, true))
		dups := 0
		for _, id := range ids {
			switch c := final[id]; {
			case c == 0:
				t.Errorf("%s is not on the work queue after the second redrive: lost", id)
			case c > 2 || (c > 1 && q.FIFO):
				t.Errorf("%s is %d times on the work queue (fifo: %t)", id, c, q.FIFO)
			case c > 1:
				dups++
			}
		}
		if int64(dups) > journaledSending {
			t.Errorf("%d documents twice on the work queue, but only %d sends were in flight", dups, journaledSending)
		}
		entries, err := j.Entries(ctx, s.Deps.DynamoDB)
		if err != nil {
			t.Fatal(err)
		}
		for id, e := range entries {
			if e.State != dlq.Sent {
				t.Errorf("journal entry %s is %q after a complete redrive; only harmless Sent leftovers may stay", id, e.State)
			}
		}
	})
}

// fillDLQ puts n failed changes on an output's DLQ, as the writer does,
// with document ids doc-0000, doc-0001, ...; it returns the ids.
func (s *testStack) fillDLQ(q dlq.Queues, n int) []string {
	s.t.Helper()
	return s.fillDLQPadded(q, n, 0)
}

// fillDLQPadded is fillDLQ with pad bytes more in each document; a padded
// message is sent on its own.
func (s *testStack) fillDLQPadded(q dlq.Queues, n, pad int) []string {
	s.t.Helper()
	var ids []string
	var entries []sqstypes.SendMessageBatchRequestEntry
	flush := func() {
		if len(entries) == 0 {
			return
		}
		out, err := s.Deps.SQS.SendMessageBatch(s.t.Context(), &sqs.SendMessageBatchInput{QueueUrl: &q.DLQURL, Entries: entries})
		if err != nil || len(out.Failed) > 0 {
			s.t.Fatalf("fill dlq: %v %+v", err, out)
		}
		entries = nil
	}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	for i := range n {
		id := fmt.Sprintf("doc-%04d", i)
		ids = append(ids, id)
		env := envelope(q.Output, id, "1-a", 3, int64(i+1))
		if pad > 0 {
			env.Doc = json.RawMessage(fmt.Sprintf(`{"_id":%q,"_rev":"1-a","pad":%q}`, id, strings.Repeat("p", pad)))
		}
		body, _ := json.Marshal(env)
		e := sqstypes.SendMessageBatchRequestEntry{
			Id:          aws.String(strconv.Itoa(len(entries))),
			MessageBody: aws.String(string(body)),
			MessageAttributes: map[string]sqstypes.MessageAttributeValue{
				failure.AttrClass:          {DataType: aws.String("String"), StringValue: aws.String("transient")},
				failure.AttrReason:         {DataType: aws.String("String"), StringValue: aws.String("connection")},
				failure.AttrError:          {DataType: aws.String("String"), StringValue: aws.String("transient connection: output down")},
				failure.AttrAttempts:       {DataType: aws.String("Number"), StringValue: aws.String("3")},
				failure.AttrFirstFailureAt: {DataType: aws.String("String"), StringValue: aws.String(now)},
				failure.AttrLastFailureAt:  {DataType: aws.String("String"), StringValue: aws.String(now)},
				failure.AttrOutput:         {DataType: aws.String("String"), StringValue: aws.String(q.Output)},
				failure.AttrJob:            {DataType: aws.String("String"), StringValue: aws.String(q.Job)},
				failure.AttrDocID:          {DataType: aws.String("String"), StringValue: aws.String(id)},
			},
		}
		if q.FIFO {
			e.MessageGroupId = aws.String(id)
			e.MessageDeduplicationId = aws.String(id)
		}
		entries = append(entries, e)
		if len(entries) == 10 || pad > 0 {
			flush()
		}
	}
	flush()
	return ids
}

// TestRedriveLargeMessages: a copy-mode redrive of messages near SQS's size
// limit sends them in batches SQS takes (at most 1 MiB in all), so every one
// reaches the work queue.
func TestRedriveLargeMessages(t *testing.T) {
	t.Parallel()
	s := newTestStack(t, outPGFIFO)
	q := s.queues(outPGFIFO)
	ids := s.fillDLQPadded(q, 6, 300<<10)
	out := s.mustCLI(t.Context(), "dlq", "redrive", "--output", outPGFIFO, "--mode", "copy", "--visibility", "10s")
	if !strings.Contains(out, "6 messages back on "+q.WorkName) || !strings.Contains(out, "0 left in the dlq") {
		t.Errorf("redrive said:\n%s", out)
	}
	var got []string
	for _, m := range s.census(q.WorkURL, true) {
		got = append(got, m.doc)
	}
	slices.Sort(got)
	if !slices.Equal(got, ids) {
		t.Errorf("work queue holds %v, want %v", got, ids)
	}
}

// queued is one message found on a queue.
type queued struct{ id, doc string }

// census receives every message of a queue once and returns them. It
// deletes them when consume is set (the only way to see every message of a
// FIFO group), else makes them visible again.
//
// A receive whose answer is lost on its way back (the SDK retries the call)
// leaves its messages hidden for the receive's visibility timeout, and a
// census that stopped at the first empty receives would miss them. So it
// stops only when the queue holds no message it has not accounted for, and
// waits for hidden ones to come back (consuming receives hide a message for
// 5 s; holding ones for 120 s).
func (s *testStack) census(url string, consume bool) []queued {
	s.t.Helper()
	ctx := s.t.Context()
	seen := map[string]bool{}
	var out []queued
	var held []sqstypes.Message
	visibility := int32(120)
	if consume {
		visibility = 5
	}
	deadline := time.Now().Add(time.Duration(visibility)*time.Second + time.Minute)
	for {
		for empty := 0; empty < 2; {
			res, err := s.Deps.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
				QueueUrl: &url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: visibility,
			})
			if err != nil {
				s.t.Fatal(err)
			}
			if len(res.Messages) == 0 {
				empty++
				continue
			}
			empty = 0
			for _, m := range res.Messages {
				id := aws.ToString(m.MessageId)
				if consume {
					if _, err := s.Deps.SQS.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: &url, ReceiptHandle: m.ReceiptHandle}); err != nil {
						s.t.Fatal(err)
					}
				} else {
					held = append(held, m)
				}
				if seen[id] {
					continue
				}
				seen[id] = true
				var e struct {
					DocID string `json:"doc_id"`
				}
				_ = json.Unmarshal([]byte(aws.ToString(m.Body)), &e)
				out = append(out, queued{id: id, doc: e.DocID})
			}
		}
		d, err := dlq.QueueDepth(ctx, s.Deps.SQS, url)
		if err != nil {
			s.t.Fatal(err)
		}
		hidden := d.InFlight - len(held)
		if d.Visible == 0 && hidden <= 0 {
			break
		}
		if time.Now().After(deadline) {
			s.t.Logf("census of %s: %d visible and %d hidden messages not accounted for", url, d.Visible, hidden)
			break
		}
		if hidden > 0 {
			s.t.Logf("census of %s: waiting for %d hidden messages (a lost receive answer?)", url, hidden)
		}
		time.Sleep(time.Second)
	}
	for chunk := range slices.Chunk(held, 10) {
		var entries []sqstypes.ChangeMessageVisibilityBatchRequestEntry
		for i, m := range chunk {
			entries = append(entries, sqstypes.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
		}
		if _, err := s.Deps.SQS.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: &url, Entries: entries}); err != nil {
			s.t.Fatal(err)
		}
	}
	return out
}

func countByDoc(msgs []queued) map[string]int {
	out := map[string]int{}
	for _, m := range msgs {
		out[m.doc]++
	}
	return out
}

// buildCLI builds the changesctl binary for tests that run it as a process.
func buildCLI(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "changesctl")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build changesctl: %v\n%s", err, out)
	}
	return bin
}

// TestRedriveTotalOrderGroup: on LocalStack, messages redriven to the work
// queue of an ordering: total output go back to the output's single message
// group, whatever group they had on the DLQ, so the writer sees them in the
// output's order and a failure halts the whole output.
func TestRedriveTotalOrderGroup(t *testing.T) {
	t.Parallel()
	s := newTestStack(t, outPGTotal)
	q := s.queues(outPGTotal)
	s.fillDLQ(q, 5) // each in its document's group
	s.mustCLI(t.Context(), "dlq", "redrive", "--output", outPGTotal, "--mode", "copy")
	groups := map[string]int{}
	for empty := 0; empty < 2; {
		res, err := s.Deps.SQS.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{
			QueueUrl: &q.WorkURL, MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 120,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameMessageGroupId},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Messages) == 0 {
			empty++
			continue
		}
		for _, m := range res.Messages {
			groups[m.Attributes[string(sqstypes.MessageSystemAttributeNameMessageGroupId)]]++
		}
	}
	if want := map[string]int{fanout.GroupID(outPGTotal): 5}; !maps.Equal(groups, want) {
		t.Errorf("work queue message groups %v, want %v", groups, want)
	}
}
