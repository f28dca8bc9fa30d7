package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/failure"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/poll"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

// The whole pipeline converges on the source's winning revisions: 2,000+
// documents with updates, deletes, unicode ids, ids with '/', and one body
// larger than a queue message (claim check), into PostgreSQL, S3 and HTTP.
func TestConvergesToSourceWinners(t *testing.T) {
	ctx, s := parallelStack(t, stackOptions{limit: 250})
	s.load(ctx, sample.Options{Docs: 2000, UpdateEvery: 3, DeleteEvery: 7, Seed: 42})
	bigID := "big/ünïcode dóc"
	if _, err := s.PutDoc(ctx, bigID, map[string]any{"type": "order", "notes": strings.Repeat("é", 200*1024)}); err != nil { // ~400 KB of UTF-8
		t.Fatal(err)
	}

	sum := s.runUntilIdle(ctx, localrun.Options{})
	want := s.sourceState(ctx)
	if len(want) < 1700 {
		t.Fatalf("source holds %d live documents, want the sample's ~1,700", len(want))
	}
	if _, ok := want[bigID]; !ok {
		t.Fatal("source lacks the large document")
	}
	if d := cmp.Diff(want, s.pgState(ctx)); d != "" {
		t.Errorf("postgres differs from the source (-source +postgres):\n%s", d)
	}
	if d := cmp.Diff(want, s.s3State(ctx)); d != "" {
		t.Errorf("s3 differs from the source (-source +s3):\n%s", d)
	}
	if d := cmp.Diff(want, s.httpState()); d != "" {
		t.Errorf("http receiver differs from the source (-source +http):\n%s", d)
	}
	for k, st := range sum.Outputs {
		if st.DeadLettered != 0 {
			t.Errorf("%s: %d messages dead-lettered, want 0", k, st.DeadLettered)
		}
	}
	if sum.Read < 2000 {
		t.Errorf("read %d changes, want at least 2000", sum.Read)
	}
	st, err := s.Leases.Get(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if st.Checkpoint == nil || st.Released != true {
		t.Errorf("job item after the run: checkpoint %s released %v", st.Checkpoint, st.Released)
	}
}

// An output answering 500 recovers and gets everything; a document it
// answers 400 for goes to the DLQ with its reason, and the rest is delivered.
func TestOutputFailuresRetryAndDeadLetter(t *testing.T) {
	ctx, s := parallelStack(t, stackOptions{outputs: []string{"rest"}, maxReceive: 4})
	s.load(ctx, sample.Options{Docs: 40, Seed: 7})
	poison := sample.ID(5)
	var fails atomic.Int32
	s.recv.FailWith(func(r *http.Request) int {
		id, _ := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), "/docs/"))
		if id == poison {
			return http.StatusBadRequest
		}
		if fails.Add(1) <= 25 {
			return http.StatusInternalServerError
		}
		return 0
	})
	sum := s.runUntilIdle(ctx, localrun.Options{})

	want := s.sourceState(ctx)
	delete(want, poison)
	if d := cmp.Diff(want, s.httpState()); d != "" {
		t.Errorf("receiver (-want +got):\n%s", d)
	}
	st := sum.Outputs["orders/rest"]
	if st.Retried == 0 || st.DeadLettered != 1 {
		t.Errorf("stats %+v: want retries and exactly one dead letter", st)
	}
	msgs := receiveAll(t, s, "rest")
	if len(msgs) != 1 {
		t.Fatalf("DLQ holds %d messages, want 1", len(msgs))
	}
	attrs := map[string]string{}
	for k, v := range msgs[0].MessageAttributes {
		attrs[k] = aws.ToString(v.StringValue)
	}
	for k, want := range map[string]string{
		failure.AttrClass: "permanent", failure.AttrReason: "http_status", failure.AttrHTTPStatus: "400",
		failure.AttrDocID: poison, failure.AttrOutput: "rest", failure.AttrJob: "orders",
	} {
		if attrs[k] != want {
			t.Errorf("DLQ attribute %s = %q, want %q (all: %v)", k, attrs[k], want, attrs)
		}
	}
	env, err := change.Decode([]byte(aws.ToString(msgs[0].Body)))
	if err != nil || env.DocID != poison {
		t.Errorf("DLQ body is not the original envelope of %s: %v", poison, err)
	}
}

