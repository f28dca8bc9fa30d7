package writer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/docid"
	"github.com/changes-worker/changes-worker/shared/failure"
	"github.com/changes-worker/changes-worker/shared/statetable/halt"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// fakeHalts keeps halt records in memory, with the store's rules: a record
// for the same message counts an attempt and keeps Since and the request;
// Check answers Resumed once after the last record went.
type fakeHalts struct {
	mu       sync.Mutex
	states   map[string]halt.State
	getErr   error
	clearErr error // every Clear fails with it when set
	clears   int   // Clear calls
	indexed  bool  // a record was written since Check last found none
}

func (f *fakeHalts) Check(ctx context.Context, job, output string) (halt.OutputStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.getErr != nil {
		return halt.Unhalted, f.getErr
	}
	for k := range f.states {
		if strings.HasPrefix(k, halt.Key(job, output, "")) {
			return halt.Halted, nil
		}
	}
	if f.indexed {
		f.indexed = false
		return halt.Resumed, nil
	}
	return halt.Unhalted, nil
}

func (f *fakeHalts) Get(ctx context.Context, job, output, group string) (*halt.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.getErr != nil {
		return nil, f.getErr
	}
	st, ok := f.states[halt.Key(job, output, group)]
	if !ok {
		return nil, nil
	}
	return &st, nil
}

func (f *fakeHalts) Record(ctx context.Context, st halt.State) (*halt.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.states == nil {
		f.states = map[string]halt.State{}
	}
	k := halt.Key(st.Job, st.Output, st.Group)
	if old, ok := f.states[k]; ok && old.MessageID == st.MessageID {
		st.Since, st.Attempts, st.Action, st.ActionAt = old.Since, old.Attempts, old.Action, old.ActionAt
	}
	st.Attempts++
	f.states[k] = st
	f.indexed = true
	return &st, nil
}

func (f *fakeHalts) Clear(ctx context.Context, job, output, group, messageID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clears++
	if f.clearErr != nil {
		return f.clearErr
	}
	k := halt.Key(job, output, group)
	if st, ok := f.states[k]; ok && st.MessageID == messageID {
		delete(f.states, k)
	}
	return nil
}

func (f *fakeHalts) request(t *testing.T, job, output, group string, a halt.Action) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	k := halt.Key(job, output, group)
	st, ok := f.states[k]
	if !ok {
		t.Fatalf("no halt %s to %s", k, a)
	}
	st.Action = a
	f.states[k] = st
}

func haltConfig(t *testing.T, ordering string) *config.File {
	t.Helper()
	f, err := config.Parse([]byte(fmt.Sprintf(`{"jobs":[{"id":"j","source":{"type":"couchdb","url":"http://h/db"},
		"outputs":[{"id":"o","type":"http","ordering":%q,"on_failure":"halt","max_receive_count":3,"http":{"url":"http://x/{doc_id}"}}]}]}`, ordering)))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// rec is a message of the halting output; under ordering total every
// message is in the output's group.
func (r *haltRun) rec(id, doc string, counter int64, receives int) events.SQSMessage {
	r.t.Helper()
	m := record(r.t, r.f, id, doc, "1-"+doc, counter, receives)
	if r.f.Jobs[0].Outputs[0].Ordering == config.OrderingTotal {
		m.Attributes["MessageGroupId"] = "o"
	}
	return m
}

type haltRun struct {
	t     *testing.T
	f     *config.File
	h     *Handler
	sink  *fakeSink
	sqs   *fakeSQS
	halts *fakeHalts
	emf   *bytes.Buffer
	fail  map[string]error // doc id -> the sink's answer
	mu    sync.Mutex
}

func newHaltRun(t *testing.T, ordering string) *haltRun {
	r := &haltRun{t: t, f: haltConfig(t, ordering), sqs: &fakeSQS{}, halts: &fakeHalts{}, emf: &bytes.Buffer{}, fail: map[string]error{}}
	r.sink = &fakeSink{apply: func(c *change.Envelope) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.fail[c.DocID]
	}}
	r.h = newHandler(r.f, r.sink, r.sqs)
	r.h.Halts = r.halts
	r.h.Metrics = r.emf
	r.h.Now = func() time.Time { return time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC) }
	return r
}

func (r *haltRun) setFail(doc string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.fail, doc)
		return
	}
	r.fail[doc] = err
}

