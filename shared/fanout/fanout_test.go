package fanout_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/testbucket"
)

func TestGroupAndDeduplicationIDs(t *testing.T) {
	t.Parallel()
	if got := fanout.GroupID("order/1"); got != "order/1" {
		t.Errorf("ASCII id group = %q", got)
	}
	for _, id := range []string{"commande-été", "has space", strings.Repeat("x", 129)} {
		g := fanout.GroupID(id)
		if !strings.HasPrefix(g, "sha256:") || len(g) > 128 {
			t.Errorf("GroupID(%q) = %q, want a hash within 128 chars", id, g)
		}
	}
	// A document whose literal id is the hashed form of another's must not
	// share its group (with on_failure halt, failing one would halt the other).
	long := strings.Repeat("x", 129)
	if forged := fanout.GroupID(long); fanout.GroupID(forged) == forged {
		t.Errorf("document %q gets group %q, the group of another document (%q)", forged, fanout.GroupID(forged), long)
	}
	if g := fanout.GroupID("sha256:abc"); g == "sha256:abc" || !strings.HasPrefix(g, "sha256:") || len(g) != len("sha256:")+64 {
		t.Errorf("GroupID(%q) = %q, want the hash of the id", "sha256:abc", g)
	}
	a := fanout.DeduplicationID("j", "o", "d", json.RawMessage(`5`), 0)
	if a == fanout.DeduplicationID("j", "o", "d", json.RawMessage(`6`), 0) || a == fanout.DeduplicationID("j", "o2", "d", json.RawMessage(`5`), 0) {
		t.Error("dedup ids must differ by seq and output")
	}
	if fanout.DeduplicationID("j", "o", "d", json.RawMessage(`5`), 0) != a {
		t.Error("dedup id is not deterministic")
	}
	// A checkpoint set back starts a new epoch: the same change is new.
	e3 := fanout.DeduplicationID("j", "o", "d", json.RawMessage(`5`), 3)
	if e3 == a || e3 == fanout.DeduplicationID("j", "o", "d", json.RawMessage(`5`), 4) {
		t.Error("dedup ids must differ by replay epoch")
	}
	// Epoch zero keeps the ids of before epochs, so messages queued across
	// an upgrade still deduplicate.
	legacy := sha256.Sum256([]byte("j\x00o\x00d\x005\x00"))
	if a != hex.EncodeToString(legacy[:]) {
		t.Errorf("epoch 0 id %s, want the id without an epoch", a)
	}
}

// Against the emulator: every change reaches both a standard and a FIFO
// queue, and a body too large for a message travels as a claim check.
func TestSendWithClaimCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sq := sqs.NewFromConfig(testenv.AWS(t))
	s3c, name := testbucket.New(t)
	std, err := sq.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	fifo, err := sq.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name + ".fifo"), Attributes: map[string]string{"FifoQueue": "true"}})
	if err != nil {
		t.Fatal(err)
	}
	snd := &fanout.Sender{SQS: sq, S3: s3c, Bucket: name, Stack: "cw", MaxBytes: 4096}
	var changes []*change.Envelope
	for i := 1; i <= 25; i++ {
		doc := fmt.Sprintf(`{"n":%d}`, i)
		if i == 7 {
			doc = fmt.Sprintf(`{"big":%q}`, strings.Repeat("é", 5000))
		}
		changes = append(changes, &change.Envelope{V: 1, Job: "j", DocID: fmt.Sprintf("doc-été-%d", i), Rev: "1-a",
			Seq: json.RawMessage(fmt.Sprint(i)), Version: change.Version{Generation: 1, Counter: int64(i)}, Doc: json.RawMessage(doc)})
	}
	targets := []fanout.Target{{Output: "a", QueueURL: *std.QueueUrl}, {Output: "b", QueueURL: *fifo.QueueUrl, FIFO: true}}
	fenced := 0
	st, err := snd.Send(ctx, targets, changes, func() error { fenced++; return nil })
	if err != nil {
		t.Fatalf("send: %v", err)
	}
	if st.Messages != 50 || st.ClaimCheck != 2 || fenced < 6 {
		t.Errorf("stats %+v, fence calls %d: want 50 messages, 2 claim checks, a fence check per request", st, fenced)
	}
	for _, q := range []string{*std.QueueUrl, *fifo.QueueUrl} {
		seen := map[string]*change.Envelope{}
		receive(t, sq, q, func() bool { return len(seen) < 25 }, func(_ sqstypes.Message, e *change.Envelope) { seen[e.DocID] = e })
		if len(seen) != 25 {
			t.Fatalf("queue %s delivered %d documents, want 25", q, len(seen))
		}
		big := seen["doc-été-7"]
		if big.DocRef == nil || big.Doc != nil {
			t.Fatalf("large body not claim-checked: %+v", big.DocRef)
		}
		obj, err := s3c.GetObject(ctx, &s3.GetObjectInput{Bucket: &big.DocRef.Bucket, Key: &big.DocRef.Key})
		if err != nil {
			t.Fatalf("get claim check: %v", err)
		}
		obj.Body.Close()
	}
	// A fence that refuses stops the send before any request.
	stop := errors.New("lease expired")
	if _, err := snd.Send(ctx, targets, changes[:1], func() error { return stop }); !errors.Is(err, stop) {
		t.Errorf("send with refusing fence: %v", err)
	}
}