// Duplicates and reordering never let an older change overwrite a newer one,
// and a deleted document stays deleted when a stale update arrives late.
func TestDuplicatesAndReorderingAreHarmless(t *testing.T) {
	ctx, s := parallelStack(t, stackOptions{outputs: []string{"pg", "archive"}})
	mk := func(id, rev string, gen, n int64, deleted bool) *change.Envelope {
		e := &change.Envelope{V: change.EnvelopeVersion, Job: "orders", DocID: id, Rev: rev, Seq: json.RawMessage(fmt.Sprint(n)),
			Deleted: deleted, Version: change.Version{Generation: gen, Counter: n}, EnqueuedAt: time.Now()}
		if !deleted {
			e.Doc = json.RawMessage(fmt.Sprintf(`{"_id":%q,"_rev":%q,"n":%d}`, id, rev, n))
		}
		return e
	}
	// Sent newest first, with duplicates, stale updates after a delete, and a
	// conflict's lower revision observed last.
	batches := [][]*change.Envelope{
		{mk("a", "3-c", 2, 3, false), mk("b", "4-d", 2, 5, true), mk("c", "3-z", 2, 1, false)},
		{mk("a", "1-a", 1, 9, false), mk("a", "3-c", 2, 3, false), mk("b", "3-c", 2, 4, false)},
		{mk("a", "2-b", 2, 2, false), mk("b", "2-b", 1, 7, false), mk("c", "2-y", 2, 6, false)},
	}
	for _, b := range batches {
		sendEnvelopes(t, s, b)
		s.runUntilIdle(ctx, localrun.Options{NoPoller: true})
	}
	want := map[string]string{"a": "3-c", "c": "2-y"}
	if d := cmp.Diff(want, s.pgState(ctx)); d != "" {
		t.Errorf("postgres (-want +got):\n%s", d)
	}
	if d := cmp.Diff(want, s.s3State(ctx)); d != "" {
		t.Errorf("s3 (-want +got):\n%s", d)
	}
}

// A conflicted document whose winning branch is deleted ends with the
// source's new winner, although its revision is lower than the old one.
func TestConflictWinnerDeletedConverges(t *testing.T) {
	ctx, s := parallelStack(t, stackOptions{outputs: []string{"pg", "archive", "rest"}})
	id := "conflicted/doc"
	bulkNoNewEdits(t, s.SourceURL, []map[string]any{
		{"_id": id, "_rev": "2-aaaa", "side": "a", "_revisions": map[string]any{"start": 2, "ids": []string{"aaaa", "root"}}},
		{"_id": id, "_rev": "3-bbbb", "side": "b", "_revisions": map[string]any{"start": 3, "ids": []string{"bbbb", "bmid", "root"}}},
	})
	s.runUntilIdle(ctx, localrun.Options{})
	if got := s.pgState(ctx)[id]; got != "3-bbbb" {
		t.Fatalf("before the delete postgres holds %q, want the winner 3-bbbb", got)
	}
	if err := s.DeleteDoc(ctx, id, "3-bbbb"); err != nil {
		t.Fatal(err)
	}
	want := s.sourceState(ctx)
	if want[id] != "2-aaaa" {
		t.Fatalf("source winner after deleting 3-bbbb is %q, want 2-aaaa", want[id])
	}
	s.runUntilIdle(ctx, localrun.Options{})
	for name, got := range map[string]map[string]string{"postgres": s.pgState(ctx), "s3": s.s3State(ctx), "http": s.httpState()} {
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%s (-source +output):\n%s", name, d)
		}
	}
}

// Malformed feed JSON, a source answering 401, and a source that is down each
// give a clear error and leave the checkpoint where it was.
func TestSourceFailuresKeepCheckpoint(t *testing.T) {
	parallel(t)
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"results":[{"seq":6,"id":"x","changes":[{"rev":"1-a"}]`)
	}))
	t.Cleanup(broken.Close)
	unauthorized := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":"unauthorized","reason":"Name or password is incorrect."}`)
	}))
	t.Cleanup(unauthorized.Close)
	tests := []struct {
		name, url string
		want      string // in the error
	}{
		{"malformed json", broken.URL + "/db", "malformed"},
		{"unauthorized", unauthorized.URL + "/db", "401"},
		{"source down", "http://127.0.0.1:1/db", "connect"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, s := parallelStack(t, stackOptions{sourceURL: tt.url, outputs: []string{"pg"}})
			setCheckpoint(t, s, json.RawMessage(`5`))
			p, err := s.Deps.Poller(ctx, "orders")
			if err != nil {
				t.Fatal(err)
			}
			res, err := p.Run(ctx, poll.Invocation{Owner: "test", Host: "h", Deadline: time.Now().Add(8 * time.Second)})
			if err == nil || !strings.Contains(strings.ToLower(err.Error()), tt.want) {
				t.Errorf("run error = %v, want one mentioning %q", err, tt.want)
			}
			if res.Enqueued != 0 {
				t.Errorf("enqueued %d changes from a failing source", res.Enqueued)
			}
			st, err := s.Leases.Get(ctx, "orders")
			if err != nil {
				t.Fatal(err)
			}
			if string(st.Checkpoint) != "5" {
				t.Errorf("checkpoint moved to %s, want 5", st.Checkpoint)
			}
		})
	}
}

