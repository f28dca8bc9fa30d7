package dlq

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/failure"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/testbucket"
)

// archiveEnv is one (job, output) on the local services: its work queue and
// DLQ, an archive in a bucket of the test's own and a redrive journal in a
// state table of its own.
type archiveEnv struct {
	t       *testing.T
	db      *dynamodb.Client
	sqs     *sqs.Client
	s3      *s3.Client
	q       Queues
	archive *Archive
	journal *Journal
}

func newArchiveEnv(t *testing.T, fifo bool) *archiveEnv {
	t.Helper()
	cfg := testenv.AWS(t)
	e := &archiveEnv{t: t, sqs: sqs.NewFromConfig(cfg)}
	var bucket string
	e.s3, bucket = testbucket.New(t)
	var table string
	e.db, table = testenv.StateTable(t)
	name := testenv.Name(t)
	e.q = Queues{Job: "orders", Output: "out", FIFO: fifo}
	suffix := ""
	attrs := map[string]string{}
	if fifo {
		suffix = ".fifo"
		attrs["FifoQueue"] = "true"
		attrs["ContentBasedDeduplication"] = "true"
	}
	e.q.WorkName, e.q.DLQName = name+suffix, name+"-dlq"+suffix
	for _, q := range []struct{ name, url, arn *string }{{&e.q.WorkName, &e.q.WorkURL, &e.q.WorkARN}, {&e.q.DLQName, &e.q.DLQURL, &e.q.DLQARN}} {
		out, err := e.sqs.CreateQueue(t.Context(), &sqs.CreateQueueInput{QueueName: q.name, Attributes: attrs})
		if err != nil {
			t.Fatalf("create queue %s: %v", *q.name, err)
		}
		url := aws.ToString(out.QueueUrl)
		t.Cleanup(func() { e.sqs.DeleteQueue(context.WithoutCancel(t.Context()), &sqs.DeleteQueueInput{QueueUrl: &url}) })
		*q.url = url
		a, err := e.sqs.GetQueueAttributes(t.Context(), &sqs.GetQueueAttributesInput{QueueUrl: &url, AttributeNames: []sqstypes.QueueAttributeName{"QueueArn"}})
		if err != nil {
			t.Fatal(err)
		}
		*q.arn = a.Attributes["QueueArn"]
	}
	e.archive = &Archive{S3: e.s3, Bucket: bucket, Stack: "cw", Job: "orders", Output: "out"}
	e.journal = &Journal{DB: e.db, Table: table, Job: "orders", Output: "out"}
	return e
}

// deadLetter puts a failed change of doc on the DLQ, as the writer moves
// one there: the envelope as body, the failure record as attributes.
func (e *archiveEnv) deadLetter(doc string, counter int64, docRef *change.ObjectRef) {
	e.t.Helper()
	env := change.Envelope{V: change.EnvelopeVersion, Job: "orders", Output: "out", DocID: doc, Rev: "1-a",
		Seq: json.RawMessage(strconv.FormatInt(counter, 10)), Version: change.Version{Generation: 1, Counter: counter}, EnqueuedAt: time.Now().UTC()}
	if docRef != nil {
		env.DocRef = docRef
	} else {
		env.Doc = json.RawMessage(fmt.Sprintf(`{"_id":%q,"n":%d}`, doc, counter))
	}
	body, err := json.Marshal(env)
	if err != nil {
		e.t.Fatal(err)
	}
	in := &sqs.SendMessageInput{QueueUrl: &e.q.DLQURL, MessageBody: aws.String(string(body)), MessageAttributes: map[string]sqstypes.MessageAttributeValue{
		failure.AttrClass: str("permanent"), failure.AttrReason: str("http_status"), failure.AttrHTTPStatus: num(422),
		failure.AttrError: str("permanent http_status (http 422): refused " + doc), failure.AttrDocID: str(doc),
	}}
	if e.q.FIFO {
		in.MessageGroupId = aws.String(doc)
	}
	if _, err := e.sqs.SendMessage(e.t.Context(), in); err != nil {
		e.t.Fatal(err)
	}
}

func (e *archiveEnv) sweeper(after time.Duration) *Sweeper {
	return &Sweeper{SQS: e.sqs, Archive: e.archive, DLQURL: e.q.DLQURL, DLQName: e.q.DLQName, After: after}
}

