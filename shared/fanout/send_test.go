package fanout_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sync/errgroup"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/fanout"
)

// fakeSQS records what reaches each queue, in the order requests completed,
// and how many requests were in flight at once. answer, when set, decides a
// request's outcome.
type fakeSQS struct {
	delay  time.Duration
	answer func(n int, in *sqs.SendMessageBatchInput) (*sqs.SendMessageBatchOutput, error)

	inflight, peak atomic.Int64
	calls          atomic.Int64

	mu       sync.Mutex
	accepted map[string][]*change.Envelope // by queue URL
	groupsIn map[string]int                // FIFO groups of the requests in flight
	overlap  []string                      // groups seen in two requests at once
}

// enter counts a call in flight, raising peak to the most at once, and
// returns the function that counts it out.
func enter(inflight, peak *atomic.Int64) (leave func()) {
	cur := inflight.Add(1)
	for {
		p := peak.Load()
		if cur <= p || peak.CompareAndSwap(p, cur) {
			break
		}
	}
	return func() { inflight.Add(-1) }
}

func (f *fakeSQS) SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, _ ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	n := int(f.calls.Add(1))
	defer enter(&f.inflight, &f.peak)()
	f.mu.Lock()
	if f.groupsIn == nil {
		f.groupsIn = map[string]int{}
	}
	for _, e := range in.Entries {
		if g := aws.ToString(e.MessageGroupId); g != "" {
			if f.groupsIn[g] > 0 {
				f.overlap = append(f.overlap, g)
			}
			f.groupsIn[g]++
		}
	}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		for _, e := range in.Entries {
			if g := aws.ToString(e.MessageGroupId); g != "" {
				f.groupsIn[g]--
			}
		}
		f.mu.Unlock()
	}()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(f.delay):
	}
	out := &sqs.SendMessageBatchOutput{}
	if f.answer != nil {
		o, err := f.answer(n, in)
		if err != nil {
			return nil, err
		}
		out = o
	}
	failed := map[string]bool{}
	for _, fe := range out.Failed {
		failed[aws.ToString(fe.Id)] = true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.accepted == nil {
		f.accepted = map[string][]*change.Envelope{}
	}
	q := aws.ToString(in.QueueUrl)
	for _, e := range in.Entries {
		if failed[aws.ToString(e.Id)] {
			continue
		}
		env, err := change.Decode([]byte(aws.ToString(e.MessageBody)))
		if err != nil {
			return nil, fmt.Errorf("fake sqs: %w", err)
		}
		f.accepted[q] = append(f.accepted[q], env)
	}
	return out, nil
}

func (f *fakeSQS) queued(q string) []*change.Envelope {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.accepted[q]
}

// fakeS3 keeps the objects put, and the peak of puts in flight.
type fakeS3 struct {
	delay          time.Duration
	inflight, peak atomic.Int64
	mu             sync.Mutex
	objects        map[string][]byte
}

func (f *fakeS3) PutObject(ctx context.Context, in *s3.PutObjectInput, _ ...func(*s3.Options)) (*s3.PutObjectOutput, error) {
	defer enter(&f.inflight, &f.peak)()
	time.Sleep(f.delay)
	b, err := io.ReadAll(in.Body)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.objects == nil {
		f.objects = map[string][]byte{}
	}
	f.objects[aws.ToString(in.Key)] = b
	return &s3.PutObjectOutput{}, nil
}

// changesOf numbers one change per id, in order, as a poller would.
func changesOf(ids ...string) []*change.Envelope {
	out := make([]*change.Envelope, len(ids))
	for i, id := range ids {
		out[i] = &change.Envelope{V: change.EnvelopeVersion, Job: "j", DocID: id, Rev: fmt.Sprintf("%d-r", i+1),
			Seq: json.RawMessage(strconv.Itoa(i + 1)), Version: change.Version{Generation: 1, Counter: int64(i + 1)},
			Doc: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	return out
}

func docs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("d%04d", i)
	}
	return ids
}