// Against the emulator: a target with ordering total puts every document in
// one message group named after the output, so a FIFO queue hands the
// changes back in the order they were sent, across documents, each with the
// same deduplication id a per-document target would give it.
func TestSendTotalOrder(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg := testenv.AWS(t)
	sq := sqs.NewFromConfig(cfg)
	name := testenv.Name(t) + ".fifo"
	q, err := sq.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: map[string]string{"FifoQueue": "true"}})
	if err != nil {
		t.Fatal(err)
	}
	f, err := config.Parse([]byte(`{"jobs":[{"id":"j","source":{"type":"couchdb","url":"http://h/db"},
		"outputs":[{"id":"o","type":"http","ordering":"total","http":{"url":"http://x/{doc_id}"}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	target := fanout.NewTarget(f.Jobs[0].Outputs[0], *q.QueueUrl)
	if !target.FIFO || !target.Total {
		t.Fatalf("target %+v, want FIFO with one group", target)
	}
	var changes []*change.Envelope
	var want []string
	for i := 1; i <= 23; i++ {
		id := fmt.Sprintf("doc-%d", (i*7)%23)
		changes = append(changes, &change.Envelope{V: 1, Job: "j", DocID: id, Rev: "1-a",
			Seq: json.RawMessage(fmt.Sprint(i)), Version: change.Version{Generation: 1, Counter: int64(i)}, Doc: json.RawMessage(`{}`)})
		want = append(want, id)
	}
	snd := &fanout.Sender{SQS: sq, MaxBytes: 4096}
	if _, err := snd.Send(ctx, []fanout.Target{target}, changes, func() error { return nil }); err != nil {
		t.Fatalf("send: %v", err)
	}
	var got []string
	receive(t, sq, *q.QueueUrl, func() bool { return len(got) < len(want) }, func(m sqstypes.Message, e *change.Envelope) {
		if g := m.Attributes["MessageGroupId"]; g != "o" {
			t.Errorf("%s in group %q, want the output's group o", e.DocID, g)
		}
		if d := m.Attributes["MessageDeduplicationId"]; d != fanout.DeduplicationID("j", "o", e.DocID, e.Seq, 0) {
			t.Errorf("%s dedup id %q, want the one of (job, output, doc, seq)", e.DocID, d)
		}
		got = append(got, e.DocID)
	})
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("receive order (-sent +received):\n%s", d)
	}
}

// receive takes messages from the queue, with their system attributes,
// while more says so and the queue answers within a second; each is decoded,
// handed to each and deleted.
func receive(t *testing.T, sq *sqs.Client, queueURL string, more func() bool, each func(sqstypes.Message, *change.Envelope)) {
	t.Helper()
	ctx := t.Context()
	for more() {
		out, err := sq.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &queueURL, MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll}})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) == 0 {
			return
		}
		for _, m := range out.Messages {
			e, err := change.Decode([]byte(*m.Body))
			if err != nil {
				t.Fatal(err)
			}
			each(m, e)
			if _, err := sq.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: &queueURL, ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
	}
}