func (e *archiveEnv) depth(url string) Depth {
	e.t.Helper()
	d, err := QueueDepth(e.t.Context(), e.sqs, url)
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

// archived reads the archive in key order.
func (e *archiveEnv) archived() []Message {
	e.t.Helper()
	var keys []string
	if err := e.archive.Keys(e.t.Context(), func(k ArchivedKey) bool { keys = append(keys, k.Key); return true }); err != nil {
		e.t.Fatal(err)
	}
	var msgs []Message
	for _, k := range keys {
		m, err := e.archive.Read(e.t.Context(), k)
		if err != nil {
			e.t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	return msgs
}

// receiveWork receives what the work queue holds, in order, and returns
// the document ids with their counters ("a/1").
func (e *archiveEnv) receiveWork() []string {
	e.t.Helper()
	var got []string
	for {
		out, err := e.sqs.ReceiveMessage(e.t.Context(), &sqs.ReceiveMessageInput{QueueUrl: &e.q.WorkURL, MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
		if err != nil {
			e.t.Fatal(err)
		}
		if len(out.Messages) == 0 {
			return got
		}
		for _, m := range out.Messages {
			var env change.Envelope
			if err := json.Unmarshal([]byte(aws.ToString(m.Body)), &env); err != nil {
				e.t.Fatalf("work queue message is no envelope: %v", err)
			}
			got = append(got, fmt.Sprintf("%s/%d", env.DocID, env.Counter))
			if _, err := e.sqs.DeleteMessage(e.t.Context(), &sqs.DeleteMessageInput{QueueUrl: &e.q.WorkURL, ReceiptHandle: m.ReceiptHandle}); err != nil {
				e.t.Fatal(err)
			}
		}
	}
}

func eachDLQ(t *testing.T, fn func(t *testing.T, e *archiveEnv)) {
	for _, fifo := range []bool{false, true} {
		name := "standard"
		if fifo {
			name = "fifo"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, newArchiveEnv(t, fifo))
		})
	}
}

// TestSweep: a sweep leaves in the DLQ what has waited less than After,
// visible again at once, and moves what has waited longer to the archive:
// the body, the failure record and the FIFO group as the DLQ held them, one
// object per message in the DLQ's order, deleted from the DLQ. Sweeping a
// message again (a sweep that died between the put and the delete) writes
// the same object.
func TestSweep(t *testing.T) {
	t.Parallel()
	eachDLQ(t, func(t *testing.T, e *archiveEnv) {
		ctx := t.Context()
		for i, doc := range []string{"a", "b", "a"} {
			e.deadLetter(doc, int64(i+1), nil)
		}
		res, err := e.sweeper(time.Hour).Sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want := (SweepResult{Kept: 3}); res != want {
			t.Errorf("sweep of young messages = %+v, want %+v", res, want)
		}
		if d := e.depth(e.q.DLQURL); d.Visible != 3 {
			t.Errorf("after the sweep the DLQ has %+v, want its 3 messages visible again", d)
		}

		time.Sleep(1100 * time.Millisecond)
		res, err = e.sweeper(time.Second).Sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res != (SweepResult{Archived: 3}) {
			t.Errorf("sweep = %+v, want 3 archived", res)
		}
		if d := e.depth(e.q.DLQURL); d.Total() != 0 {
			t.Errorf("after archiving, the DLQ holds %+v", d)
		}
		msgs := e.archived()
		var got []string
		for _, m := range msgs {
			got = append(got, fmt.Sprintf("%s/%d", m.DocID(), m.Envelope.Counter))
			if m.Archived == nil || m.Failure.HTTPStatus != 422 || m.Failure.Error != "permanent http_status (http 422): refused "+m.DocID() || m.EnvelopeError != "" {
				t.Errorf("archived %s = %+v", m.ID, m)
			}
			if e.q.FIFO && m.GroupID != m.DocID() {
				t.Errorf("archived %s has group %q, want %q", m.ID, m.GroupID, m.DocID())
			}
			if age := m.Archived.At.Sub(m.SentAt); age < time.Second {
				t.Errorf("archived %s %s after it was queued, before After (1s)", m.ID, age)
			}
		}
		wantOrder := []string{"a/1", "b/2", "a/3"}
		if e.q.FIFO {
			// Within a group the DLQ's order holds.
			slices.SortStableFunc(got, func(x, y string) int { return strings.Compare(x[:1], y[:1]) })
			wantOrder = []string{"a/1", "a/3", "b/2"}
		}
		if d := cmp.Diff(wantOrder, got); d != "" {
			t.Errorf("archive in key order (-want +got):\n%s", d)
		}
		oldest := msgs[0].SentAt
		for _, m := range msgs {
			if m.SentAt.Before(oldest) {
				oldest = m.SentAt
			}
		}
		stats, err := e.archive.Stats(ctx)
		if err != nil || stats.Count != 3 || !stats.Oldest.Equal(oldest) {
			t.Errorf("archive stats = %+v, %v; want 3, the oldest queued at %s", stats, err, oldest)
		}

		// A sweep that died after the put: the message is back in the DLQ.
		e.deadLetter("c", 4, nil)
		time.Sleep(1100 * time.Millisecond)
		out, err := e.sqs.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &e.q.DLQURL, WaitTimeSeconds: 1,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll}, MessageAttributeNames: []string{"All"}})
		if err != nil || len(out.Messages) != 1 {
			t.Fatalf("receive c: %v, %d messages", err, len(out.Messages))
		}
		c := Decode(out.Messages[0])
		if _, err := e.archive.Put(ctx, &c, e.q.DLQName, time.Now()); err != nil {
			t.Fatal(err)
		}
		if err := release(ctx, e.sqs, e.q.DLQURL, out.Messages); err != nil {
			t.Fatal(err)
		}
		if res, err := e.sweeper(time.Second).Sweep(ctx); err != nil || res.Archived != 1 {
			t.Fatalf("sweep after a crash = %+v, %v; want c archived", res, err)
		}
		if n := len(e.archived()); n != 4 {
			t.Errorf("archive holds %d objects, want 4: one per message", n)
		}
	})
}

