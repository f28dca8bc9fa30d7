package tests

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/demo/receiver"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

// dlqRetention is the DLQs' retention in TestDLQArchive: SQS drops a
// message this long after it was queued.
const dlqRetention = 2 * time.Minute

// TestDLQArchive: with the DLQs' retention at two minutes, a change that
// fails permanently (an HTTP 400) at a FIFO output and at a standard one is
// dead-lettered, then archived to the stack bucket by the poller's
// invocations before SQS would drop it; after its retention has passed it is
// still in the archive, `changesctl dlq list` and `show` report it as
// archived, with its reason and age, `changesctl dlq redrive` sends it back
// to the work queue and the writer delivers it once the output takes it.
func TestDLQArchive(t *testing.T) {
	parallel(t)
	ctx := t.Context()
	bin := changesctl(t)
	const poison = "poison"
	var refuse atomic.Bool
	refuse.Store(true)
	recvs := map[string]*receiver.Server{}
	outputs := []*config.Output{
		{ID: "rest", Type: config.OutputHTTP, Ordering: config.OrderingPerDocument, MaxReceiveCount: 2},
		{ID: "hook", Type: config.OutputHTTP, Ordering: config.OrderingNone, MaxReceiveCount: 2},
	}
	for _, o := range outputs {
		r, u := refusingReceiver(t, poison, &refuse)
		recvs[o.ID] = r
		o.HTTP = &config.HTTPOutput{URL: u + "/docs/{doc_id}", Timeout: config.Duration(5 * time.Second)}
	}
	// The poller's invocations overlap (a timeout 20 s longer than the 1m
	// schedule), so one always runs to sweep the DLQs: every 15 s, a
	// quarter of the minute archive_after (half the retention) leaves.
	cfg := &config.File{
		Stack: config.Stack{PollerTimeout: config.Duration(80 * time.Second), WriterTimeout: config.Duration(10 * time.Second),
			DLQ: config.DLQ{Retention: config.Duration(dlqRetention)}},
		Jobs: []*config.Job{{
			ID:      "orders",
			Feed:    config.Feed{Limit: 100, Timeout: config.Duration(2 * time.Second)},
			Lease:   config.Lease{TTL: config.Duration(10 * time.Second)},
			Outputs: outputs,
		}},
	}
	s := stack.ForTest(t, stack.Options{Config: cfg})
	queues := map[string]dlq.Queues{}
	for _, o := range outputs {
		q, err := s.Queues(ctx, "orders", o.ID)
		if err != nil {
			t.Fatal(err)
		}
		queues[o.ID] = q
		a, err := s.Deps.SQS.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
			QueueUrl: &q.DLQURL, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameMessageRetentionPeriod},
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := a.Attributes[string(sqstypes.QueueAttributeNameMessageRetentionPeriod)]; got != strconv.Itoa(int(dlqRetention.Seconds())) {
			t.Errorf("DLQ %s keeps messages %s s, want %d s (stack.dlq.retention)", q.DLQName, got, int(dlqRetention.Seconds()))
		}
	}

	// A control: a message in a queue of SQS's shortest retention, which an
	// emulator that expires messages as SQS does drops while the test waits.
	control := controlQueue(t, s)

	_, stop := s.RunInBackground(t, localrun.Options{})
	for _, id := range []string{"a", poison, "b"} {
		if _, err := s.PutDoc(ctx, id, map[string]any{"type": "order"}); err != nil {
			t.Fatal(err)
		}
	}

	// Dead-lettered: the writer moves the refused change to each DLQ.
	for name, q := range queues {
		if err := testenv.Poll(ctx, time.Minute, 250*time.Millisecond, func(ctx context.Context) (bool, error) {
			d, err := dlq.QueueDepth(ctx, s.Deps.SQS, q.DLQURL)
			return d.Total()+archived(ctx, t, s, name) > 0, err
		}); err != nil {
			t.Fatalf("%s: the refused change never reached the DLQ: %v", name, err)
		}
	}

	// Archived, well before SQS would drop it.
	for name, q := range queues {
		err := testenv.Poll(ctx, dlqRetention, time.Second, func(ctx context.Context) (bool, error) {
			d, err := dlq.QueueDepth(ctx, s.Deps.SQS, q.DLQURL)
			return d.Total() == 0 && archived(ctx, t, s, name) == 1, err
		})
		if err != nil {
			d, _ := dlq.QueueDepth(ctx, s.Deps.SQS, q.DLQURL)
			t.Fatalf("%s: after %s the DLQ holds %d message(s) and the archive %d object(s), want 0 and 1: nothing kept the change past SQS's retention (%s)",
				name, dlqRetention, d.Total(), archived(ctx, t, s, name), dlqRetention)
		}
	}
	shown := map[string]archivedMessage{}
	for name := range queues {
		var got []archivedMessage
		out := runCLI(t, bin, s, "dlq", "show", "--output", name, "--limit", "10", "--json")
		if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 1 {
			t.Fatalf("%s: dlq show --json: %v, %d messages\n%s", name, err, len(got), out)
		}
		m := got[0]
		if m.Archived == nil || m.Envelope == nil || m.Envelope.DocID != poison || m.Failure.HTTPStatus != http.StatusBadRequest {
			t.Fatalf("%s: dlq show --json = %s, want the archived change of %s with its HTTP 400", name, out, poison)
		}
		if waited := m.Archived.At.Sub(m.SentAt); waited >= dlqRetention {
			t.Errorf("%s: archived %s after it was queued, at or past the DLQ's retention (%s): SQS could have dropped it first", name, waited, dlqRetention)
		}
		shown[name] = m
		list := runCLI(t, bin, s, "dlq", "list", "--output", name)
		for _, w := range []string{"1 archived", "http_status", "http 400"} {
			if !strings.Contains(list, w) {
				t.Errorf("%s: dlq list lacks %q:\n%s", name, w, list)
			}
		}
		text := runCLI(t, bin, s, "dlq", "show", "--output", name)
		if flat := strings.Join(strings.Fields(text), " "); !strings.Contains(flat, "archived "+m.Archived.At.Format(time.RFC3339)) || !strings.Contains(flat, `document "poison"`) {
			t.Errorf("%s: dlq show does not mark the change archived:\n%s", name, text)
		}
	}

	// Past the retention of every message the test queued: SQS would have
	// dropped anything left in a DLQ; the archive still has the changes.
	for name, m := range shown {
		if wait := time.Until(m.SentAt.Add(dlqRetention + 5*time.Second)); wait > 0 {
			time.Sleep(wait)
		}
		if n := archived(ctx, t, s, name); n != 1 {
			t.Errorf("%s: the archive holds %d object(s) after the DLQ's retention, want 1", name, n)
		}
	}
	if control.dropped(t) {
		t.Log("the emulator dropped the control message past its queue's retention, as SQS does: the changes outlived theirs in the archive alone")
	} else {
		t.Log("the emulator keeps messages past their queue's retention (LocalStack started without SQS_ENABLE_MESSAGE_RETENTION_PERIOD=1): the archive's timing above is what shows it would have kept them")
	}
	metrics := s.Metrics().String()
	for name := range queues {
		if !hasArchiveMetric(metrics, name, 1, 60) {
			t.Errorf("%s: no metric record with ArchivedMessages 1 and ArchiveOldestAge of 60 s or more:\n%s", name, metrics)
		}
	}

	// Redriven and delivered, once the output takes it.
	refuse.Store(false)
	for name, q := range queues {
		out := runCLI(t, bin, s, "dlq", "redrive", "--output", name)
		if !strings.Contains(out, "1 messages back on "+q.WorkName) || !strings.Contains(out, "1 from the archive") {
			t.Errorf("%s: dlq redrive said:\n%s", name, out)
		}
	}
	for name, r := range recvs {
		err := testenv.Poll(ctx, time.Minute, 250*time.Millisecond, func(context.Context) (bool, error) {
			docs, err := r.Docs()
			_, ok := docs[poison]
			return ok, err
		})
		if err != nil {
			t.Errorf("%s: the redriven change was not delivered: %v", name, err)
		}
		if n := archived(ctx, t, s, name); n != 0 {
			t.Errorf("%s: the archive holds %d object(s) after the redrive, want 0", name, n)
		}
	}
	stop()
}