// handleWant runs one batch and checks the failed message ids and the doc
// ids the sink was given against wantFailed and wantApplied.
func (r *haltRun) handleWant(wantFailed, wantApplied []string, recs ...events.SQSMessage) {
	r.t.Helper()
	failed, applied := r.handle(recs...)
	if d := cmp.Diff(wantFailed, failed); d != "" {
		r.t.Errorf("failed (-want +got):\n%s", d)
	}
	if d := cmp.Diff(wantApplied, applied); d != "" {
		r.t.Errorf("applied (-want +got):\n%s", d)
	}
}

// handle runs one batch and returns the failed message ids, sorted, and the
// doc ids the sink was given since the previous call.
func (r *haltRun) handle(recs ...events.SQSMessage) (failed, applied []string) {
	r.t.Helper()
	before := len(r.sink.calls)
	resp, err := r.h.Handle(r.t.Context(), events.SQSEvent{Records: recs})
	if err != nil {
		r.t.Fatal(err)
	}
	for _, f := range resp.BatchItemFailures {
		failed = append(failed, f.ItemIdentifier)
	}
	sort.Strings(failed)
	for _, call := range r.sink.calls[before:] {
		for _, id := range call {
			applied = append(applied, strings.SplitN(id, "@", 2)[0])
		}
	}
	return failed, applied
}

var errRefused = &deliver.Error{Class: deliver.Permanent, Reason: "http_status", HTTPStatus: 400, Err: errors.New("bad request")}

// Ordering total with on_failure halt: a permanent failure stops the whole
// output at the change; nothing after it is applied, nothing goes to the DLQ,
// the halt is recorded and retried with a growing delay; a skip moves the
// change to the DLQ with its reason and the rest follows in order.
func TestHaltTotalSkip(t *testing.T) {
	t.Parallel()
	r := newHaltRun(t, "total")
	r.setFail("x", errRefused)

	r.handleWant([]string{"m2", "m3", "m4"}, []string{"a", "x"},
		r.rec("m1", "a", 1, 1), r.rec("m2", "x", 2, 1),
		r.rec("m3", "b", 3, 1), r.rec("m4", "c", 4, 1))
	if len(r.sqs.sent) != 0 {
		t.Fatalf("%d messages sent to the DLQ, want none while halted", len(r.sqs.sent))
	}
	st, _ := r.halts.Get(t.Context(), "j", "o", "o")
	if st == nil || st.MessageID != "m2" || st.DocID != "x" || st.Reason != "http_status" || st.HTTPStatus != 400 || st.Attempts != 1 || st.Seq != "2" {
		t.Fatalf("halt record %+v, want m2 (doc x, seq 2) halted for http_status 400", st)
	}
	// The halted change waits 30 s; the two held behind it go back at
	// once, behind it.
	if d := cmp.Diff([]int32{30, 0, 0}, r.sqs.visibility); d != "" {
		t.Errorf("visibility (-want +got):\n%s", d)
	}
	if !strings.Contains(r.emf.String(), `"OutputHalted":1`) {
		t.Errorf("no OutputHalted 1 in the metrics: %s", r.emf.String())
	}

	// A later change delivered while the halted one is in flight is held
	// back, not applied.
	failed, applied := r.handle(r.rec("m3", "b", 3, 2))
	if len(applied) != 0 || len(failed) != 1 {
		t.Errorf("while halted: applied %v, failed %v; want nothing applied, m3 failed", applied, failed)
	}
	if v := r.sqs.visibility[len(r.sqs.visibility)-1]; v != 10 {
		t.Errorf("a change handed out around the halted one is held %d s, want 10", v)
	}

	// The halted change again: still refused, the delay doubles.
	r.sqs.visibility = nil
	failed, _ = r.handle(r.rec("m2", "x", 2, 2), r.rec("m3", "b", 3, 3))
	if d := cmp.Diff([]string{"m2", "m3"}, failed); d != "" {
		t.Errorf("failed (-want +got):\n%s", d)
	}
	st, _ = r.halts.Get(t.Context(), "j", "o", "o")
	if st.Attempts != 2 || !st.Since.Equal(r.h.Now.Now()) {
		t.Errorf("halt record %+v, want 2 attempts since the first", st)
	}
	if d := cmp.Diff([]int32{60, 0}, r.sqs.visibility); d != "" {
		t.Errorf("visibility (-want +got):\n%s", d)
	}

	// Skipped: to the DLQ with its reason, then the rest in order.
	r.halts.request(t, "j", "o", "o", halt.Skip)
	failed, applied = r.handle(r.rec("m2", "x", 2, 3), r.rec("m3", "b", 3, 4), r.rec("m4", "c", 4, 2))
	if len(failed) != 0 {
		t.Errorf("failed %v after skip, want none", failed)
	}
	if d := cmp.Diff([]string{"b", "c"}, applied); d != "" {
		t.Errorf("applied after skip (-want +got):\n%s", d)
	}
	if len(r.sqs.sent) != 1 {
		t.Fatalf("%d messages sent to the DLQ, want the skipped one", len(r.sqs.sent))
	}
	got := failure.Parse(failure.SQSValues(r.sqs.sent[0].MessageAttributes))
	if got.Reason != "http_status" || got.HTTPStatus != 400 || got.DocID != "x" || !strings.Contains(got.Error, "skipped by the operator") {
		t.Errorf("DLQ failure record %+v", got)
	}
	if aws.ToString(r.sqs.sent[0].MessageGroupId) != "o" {
		t.Errorf("DLQ group %q, want o", aws.ToString(r.sqs.sent[0].MessageGroupId))
	}
	if st, _ := r.halts.Get(t.Context(), "j", "o", "o"); st != nil {
		t.Errorf("halt record %+v left after the skip", st)
	}
	if st := r.h.Stats()["j/o"]; st.DeadLettered != 1 || st.Delivered != 3 {
		t.Errorf("stats %+v, want 3 delivered (a, b, c), 1 dead-lettered", st)
	}
}