func counters(envs []*change.Envelope) map[string][]int64 {
	out := map[string][]int64{}
	for _, e := range envs {
		out[e.DocID] = append(out[e.DocID], e.Counter)
	}
	return out
}

// Sends running side by side share the Sender's limit: a poller with two
// chunks in flight has no more requests in flight than with one.
func TestSendConcurrencyAcrossSends(t *testing.T) {
	t.Parallel()
	f := &fakeSQS{delay: 20 * time.Millisecond}
	snd := &fanout.Sender{SQS: f, MaxBytes: 256 * 1024, Concurrency: 8}
	targets := []fanout.Target{{Output: "o", QueueURL: "q"}}
	var g errgroup.Group
	for k := range 2 {
		g.Go(func() error {
			ids := make([]string, 200)
			for i := range ids {
				ids[i] = fmt.Sprintf("s%d-d%03d", k, i)
			}
			_, err := snd.Send(context.Background(), targets, changesOf(ids...), func() error { return nil })
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("send: %v", err)
	}
	if got := f.peak.Load(); got != 8 {
		t.Errorf("peak requests in flight across two Sends = %d, want 8 (the limit)", got)
	}
	if got := len(f.queued("q")); got != 400 {
		t.Errorf("%d messages queued, want 400", got)
	}
}

// The requests of a page, across outputs, run concurrently up to the limit,
// and every change reaches every output with its output's name.
func TestSendConcurrency(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		limit     int
		changes   int
		targets   int
		wantPeak  int64
		wantCalls int64
	}{
		{"one output, default limit", 0, 2000, 1, fanout.DefaultConcurrency, 200},
		{"three outputs share the limit", 8, 200, 3, 8, 60},
		{"one request", 4, 7, 1, 1, 1},
		{"limit of one is sequential", 1, 100, 2, 1, 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := &fakeSQS{delay: 20 * time.Millisecond}
			snd := &fanout.Sender{SQS: f, MaxBytes: 256 * 1024, Concurrency: tt.limit}
			var targets []fanout.Target
			for k := range tt.targets {
				targets = append(targets, fanout.Target{Output: fmt.Sprintf("o%d", k), QueueURL: fmt.Sprintf("q%d", k)})
			}
			var fences atomic.Int64
			st, err := snd.Send(context.Background(), targets, changesOf(docs(tt.changes)...), func() error { fences.Add(1); return nil })
			if err != nil {
				t.Fatalf("send: %v", err)
			}
			if got := f.peak.Load(); got != tt.wantPeak {
				t.Errorf("peak requests in flight = %d, want %d", got, tt.wantPeak)
			}
			if got := f.calls.Load(); got != tt.wantCalls || fences.Load() != got || int64(st.Requests) != got {
				t.Errorf("requests %d, fence calls %d, stats.Requests %d: want %d of each", got, fences.Load(), st.Requests, tt.wantCalls)
			}
			if st.Messages != tt.changes*tt.targets {
				t.Errorf("stats.Messages = %d, want %d", st.Messages, tt.changes*tt.targets)
			}
			for _, tg := range targets {
				got := f.queued(tg.QueueURL)
				if len(got) != tt.changes {
					t.Fatalf("%s got %d changes, want %d", tg.QueueURL, len(got), tt.changes)
				}
				for _, e := range got {
					if e.Output != tg.Output {
						t.Fatalf("%s got an envelope for output %q", tg.QueueURL, e.Output)
					}
				}
			}
		})
	}
}