// archivedMessage is what `changesctl dlq show --json` prints of a message.
type archivedMessage struct {
	SentAt   time.Time `json:"sent_at"`
	Archived *struct {
		Key string    `json:"key"`
		At  time.Time `json:"at"`
	} `json:"archived"`
	Envelope *struct {
		DocID string `json:"doc_id"`
	} `json:"envelope"`
	Failure struct {
		HTTPStatus int `json:"http_status"`
	} `json:"failure"`
}

// archived counts the objects in the DLQ archive of an output of the
// stack's job orders.
func archived(ctx context.Context, t *testing.T, s *stack.Stack, output string) int {
	t.Helper()
	prefix := "dlq-archive/" + s.Config.Stack.Prefix + "/orders/" + output + "/"
	out, err := s.Deps.S3.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: &s.Config.Stack.Bucket, Prefix: aws.String(prefix)})
	if err != nil {
		t.Fatalf("list %s: %v", prefix, err)
	}
	return len(out.Contents)
}

// hasArchiveMetric reports whether an EMF record of output has
// ArchivedMessages n and ArchiveOldestAge at least minAge seconds.
func hasArchiveMetric(records, output string, n, minAge float64) bool {
	for _, line := range strings.Split(records, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["Output"] != output {
			continue
		}
		count, _ := rec["ArchivedMessages"].(float64)
		age, _ := rec["ArchiveOldestAge"].(float64)
		if count == n && age >= minAge {
			return true
		}
	}
	return false
}