// Retried after a fix: the halted change and the rest are applied in order
// and the halt is cleared.
func TestHaltTotalRetry(t *testing.T) {
	t.Parallel()
	r := newHaltRun(t, "total")
	r.setFail("x", errRefused)
	r.handle(r.rec("m1", "x", 1, 1), r.rec("m2", "b", 2, 1))
	if st, _ := r.halts.Get(t.Context(), "j", "o", "o"); st == nil {
		t.Fatal("not halted")
	}
	r.setFail("x", nil)
	r.halts.request(t, "j", "o", "o", halt.Retry)
	failed, applied := r.handle(r.rec("m1", "x", 1, 2), r.rec("m2", "b", 2, 2))
	if len(failed) != 0 || len(r.sqs.sent) != 0 {
		t.Errorf("failed %v, %d to the DLQ; want everything delivered", failed, len(r.sqs.sent))
	}
	if d := cmp.Diff([]string{"x", "b"}, applied); d != "" {
		t.Errorf("applied (-want +got):\n%s", d)
	}
	if st, _ := r.halts.Get(t.Context(), "j", "o", "o"); st != nil {
		t.Errorf("halt record %+v left after delivery", st)
	}
	if !strings.Contains(r.emf.String(), `"OutputHalted":0`) {
		t.Errorf("no OutputHalted 0 in the metrics: %s", r.emf.String())
	}
}

// Transient failures are retried with backoff until max_receive_count; on
// that receive the output halts instead of dead-lettering. An unreadable
// halt state holds the batch back.
func TestHaltTransientAndStateErrors(t *testing.T) {
	t.Parallel()
	r := newHaltRun(t, "total")
	r.setFail("x", deliver.TransientError("http_status", errors.New("503")))
	failed, _ := r.handle(r.rec("m1", "x", 1, 2))
	if len(failed) != 1 {
		t.Fatalf("failed %v", failed)
	}
	if st, _ := r.halts.Get(t.Context(), "j", "o", "o"); st != nil {
		t.Fatalf("halted on receive 2 of 3: %+v", st)
	}
	if d := cmp.Diff([]int32{4}, r.sqs.visibility); d != "" {
		t.Errorf("backoff (-want +got):\n%s", d)
	}
	failed, _ = r.handle(r.rec("m1", "x", 1, 3))
	st, _ := r.halts.Get(t.Context(), "j", "o", "o")
	if len(failed) != 1 || st == nil || st.Class != "transient" || len(r.sqs.sent) != 0 {
		t.Fatalf("receive 3 of 3: failed %v, halt %+v, %d to the DLQ; want halted", failed, st, len(r.sqs.sent))
	}

	r2 := newHaltRun(t, "total")
	r2.halts.getErr = errors.New("dynamodb down")
	failed, applied := r2.handle(r2.rec("m1", "a", 1, 1))
	if len(failed) != 1 || len(applied) != 0 {
		t.Errorf("halt state unreadable: failed %v applied %v; want the message held back", failed, applied)
	}
}