// Two changes of one document in a page reach a FIFO queue in their order,
// never in requests in flight together; a standard queue gets everything in
// one wave.
func TestSendFIFOOrderPerDocument(t *testing.T) {
	t.Parallel()
	// a appears three times, b twice, the rest once; batches of ten mean the
	// copies of a would land in different requests.
	ids := append(docs(25), "a")
	ids = append(ids, docs(3)...) // d0000..d0002 again
	ids = append(ids, "a", "b")
	ids = append([]string{"a", "b"}, ids...)
	changes := changesOf(ids...)
	f := &fakeSQS{delay: 5 * time.Millisecond}
	// The first request fails one entry: its retry must still come before
	// the document's next change.
	f.answer = func(n int, in *sqs.SendMessageBatchInput) (*sqs.SendMessageBatchOutput, error) {
		if n == 1 && aws.ToString(in.QueueUrl) == "fifo" {
			return &sqs.SendMessageBatchOutput{Failed: []sqstypes.BatchResultErrorEntry{{Id: in.Entries[0].Id, Code: aws.String("InternalError")}}}, nil
		}
		return &sqs.SendMessageBatchOutput{}, nil
	}
	snd := &fanout.Sender{SQS: f, MaxBytes: 256 * 1024, Concurrency: 8, Backoff: time.Millisecond}
	targets := []fanout.Target{{Output: "f", QueueURL: "fifo", FIFO: true}, {Output: "s", QueueURL: "std"}}
	if _, err := snd.Send(context.Background(), targets, changes, func() error { return nil }); err != nil {
		t.Fatalf("send: %v", err)
	}
	want := counters(changes)
	if diff := cmp.Diff(want, counters(f.queued("fifo"))); diff != "" {
		t.Errorf("FIFO queue order per document (-want +got):\n%s", diff)
	}
	if len(f.overlap) > 0 {
		t.Errorf("groups in two requests in flight at once: %v", f.overlap)
	}
	if got := len(f.queued("std")); got != len(changes) {
		t.Errorf("standard queue got %d changes, want %d", got, len(changes))
	}
}

// On a FIFO queue with ordering total (one message group), the requests go
// one after another in feed order, while the other outputs' run beside
// them.
func TestSendTotalOrderOneRequestAtATime(t *testing.T) {
	t.Parallel()
	changes := changesOf(append(docs(45), "d0003", "d0010")...)
	f := &fakeSQS{delay: 5 * time.Millisecond}
	var mu sync.Mutex
	inTotal, peakTotal := 0, 0
	f.answer = func(_ int, in *sqs.SendMessageBatchInput) (*sqs.SendMessageBatchOutput, error) {
		return &sqs.SendMessageBatchOutput{}, nil
	}
	counting := &countingSQS{next: f, queue: "total", before: func() {
		mu.Lock()
		inTotal++
		peakTotal = max(peakTotal, inTotal)
		mu.Unlock()
	}, after: func() {
		mu.Lock()
		inTotal--
		mu.Unlock()
	}}
	snd := &fanout.Sender{SQS: counting, MaxBytes: 256 * 1024, Concurrency: 8}
	targets := []fanout.Target{{Output: "t", QueueURL: "total", FIFO: true, Total: true}, {Output: "s", QueueURL: "std"}}
	if _, err := snd.Send(context.Background(), targets, changes, func() error { return nil }); err != nil {
		t.Fatalf("send: %v", err)
	}
	var got []int64
	for _, e := range f.queued("total") {
		got = append(got, e.Counter)
	}
	var want []int64
	for _, c := range changes {
		want = append(want, c.Counter)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("total-order queue (-feed +queued):\n%s", diff)
	}
	if peakTotal != 1 {
		t.Errorf("%d requests to the total-order queue in flight at once, want 1", peakTotal)
	}
	if p := f.peak.Load(); p < 2 {
		t.Errorf("peak requests in flight %d: the standard queue's requests should run beside", p)
	}
}

// countingSQS calls before and after around each request to queue.
type countingSQS struct {
	next          fanout.SQS
	queue         string
	before, after func()
}

func (c *countingSQS) SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	if aws.ToString(in.QueueUrl) == c.queue {
		c.before()
		defer c.after()
	}
	return c.next.SendMessageBatch(ctx, in, opts...)
}