// TestArchiveRedrive: a redrive sends back the archived messages before the
// DLQ's, in the DLQ's order, with their bodies and failure records, deletes
// each object once the work queue took its message, writes back a claim
// check that expired from the bucket, and only deletes a message an
// interrupted redrive journaled as sent.
func TestArchiveRedrive(t *testing.T) {
	t.Parallel()
	eachDLQ(t, func(t *testing.T, e *archiveEnv) {
		ctx := t.Context()
		// A claim check, kept by the archive.
		ref := &change.ObjectRef{Bucket: e.archive.Bucket, Key: claimcheck.Key("cw", "orders", change.Version{Generation: 1, Counter: 2})}
		content := []byte(`{"_id":"big","n":2}`)
		ref.Size = int64(len(content))
		if _, err := e.s3.PutObject(ctx, &s3.PutObjectInput{Bucket: &ref.Bucket, Key: &ref.Key, Body: bytes.NewReader(content)}); err != nil {
			t.Fatal(err)
		}
		e.deadLetter("a", 1, nil)
		e.deadLetter("big", 2, ref)
		e.deadLetter("a", 3, nil)
		time.Sleep(1100 * time.Millisecond)
		if res, err := e.sweeper(time.Second).Sweep(ctx); err != nil || res.Archived != 3 {
			t.Fatalf("sweep = %+v, %v", res, err)
		}
		// The claim check expires; a later failure of a waits in the DLQ.
		if _, err := e.s3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &ref.Bucket, Key: &ref.Key}); err != nil {
			t.Fatal(err)
		}
		e.deadLetter("a", 4, nil)
		// An interrupted redrive sent the first change of a.
		for _, m := range e.archived() {
			if m.Envelope.Counter == 1 {
				if err := e.journal.Mark(ctx, []string{m.ID}, Sent, nil); err != nil {
					t.Fatal(err)
				}
			}
		}

		r := &Redriver{SQS: e.sqs, Journal: e.journal, Queues: e.q, Archive: e.archive, Mode: ModeCopy, Visibility: 5 * time.Second}
		res, err := r.Redrive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := Result{Mode: ModeCopy, Moved: 3, Recovered: 1, FromArchive: 3}
		if d := cmp.Diff(want, res); d != "" {
			t.Errorf("redrive (-want +got):\n%s", d)
		}
		got := e.receiveWork()
		wantWork := []string{"big/2", "a/3", "a/4"}
		if e.q.FIFO {
			slices.SortStableFunc(got, func(x, y string) int { return strings.Compare(x[:1], y[:1]) })
			wantWork = []string{"a/3", "a/4", "big/2"}
		}
		if d := cmp.Diff(wantWork, got); d != "" {
			t.Errorf("work queue (-want +got):\n%s", d)
		}
		if n := len(e.archived()); n != 0 {
			t.Errorf("archive holds %d objects after the redrive", n)
		}
		if d := e.depth(e.q.DLQURL); d.Total() != 0 {
			t.Errorf("DLQ holds %+v after the redrive", d)
		}
		obj, err := e.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: &ref.Bucket, Key: &ref.Key})
		if err != nil {
			t.Fatalf("the claim check was not written back: %v", err)
		}
		b, _ := io.ReadAll(obj.Body)
		obj.Body.Close()
		if !bytes.Equal(b, content) {
			t.Errorf("claim check written back = %q, want %q", b, content)
		}
		if entries, err := e.journal.Entries(ctx, e.db); err != nil || len(entries) != 0 {
			t.Errorf("journal after the redrive: %v, %v; want no entry", entries, err)
		}
	})
}