// Two pollers at once: one holds the lease and moves the checkpoint; the
// other stands by; a holder whose lease was taken has its checkpoint refused.
func TestTwoPollersOneActive(t *testing.T) {
	ctx, s := parallelStack(t, stackOptions{outputs: []string{"pg"}, limit: 50})
	s.load(ctx, sample.Options{Docs: 300, Seed: 3})
	p, err := s.Deps.Poller(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	// The second one's budget ends before the first releases.
	results := s.runPollerPair(ctx, p, func(i int) time.Duration { return time.Duration(8-3*i) * time.Second }).results
	if results[0].Role != "active" || results[1].Role != "standby" {
		t.Fatalf("roles %q and %q, want active and standby", results[0].Role, results[1].Role)
	}
	if results[1].Enqueued != 0 {
		t.Errorf("standby enqueued %d", results[1].Enqueued)
	}
	// A zombie: a lease handle of the generation before the current one.
	st, _ := s.Leases.Get(ctx, "orders")
	zombie := &lease.Lease{JobID: "orders", Owner: "p0", Generation: st.Generation, TTL: 10 * time.Second}
	if _, _, err := s.Leases.Acquire(ctx, "orders", "p2", "h", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Leases.Checkpoint(ctx, zombie, json.RawMessage(`1`), 0); !errors.Is(err, lease.ErrLeaseLost) {
		t.Errorf("zombie checkpoint: %v, want ErrLeaseLost", err)
	}
	after, _ := s.Leases.Get(ctx, "orders")
	if string(after.Checkpoint) != string(st.Checkpoint) {
		t.Errorf("checkpoint moved from %s to %s by a refused write", st.Checkpoint, after.Checkpoint)
	}
}

func setCheckpoint(t *testing.T, s *testStack, seq json.RawMessage) {
	t.Helper()
	ctx := context.Background()
	l, err := s.Leases.ForceTake(ctx, "orders", "setup", "h", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Leases.SetCheckpoint(ctx, l, seq); err != nil {
		t.Fatal(err)
	}
	if err := s.Leases.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

func sendEnvelopes(t *testing.T, s *testStack, envs []*change.Envelope) {
	t.Helper()
	ctx := context.Background()
	var targets []fanout.Target
	for _, o := range s.Config.Jobs[0].Outputs {
		q, err := s.Queues(ctx, "orders", o.ID)
		if err != nil {
			t.Fatal(err)
		}
		targets = append(targets, fanout.Target{Output: o.ID, QueueURL: q.WorkURL, FIFO: q.FIFO})
	}
	snd := &fanout.Sender{SQS: s.Deps.SQS, S3: s.Deps.S3, Bucket: s.Config.Stack.Bucket, Stack: s.Config.Stack.Prefix, MaxBytes: s.Config.Stack.MaxMessageBytes}
	if _, err := snd.Send(ctx, targets, envs, func() error { return nil }); err != nil {
		t.Fatalf("send envelopes: %v", err)
	}
}

// receiveAll receives the messages of an output's DLQ.
func receiveAll(t *testing.T, s *testStack, output string) []sqsMessage {
	t.Helper()
	ctx := context.Background()
	q, err := s.Queues(ctx, "orders", output)
	if err != nil {
		t.Fatal(err)
	}
	var out []sqsMessage
	for range 5 {
		r, err := s.Deps.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: &q.DLQURL, MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}, VisibilityTimeout: 30,
		})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r.Messages...)
		if len(r.Messages) == 0 && len(out) > 0 {
			break
		}
	}
	return out
}

func bulkNoNewEdits(t *testing.T, db string, docs []map[string]any) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"docs": docs, "new_edits": false})
	resp, err := http.Post(db+"/_bulk_docs", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("bulk docs new_edits=false: status %d", resp.StatusCode)
	}
}

// A checkpoint set back replays the feed to every output, FIFO ones
// included: within SQS's five-minute deduplication window, the changes
// queued again carry the new replay epoch and are not dropped as repeats of
// the first pass.
func TestReplayAfterResetReachesFIFOOutput(t *testing.T) {
	ctx, s := parallelStack(t, stackOptions{outputs: []string{"rest"}, rest: func(o *config.Output) {
		o.Ordering = config.OrderingPerDocument
	}})
	s.load(ctx, sample.Options{Docs: 30, Seed: 11})
	want := s.sourceState(ctx)
	before := 0
	for pass := 1; pass <= 2; pass++ {
		if pass == 2 {
			setCheckpoint(t, s, nil)
		}
		sum := s.runUntilIdle(ctx, localrun.Options{})
		if got := sum.Outputs["orders/rest"].Delivered; got != int64(len(want)) {
			t.Errorf("pass %d: delivered %d changes to the FIFO output, want %d", pass, got, len(want))
		}
		puts, _, stale := s.recv.Counts()
		if puts-before != len(want) || stale != 0 {
			t.Errorf("pass %d: the receiver took %d documents (%d stale), want %d", pass, puts-before, stale, len(want))
		}
		before = puts
		if d := cmp.Diff(want, s.httpState()); d != "" {
			t.Errorf("pass %d: receiver (-want +got):\n%s", pass, d)
		}
	}
}