// A request that fails makes Send fail, whatever else was queued; nothing
// later than the failure is reported as sent, and the caller's fence is
// never asked from two goroutines at once.
func TestSendPartialFailure(t *testing.T) {
	t.Parallel()
	boom := errors.New("connection reset")
	tests := []struct {
		name   string
		answer func(n int, in *sqs.SendMessageBatchInput) (*sqs.SendMessageBatchOutput, error)
		want   error
	}{
		{"request error", func(n int, _ *sqs.SendMessageBatchInput) (*sqs.SendMessageBatchOutput, error) {
			if n == 7 {
				return nil, boom
			}
			return &sqs.SendMessageBatchOutput{}, nil
		}, boom},
		{"sender fault", func(n int, in *sqs.SendMessageBatchInput) (*sqs.SendMessageBatchOutput, error) {
			if n == 3 {
				return &sqs.SendMessageBatchOutput{Failed: []sqstypes.BatchResultErrorEntry{{Id: in.Entries[2].Id, SenderFault: true, Code: aws.String("InvalidMessageContents")}}}, nil
			}
			return &sqs.SendMessageBatchOutput{}, nil
		}, fanout.ErrRejected},
		{"entries keep failing", func(n int, in *sqs.SendMessageBatchInput) (*sqs.SendMessageBatchOutput, error) {
			for _, e := range in.Entries {
				if aws.ToString(e.Id) == "42" {
					return &sqs.SendMessageBatchOutput{Failed: []sqstypes.BatchResultErrorEntry{{Id: e.Id, Code: aws.String("ServiceUnavailable")}}}, nil
				}
			}
			return &sqs.SendMessageBatchOutput{}, nil
		}, fanout.ErrRejected},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := &fakeSQS{delay: 2 * time.Millisecond, answer: tt.answer}
			snd := &fanout.Sender{SQS: f, MaxBytes: 256 * 1024, Concurrency: 4, Attempts: 3, Backoff: time.Millisecond}
			var inFence, concurrentFence atomic.Int64
			fence := func() error {
				if inFence.Add(1) > 1 {
					concurrentFence.Add(1)
				}
				time.Sleep(100 * time.Microsecond)
				inFence.Add(-1)
				return nil
			}
			changes := changesOf(docs(200)...)
			st, err := snd.Send(context.Background(), []fanout.Target{{Output: "o", QueueURL: "q"}}, changes, fence)
			if !errors.Is(err, tt.want) {
				t.Fatalf("send error = %v, want %v", err, tt.want)
			}
			if concurrentFence.Load() > 0 {
				t.Errorf("fence asked concurrently %d times", concurrentFence.Load())
			}
			if st.Messages >= len(changes) {
				t.Errorf("stats report %d messages queued after a failure", st.Messages)
			}
			if got := len(f.queued("q")); st.Messages > got {
				t.Errorf("stats report %d messages, the queue holds %d", st.Messages, got)
			}
		})
	}
}

// A fence that refuses stops every request after it, including retries.
func TestSendFenceBeforeEveryRequest(t *testing.T) {
	t.Parallel()
	stop := errors.New("lease expired")
	f := &fakeSQS{answer: func(n int, in *sqs.SendMessageBatchInput) (*sqs.SendMessageBatchOutput, error) {
		// Every first attempt fails one entry, so every batch needs a retry.
		if len(in.Entries) > 1 {
			return &sqs.SendMessageBatchOutput{Failed: []sqstypes.BatchResultErrorEntry{{Id: in.Entries[1].Id, Code: aws.String("InternalError")}}}, nil
		}
		return &sqs.SendMessageBatchOutput{}, nil
	}}
	snd := &fanout.Sender{SQS: f, MaxBytes: 256 * 1024, Concurrency: 4, Backoff: time.Millisecond}
	var asked atomic.Int64
	fence := func() error {
		if asked.Add(1) > 5 {
			return stop
		}
		return nil
	}
	_, err := snd.Send(context.Background(), []fanout.Target{{Output: "o", QueueURL: "q"}}, changesOf(docs(100)...), fence)
	if !errors.Is(err, stop) {
		t.Fatalf("send error = %v, want the fence's", err)
	}
	if got := f.calls.Load(); got != 5 {
		t.Errorf("%d requests, want 5 (one per fence that allowed it)", got)
	}
}