// With per_document, a halt stops only the document's own group.
func TestHaltPerDocument(t *testing.T) {
	t.Parallel()
	r := newHaltRun(t, "per_document")
	r.setFail("x", errRefused)
	r.handleWant([]string{"m1", "m3"}, []string{"x", "b", "b"},
		r.rec("m1", "x", 1, 1), r.rec("m2", "b", 2, 1),
		r.rec("m3", "x", 3, 1), r.rec("m4", "b", 4, 1))
	if st, _ := r.halts.Get(t.Context(), "j", "o", "x"); st == nil || st.MessageID != "m1" {
		t.Errorf("halt of group x: %+v", st)
	}
	if st, _ := r.halts.Get(t.Context(), "j", "o", "b"); st != nil {
		t.Errorf("group b halted: %+v", st)
	}
}

// An operator's request that arrives while the halted change is being tried
// again is served on the next receive, a second later, not after the
// growing delay.
func TestHaltRequestDuringAttempt(t *testing.T) {
	t.Parallel()
	r := newHaltRun(t, "total")
	r.setFail("x", errRefused)
	r.handle(r.rec("m1", "x", 1, 1))
	r.sink.apply = func(c *change.Envelope) error {
		r.halts.mu.Lock()
		st := r.halts.states[halt.Key("j", "o", "o")]
		st.Action, st.ActionAt = halt.Skip, time.Now()
		r.halts.states[halt.Key("j", "o", "o")] = st
		r.halts.mu.Unlock()
		return errRefused
	}
	r.sqs.visibility = nil
	failed, _ := r.handle(r.rec("m1", "x", 1, 2))
	if len(failed) != 1 {
		t.Fatalf("failed %v", failed)
	}
	if d := cmp.Diff([]int32{1}, r.sqs.visibility); d != "" {
		t.Errorf("visibility after a request during the attempt (-want +got):\n%s", d)
	}
	// The next receive carries the skip out.
	failed, _ = r.handle(r.rec("m1", "x", 1, 3))
	if len(failed) != 0 || len(r.sqs.sent) != 1 {
		t.Errorf("failed %v, %d to the DLQ; want the change skipped", failed, len(r.sqs.sent))
	}
	// A request already seen does not shorten the delay again.
	r2 := newHaltRun(t, "total")
	r2.setFail("x", errRefused)
	r2.handle(r2.rec("m1", "x", 1, 1))
	r2.halts.request(t, "j", "o", "o", halt.Retry)
	r2.sqs.visibility = nil
	r2.handle(r2.rec("m1", "x", 1, 2))
	if d := cmp.Diff([]int32{60}, r2.sqs.visibility); d != "" {
		t.Errorf("visibility after a retry that failed (-want +got):\n%s", d)
	}
}