// runCLI runs the changesctl binary with the stack's configuration and
// returns what it printed, failing t on an error.
func runCLI(t *testing.T, bin string, s *stack.Stack, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bin, append(args, "--config", s.ConfigPath)...)
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("changesctl %s: %v\n%s%s", strings.Join(args, " "), err, out, msg)
	}
	return string(out)
}

// control is a queue holding one message, with SQS's shortest retention.
type control struct {
	s   *stack.Stack
	url string
}

func controlQueue(t *testing.T, s *stack.Stack) control {
	t.Helper()
	ctx := t.Context()
	out, err := s.Deps.SQS.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(s.Name + "-control"),
		Attributes: map[string]string{string(sqstypes.QueueAttributeNameMessageRetentionPeriod): "60"}})
	if err != nil {
		t.Fatal(err)
	}
	c := control{s: s, url: aws.ToString(out.QueueUrl)}
	t.Cleanup(func() { s.Deps.SQS.DeleteQueue(context.WithoutCancel(ctx), &sqs.DeleteQueueInput{QueueUrl: &c.url}) })
	if _, err := s.Deps.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &c.url, MessageBody: aws.String("control")}); err != nil {
		t.Fatal(err)
	}
	return c
}

// dropped reports whether the control's message is gone.
func (c control) dropped(t *testing.T) bool {
	t.Helper()
	out, err := c.s.Deps.SQS.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &c.url, WaitTimeSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	return len(out.Messages) == 0
}

// refusingReceiver starts an HTTP receiver that answers 400 to the document
// id while refuse is set, and accepts everything else; it returns the
// receiver and its base URL.
func refusingReceiver(t *testing.T, id string, refuse *atomic.Bool) (*receiver.Server, string) {
	t.Helper()
	r, err := receiver.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r.FailWith(func(req *http.Request) int {
		got, _ := url.PathUnescape(strings.TrimPrefix(req.URL.EscapedPath(), "/docs/"))
		if got == id && refuse.Load() {
			return http.StatusBadRequest
		}
		return 0
	})
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return r, srv.URL
}