// Bodies too large for a message are put in S3 concurrently, once per
// change whatever the number of outputs, before any message is sent.
func TestSendClaimChecksConcurrently(t *testing.T) {
	t.Parallel()
	changes := changesOf(docs(40)...)
	for i, c := range changes {
		if i%2 == 0 {
			c.Doc = json.RawMessage(fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", 3000)))
		}
	}
	f := &fakeSQS{}
	s3c := &fakeS3{delay: 10 * time.Millisecond}
	snd := &fanout.Sender{SQS: f, S3: s3c, Bucket: "b", Stack: "cw", MaxBytes: 2048, Concurrency: 8}
	targets := []fanout.Target{{Output: "a", QueueURL: "qa"}, {Output: "b", QueueURL: "qb", FIFO: true}}
	st, err := snd.Send(context.Background(), targets, changes, func() error { return nil })
	if err != nil {
		t.Fatalf("send: %v", err)
	}
	if st.Puts != 20 || len(s3c.objects) != 20 || st.ClaimCheck != 40 {
		t.Errorf("puts %d, objects %d, claim-checked entries %d: want 20, 20, 40", st.Puts, len(s3c.objects), st.ClaimCheck)
	}
	if p := s3c.peak.Load(); p < 2 || p > 8 {
		t.Errorf("peak puts in flight = %d, want between 2 and 8", p)
	}
	for _, q := range []string{"qa", "qb"} {
		for _, e := range f.queued(q) {
			big := e.Counter%2 == 1 // counters start at 1 for change 0
			if big != (e.DocRef != nil) || (e.DocRef != nil && e.Doc != nil) {
				t.Fatalf("%s: change %d has doc_ref %v and doc %d bytes", q, e.Counter, e.DocRef, len(e.Doc))
			}
			if big && string(s3c.objects[e.DocRef.Key]) != string(changes[e.Counter-1].Doc) {
				t.Fatalf("%s: claim check %s does not hold the body", q, e.DocRef.Key)
			}
		}
	}
	// Sending again (a retry of the page) reuses the objects.
	if _, err := snd.Send(context.Background(), targets, changes, func() error { return nil }); err != nil {
		t.Fatalf("send again: %v", err)
	}
	if len(s3c.objects) != 20 {
		t.Errorf("a second send put %d objects in all, want the same 20", len(s3c.objects))
	}
}

// bodySQS records the raw entries of every request, accepting them all.
type bodySQS struct {
	mu      sync.Mutex
	entries map[string][]sqstypes.SendMessageBatchRequestEntry // by queue URL
}

func (f *bodySQS) SendMessageBatch(_ context.Context, in *sqs.SendMessageBatchInput, _ ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.entries == nil {
		f.entries = map[string][]sqstypes.SendMessageBatchRequestEntry{}
	}
	q := aws.ToString(in.QueueUrl)
	f.entries[q] = append(f.entries[q], in.Entries...)
	return &sqs.SendMessageBatchOutput{}, nil
}

// Every message body is the envelope json.Marshal writes, with the
// output's id, byte for byte; FIFO entries carry the document's group and
// the change's deduplication id.
func TestSendBodiesAreTheEnvelopes(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 28, 3, 4, 5, 123456789, time.FixedZone("", -5*3600))
	ids := []string{"plain", "with \"quotes\" & <tags>", "line\u2028sep", "bad \xff utf-8", "sha256:x", strings.Repeat("long", 40), "plain"}
	changes := changesOf(ids...)
	for i, c := range changes {
		c.EnqueuedAt = at
		switch i % 3 {
		case 0:
			c.Doc = json.RawMessage("{ \"a\" : [ 1 , \"<&>\" ] ,\n\"b\": \"\u2029\" }")
		case 1:
			c.Deleted, c.Doc = true, nil
		case 2:
			c.Seq = json.RawMessage(` [ 3, "g1AAAA" ] `)
		}
	}
	targets := []fanout.Target{
		{Output: "pg", QueueURL: "standard"},
		{Output: "rest-api", QueueURL: "fifo", FIFO: true, Epoch: 2},
		{Output: "all", QueueURL: "total", FIFO: true, Total: true},
	}
	f := &bodySQS{}
	snd := &fanout.Sender{SQS: f, MaxBytes: 256 * 1024}
	if _, err := snd.Send(context.Background(), targets, changes, func() error { return nil }); err != nil {
		t.Fatalf("send: %v", err)
	}
	for _, tg := range targets {
		got := f.entries[tg.QueueURL]
		if len(got) != len(changes) {
			t.Fatalf("%s got %d entries, want %d", tg.QueueURL, len(got), len(changes))
		}
		for _, e := range got {
			i, err := strconv.Atoi(aws.ToString(e.Id))
			if err != nil || i < 0 || i >= len(changes) {
				t.Fatalf("%s: entry id %q names no change", tg.QueueURL, aws.ToString(e.Id))
			}
			env := *changes[i]
			env.Output = tg.Output
			want, err := json.Marshal(&env)
			if err != nil {
				t.Fatal(err)
			}
			if got := aws.ToString(e.MessageBody); got != string(want) {
				t.Errorf("%s, change %d: body\n%s\nwant\n%s", tg.QueueURL, i, got, want)
			}
			wantGroup, wantDedup := "", ""
			if tg.FIFO {
				wantGroup = tg.Group(env.DocID)
				wantDedup = fanout.DeduplicationID(env.Job, tg.Output, env.DocID, env.Seq, tg.Epoch)
			}
			if g, d := aws.ToString(e.MessageGroupId), aws.ToString(e.MessageDeduplicationId); g != wantGroup || d != wantDedup {
				t.Errorf("%s, change %d: group %q, deduplication id %q; want %q, %q", tg.QueueURL, i, g, d, wantGroup, wantDedup)
			}
		}
	}
}