// An output that asks to slow down (429 with Retry-After) for a long time
// never takes a halting output's change to the DLQ: the change is not
// counted toward the halt, and the receives it spends while it waits stay
// well below the queue's redrive maxReceiveCount (1000). In either ordering
// it waits in flight at the head of its group, never sent back behind later
// changes (the writer pauses the output's intake instead, see
// TestIntakePausedAndProbed); where nothing pauses the intake it halts the
// output after config.MaxFIFOReceiveCount receives.
func TestHaltBackpressureNeverDeadLetters(t *testing.T) {
	t.Parallel()
	slow := &deliver.Error{Class: deliver.Transient, Reason: "http_status", HTTPStatus: 429, Backpressure: true, RetryAfter: 7 * time.Second, Err: errors.New("slow down")}
	tests := []struct {
		name       string
		ordering   string
		receives   int
		wantFailed []string
		wantResent bool // sent back to the work queue with a fresh receive count
		wantHalt   bool
	}{
		{name: "per_document early receive waits in flight", ordering: "per_document", receives: 1, wantFailed: []string{"m1", "m2"}},
		{name: "per_document before the last receive waits in flight", ordering: "per_document", receives: 2, wantFailed: []string{"m1", "m2"}},
		{name: "per_document waits in flight past its last receive", ordering: "per_document", receives: 3, wantFailed: []string{"m1", "m2"}},
		{name: "total waits in flight past max_receive_count", ordering: "total", receives: 3, wantFailed: []string{"m1", "m2"}},
		{name: "total halts well before the redrive limit", ordering: "total", receives: config.MaxFIFOReceiveCount, wantFailed: []string{"m1", "m2"}, wantHalt: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newHaltRun(t, tt.ordering)
			r.setFail("x", slow)
			// m2 is of another document: under per_document it is applied
			// beside x but held here by its own (x-less) group; keep it in
			// x's group so that it waits behind x in both orderings.
			m2 := r.rec("m2", "b", 2, 1)
			m2.Attributes["MessageGroupId"] = r.rec("m1", "x", 1, 1).Attributes["MessageGroupId"]
			failed, _ := r.handle(r.rec("m1", "x", 1, tt.receives), m2)
			if d := cmp.Diff(tt.wantFailed, failed); d != "" {
				t.Errorf("failed (-want +got):\n%s", d)
			}
			var resent, dead int
			for _, in := range r.sqs.sent {
				if strings.Contains(aws.ToString(in.QueueUrl), "-dlq") {
					dead++
					continue
				}
				resent++
				if got := aws.ToString(in.MessageAttributes[AttrDeferrals].StringValue); got != "1" {
					t.Errorf("resent with %s=%q, want 1", AttrDeferrals, got)
				}
			}
			if dead != 0 {
				t.Errorf("%d messages sent to the DLQ, want none", dead)
			}
			if got := resent == 1; got != tt.wantResent {
				t.Errorf("resent %d messages, want resent: %v", resent, tt.wantResent)
			}
			st, _ := r.halts.Get(t.Context(), "j", "o", m2.Attributes["MessageGroupId"])
			if got := st != nil; got != tt.wantHalt {
				t.Fatalf("halt record %+v, want halted: %v", st, tt.wantHalt)
			}
			if tt.wantHalt {
				// m2 waits behind it, held as long as the output asked.
				if d := cmp.Diff([]int32{int32(haltFirstDelay.Seconds()), 7}, r.sqs.visibility); d != "" {
					t.Errorf("visibility (-want +got):\n%s", d)
				}
				return
			}
			if !tt.wantResent && (len(r.sqs.visibility) == 0 || r.sqs.visibility[0] < 7) {
				t.Errorf("visibility %v, want the change held at least the 7 s the output asked for", r.sqs.visibility)
			}
		})
	}
}

// A halt whose clear fails after the change was delivered stays visible:
// the change is kept in the queue (so that nothing else of its group passes
// a record that still names it), OutputHalted stays 1, and the next receive
// applies it again (a no-op for a monotonic output) and clears the record.
func TestHaltClearFailureKeepsTheHalt(t *testing.T) {
	t.Parallel()
	r := newHaltRun(t, "total")
	r.setFail("x", errRefused)
	r.handle(r.rec("m1", "x", 1, 1), r.rec("m2", "b", 2, 1))
	r.setFail("x", nil)
	r.halts.request(t, "j", "o", "o", halt.Retry)
	r.halts.clearErr = errors.New("throttled")
	r.emf.Reset()

	r.handleWant([]string{"m1", "m2"}, []string{"x"}, r.rec("m1", "x", 1, 2), r.rec("m2", "b", 2, 2))
	if st, _ := r.halts.Get(t.Context(), "j", "o", "o"); st == nil || st.MessageID != "m1" {
		t.Fatalf("halt record %+v, want it kept on m1 while it cannot be cleared", st)
	}
	if r.halts.clears < 2 {
		t.Errorf("%d clear attempts, want the clear retried", r.halts.clears)
	}
	if got := r.emf.String(); strings.Contains(got, `"OutputHalted":0`) || !strings.Contains(got, `"OutputHalted":1`) {
		t.Errorf("metrics %s: want OutputHalted 1 (the record stands), never 0", got)
	}

	r.halts.clearErr = nil
	r.emf.Reset()
	r.handleWant(nil, []string{"x", "b"}, r.rec("m1", "x", 1, 3), r.rec("m2", "b", 2, 3))
	if st, _ := r.halts.Get(t.Context(), "j", "o", "o"); st != nil {
		t.Errorf("halt record %+v left after delivery", st)
	}
	if got := r.emf.String(); !strings.Contains(got, `"OutputHalted":0`) {
		t.Errorf("metrics %s: want OutputHalted 0 once cleared", got)
	}
	if len(r.sqs.sent) != 0 {
		t.Errorf("%d messages sent, want none", len(r.sqs.sent))
	}
}