// TestArchiveKey: an archived message's key sorts in the DLQ's order (the
// FIFO sequence number, else the time it was queued) and gives back its
// message id and that time; keys the archive does not make are skipped.
func TestArchiveKey(t *testing.T) {
	t.Parallel()
	a := &Archive{Stack: "cw", Job: "orders", Output: "out"}
	sent := time.UnixMilli(1795834731984).UTC()
	tests := []struct {
		name, id, seq string
		want          string
	}{
		{"standard", "dc7d48bb-7f8f-4a0e", "", "dlq-archive/cw/orders/out/1795834731984-dc7d48bb-7f8f-4a0e.json"},
		{"fifo", "7728-e251", "15426068320025070553", "dlq-archive/cw/orders/out/0000000000000000000015426068320025070553-1795834731984-7728-e251.json"},
		{"a sequence number that is not one", "x", "12a", "dlq-archive/cw/orders/out/1795834731984-x.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := &Message{ID: tt.id, SentAt: sent, sequence: tt.seq}
			key := a.Key(m)
			if key != tt.want {
				t.Errorf("Key = %q, want %q", key, tt.want)
			}
			got, ok := a.parseKey(key)
			if want := (ArchivedKey{Key: key, MessageID: tt.id, SentAt: sent}); !ok || got != want {
				t.Errorf("parseKey(%q) = %+v, %v; want %+v", key, got, ok, want)
			}
		})
	}
	if a.Key(&Message{ID: "a", SentAt: sent, sequence: "9"}) >= a.Key(&Message{ID: "a", SentAt: sent, sequence: "10"}) {
		t.Error("FIFO keys do not sort by sequence number")
	}
	for _, bad := range []string{"dlq-archive/cw/orders/other/1795834731984-x.json", "dlq-archive/cw/orders/out/17958-x.json",
		"dlq-archive/cw/orders/out/1795834731984-x.txt", "dlq-archive/cw/orders/out/179583473198x-x.json", "dlq-archive/cw/orders/out/1795834731984-.json"} {
		if k, ok := a.parseKey(bad); ok {
			t.Errorf("parseKey(%q) = %+v, want no key of the archive", bad, k)
		}
	}
}

// TestSweepClaim: of the invocations that ask, one gets the sweep, and the
// next one only once the interval has passed.
func TestSweepClaim(t *testing.T) {
	t.Parallel()
	db, table := testenv.StateTable(t)
	now := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	c := &SweepClaim{DB: db, Table: table, Job: "orders", Now: func() time.Time { return now }}
	other := &SweepClaim{DB: db, Table: table, Job: "catalog", Now: c.Now}
	for i, step := range []struct {
		after time.Duration
		claim *SweepClaim
		want  bool
	}{
		{0, c, true},
		{0, c, false},
		{0, other, true}, // another job's
		{10 * time.Second, c, false},
		{55 * time.Second, c, true}, // within a tenth of the interval
		{30 * time.Second, c, false},
	} {
		now = now.Add(step.after)
		got, err := step.claim.Take(t.Context(), time.Minute)
		if err != nil || got != step.want {
			t.Errorf("step %d: Take = %v, %v; want %v", i, got, err, step.want)
		}
	}
}