// A change whose body is not JSON fails the Send before any request.
func TestSendRefusesABodyThatIsNotJSON(t *testing.T) {
	t.Parallel()
	changes := changesOf("a", "b")
	changes[1].Doc = json.RawMessage(`{"a":`)
	f := &bodySQS{}
	snd := &fanout.Sender{SQS: f, MaxBytes: 256 * 1024}
	_, err := snd.Send(context.Background(), []fanout.Target{{Output: "o", QueueURL: "q"}}, changes, func() error { return nil })
	if err == nil || !strings.Contains(err.Error(), "encode envelope b") {
		t.Fatalf("send error = %v, want one naming the envelope of b", err)
	}
	if len(f.entries) != 0 {
		t.Errorf("requests were sent: %v", f.entries)
	}
}

// BenchmarkSend: the sender's own work for a page of 500 small changes (the
// SDK left out: the SQS client accepts every entry at once).
func BenchmarkSend(b *testing.B) {
	doc := json.RawMessage(`{"customer":"customer-527","items":[{"qty":1,"sku":"sku-34"},{"qty":1,"sku":"sku-45"}],"number":0,"total":30.74,"type":"order","version":1,"_id":"order-000000","_rev":"1-126bb1ea5557246190dda254f698e658"}`)
	changes := changesOf(docs(500)...)
	for _, c := range changes {
		c.Doc, c.EnqueuedAt = doc, time.Date(2026, 11, 28, 3, 4, 5, 123456789, time.UTC)
	}
	targets := []fanout.Target{{Output: "pg", QueueURL: "pg"}, {Output: "archive", QueueURL: "archive"}, {Output: "rest", QueueURL: "rest", FIFO: true}}
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("outputs=%d", n), func(b *testing.B) {
			snd := &fanout.Sender{SQS: acceptSQS{}, MaxBytes: 256 * 1024}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := snd.Send(context.Background(), targets[:n], changes, func() error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(changes)*n)/1e3, "µs/message")
		})
	}
}

// acceptSQS accepts every entry.
type acceptSQS struct{}

func (acceptSQS) SendMessageBatch(context.Context, *sqs.SendMessageBatchInput, ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	return &sqs.SendMessageBatchOutput{}, nil
}