// With ordering total (and on_failure dlq), backpressure never sends a change
// back behind later ones: it waits in flight, on its last receive too, and
// never goes to the DLQ for it.
func TestTotalBackpressureNeverResends(t *testing.T) {
	t.Parallel()
	f, err := config.Parse([]byte(`{"jobs":[{"id":"j","source":{"type":"couchdb","url":"http://h/db"},
		"outputs":[{"id":"o","type":"http","ordering":"total","max_receive_count":3,"http":{"url":"http://x/{doc_id}"}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	sink := &fakeSink{apply: func(c *change.Envelope) error {
		return &deliver.Error{Class: deliver.Transient, Reason: "http_status", HTTPStatus: 429, Backpressure: true, RetryAfter: 5 * time.Second, Err: errors.New("slow down")}
	}}
	q := &fakeSQS{}
	h := newHandler(f, sink, q)
	rec := func(receives int) events.SQSMessage {
		m := record(t, f, "m1", "a", "1-a", 1, receives)
		m.Attributes["MessageGroupId"] = "o"
		return m
	}
	resp, err := h.Handle(t.Context(), events.SQSEvent{Records: []events.SQSMessage{rec(2)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BatchItemFailures) != 1 || len(q.sent) != 0 || len(q.visibility) != 1 {
		t.Fatalf("receive 2 of 3: failures %v, %d sent, visibility %v; want the change held in flight, nothing sent", resp.BatchItemFailures, len(q.sent), q.visibility)
	}
	resp, err = h.Handle(t.Context(), events.SQSEvent{Records: []events.SQSMessage{rec(3)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BatchItemFailures) != 1 || len(q.sent) != 0 || len(q.visibility) != 2 {
		t.Fatalf("receive 3 of 3: failures %v, %d sent, visibility %v; want the change held in flight, not in the DLQ nor back in the work queue", resp.BatchItemFailures, len(q.sent), q.visibility)
	}
}

func TestHaltDelay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		n    int
		want time.Duration
	}{{1, 30 * time.Second}, {2, time.Minute}, {3, 2 * time.Minute}, {8, time.Hour}, {900, time.Hour}}
	total := time.Duration(0)
	for _, tt := range tests {
		if got := haltDelay(tt.n); got != tt.want {
			t.Errorf("haltDelay(%d) = %s, want %s", tt.n, got, tt.want)
		}
	}
	// The halted change's receives must outlast SQS's retention within the
	// redrive policy's 1000 receives.
	for n := 1; n <= 1000-config.MaxFIFOReceiveCount; n++ {
		total += haltDelay(n)
	}
	if total < 14*24*time.Hour {
		t.Errorf("%d halted receives last %s, less than the 14 days SQS keeps a message", 1000-config.MaxFIFOReceiveCount, total)
	}
}

// Against DynamoDB Local: OutputHalted follows the output's halt records,
// whichever writer instance finds them changed. A fresh instance (nothing
// in memory) that finds the output no longer halted after changesctl halt
// clear reports 0; a change delivered while another group of the output is
// still halted reports 1, not 0; an instance that finds no halt at all
// reports nothing.
func TestOutputHaltedFollowsTheRecords(t *testing.T) {
	t.Parallel()
	metric := func(r *haltRun) string {
		got := r.emf.String()
		switch {
		case strings.Contains(got, `"OutputHalted":0`) && strings.Contains(got, `"OutputHalted":1`):
			return "0 and 1"
		case strings.Contains(got, `"OutputHalted":0`):
			return "0"
		case strings.Contains(got, `"OutputHalted":1`):
			return "1"
		}
		return "none"
	}
	instance := func(t *testing.T, store *halt.Store, ordering string) *haltRun {
		r := newHaltRun(t, ordering)
		r.h.Halts = store
		return r
	}
	t.Run("total, cleared by the operator", func(t *testing.T) {
		t.Parallel()
		db, table := testenv.StateTable(t)
		store := &halt.Store{DB: db, Table: table}
		seer := instance(t, store, "total")
		seer.setFail("x", errRefused)
		seer.handle(seer.rec("m1", "x", 1, 1))
		if got := metric(seer); got != "1" {
			t.Fatalf("OutputHalted %s from the instance that halted, want 1", got)
		}
		// changesctl halt clear: the change is no longer in the queue.
		if err := store.Clear(t.Context(), "j", "o", "o", "m1"); err != nil {
			t.Fatal(err)
		}
		fresh := instance(t, store, "total")
		if failed, applied := fresh.handle(fresh.rec("m2", "b", 2, 1)); len(failed) != 0 || len(applied) != 1 {
			t.Fatalf("after the clear: failed %v, applied %v", failed, applied)
		}
		if got := metric(fresh); got != "0" {
			t.Errorf("OutputHalted %s from a fresh instance after the halt was cleared, want 0", got)
		}
		quiet := instance(t, store, "total")
		quiet.handle(quiet.rec("m3", "c", 3, 1))
		if got := metric(quiet); got != "none" {
			t.Errorf("OutputHalted %s from an instance that found no halt, want none", got)
		}
	})
	t.Run("per_document, one group of two delivered", func(t *testing.T) {
		t.Parallel()
		db, table := testenv.StateTable(t)
		store := &halt.Store{DB: db, Table: table}
		seer := instance(t, store, "per_document")
		seer.setFail("x", errRefused)
		seer.setFail("y", errRefused)
		seer.handle(seer.rec("m1", "x", 1, 1), seer.rec("m2", "y", 2, 1))
		if got := metric(seer); got != "1" {
			t.Fatalf("OutputHalted %s from the instance that halted, want 1", got)
		}
		fresh := instance(t, store, "per_document")
		if failed, _ := fresh.handle(fresh.rec("m1", "x", 1, 2)); len(failed) != 0 {
			t.Fatalf("x again: failed %v", failed)
		}
		if got := metric(fresh); got != "1" {
			t.Errorf("OutputHalted %s after x was delivered while y stays halted, want 1", got)
		}
		fresh.emf.Reset()
		if failed, _ := fresh.handle(fresh.rec("m2", "y", 2, 2)); len(failed) != 0 {
			t.Fatalf("y again: failed %v", failed)
		}
		if got := metric(fresh); got != "0" {
			t.Errorf("OutputHalted %s after the last halted group was delivered, want 0", got)
		}
	})
}

// TestHaltRecordDocIDs: with stack.doc_ids hash, the halt record of a
// per_document output is keyed by the hash of the document's group and
// holds neither its id (the hash instead), nor its body, nor the id in its
// error; the writer finds the record again on the next receive.
func TestHaltRecordDocIDs(t *testing.T) {
	t.Parallel()
	const id = "customer-alice-4711"
	r := newHaltRun(t, "per_document")
	r.f.Stack.DocIDs = config.DocIDsHash
	r.setFail(id, &deliver.Error{Class: deliver.Permanent, Reason: "http_status", HTTPStatus: 400, Err: fmt.Errorf("send change %s: bad request", id)})
	r.handleWant([]string{"m1"}, []string{id}, r.rec("m1", id, 1, 1))
	if st, _ := r.halts.Get(t.Context(), "j", "o", id); st != nil {
		t.Errorf("a halt record is keyed by the id itself: %+v", st)
	}
	st, _ := r.halts.Get(t.Context(), "j", "o", docid.Hash(id))
	if st == nil {
		t.Fatalf("no halt record under the id's hash %s", docid.Hash(id))
	}
	for field, v := range map[string]string{"doc_id": st.DocID, "group": st.Group, "error": st.Error, "body": st.Body} {
		if strings.Contains(v, id) {
			t.Errorf("halt record's %s holds the id: %q", field, v)
		}
	}
	if st.DocID != docid.Hash(id) || st.Body != "" {
		t.Errorf("halt record: doc_id %q, body %d bytes; want the hash and no body", st.DocID, len(st.Body))
	}
	// The next receive finds the halt: the change is tried again, not a
	// second record made.
	r.handleWant([]string{"m1"}, []string{id}, r.rec("m1", id, 1, 2))
	if st, _ := r.halts.Get(t.Context(), "j", "o", docid.Hash(id)); st == nil || st.Attempts < 1 {
		t.Errorf("halt record after the next receive: %+v", st)
	}
}
