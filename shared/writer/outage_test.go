package writer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/statetable/outage"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// fakeOutages is the outage record of one output, kept as outage.Store
// keeps it (its intake's states and conditions included).
type fakeOutages struct {
	mu       sync.Mutex
	marks    []outage.State
	cleared  int  // Clear calls
	standing bool // a record is there: marked or paused, not deleted since
	rec      outage.State
	getErr   error
}

func (f *fakeOutages) Mark(ctx context.Context, st outage.State) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.marks = append(f.marks, st)
	f.touch(st)
	f.rec.Held += st.Held
	return nil
}

// touch sets what a mark or a pause sets of the record. The caller holds mu.
func (f *fakeOutages) touch(st outage.State) {
	if !f.standing {
		f.rec = outage.State{Job: st.Job, Output: st.Output, Since: st.Since}
	}
	f.standing = true
	f.rec.LastAt, f.rec.LastError = st.LastAt, st.LastError
}

func (f *fakeOutages) Clear(ctx context.Context, job, output string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleared++
	if f.standing && f.rec.Intake != "" {
		return false, nil
	}
	was := f.standing
	f.standing = false
	return was, nil
}

func (f *fakeOutages) Get(ctx context.Context, job, output string) (*outage.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.getErr != nil {
		return nil, f.getErr
	}
	if !f.standing {
		return nil, nil
	}
	st := f.rec
	return &st, nil
}

func (f *fakeOutages) Pause(ctx context.Context, st outage.State) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.standing && f.rec.Intake == outage.IntakePaused {
		return false, nil
	}
	f.touch(st)
	f.rec.Intake, f.rec.PausedAt, f.rec.ProbeMessageID, f.rec.ProbeBody, f.rec.ProbeUntil = outage.IntakePaused, st.LastAt, st.ProbeMessageID, st.ProbeBody, time.Time{}
	return true, nil
}

func (f *fakeOutages) ClaimProbe(ctx context.Context, job, output string, now, until time.Time) (*outage.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.standing || f.rec.Intake != outage.IntakePaused || (!f.rec.ProbeUntil.IsZero() && !f.rec.ProbeUntil.Before(now)) {
		return nil, nil
	}
	f.rec.ProbeUntil = until
	st := f.rec
	return &st, nil
}

func (f *fakeOutages) ProbeFailed(ctx context.Context, st outage.State, until time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.standing && f.rec.ProbeUntil.Equal(until) {
		f.rec.LastAt, f.rec.LastError, f.rec.ProbeUntil = st.LastAt, st.LastError, time.Time{}
	}
	return nil
}

func (f *fakeOutages) Resuming(ctx context.Context, job, output string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.standing && f.rec.Intake == outage.IntakePaused {
		f.rec.Intake, f.rec.ProbeUntil = outage.IntakeResuming, time.Time{}
	}
	return nil
}

func (f *fakeOutages) Resumed(ctx context.Context, job, output string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.standing || f.rec.Intake != outage.IntakeResuming {
		return false, nil
	}
	f.standing = false
	return true, nil
}

// state returns a copy of the record, nil when there is none.
func (f *fakeOutages) state() *outage.State {
	st, _ := f.Get(context.Background(), "", "")
	return st
}

type fakeSecrets struct{ refreshed int }

func (f *fakeSecrets) Refresh() { f.refreshed++ }

var errRefusedConn = deliver.TransientError("connection", errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"))

// outageRun is a handler of one output whose sink answers with down while
// it is set, and counts its opens.
type outageRun struct {
	t       *testing.T
	f       *config.File
	h       *Handler
	sqs     *fakeSQS
	outages *fakeOutages
	secrets *fakeSecrets
	clock   *clock.Manual
	emf     *bytes.Buffer
	mu      sync.Mutex
	down    error // every change fails with it while set
	openErr error // the sink cannot be opened while set
	opens   int
	applied []string
	sink    *fakeSink
}

func newOutageRun(t *testing.T, ordering string) *outageRun {
	t.Helper()
	f, err := config.Parse([]byte(fmt.Sprintf(`{"jobs":[{"id":"j","source":{"type":"couchdb","url":"http://h/db"},
		"outputs":[{"id":"o","type":"http","ordering":%q,"max_receive_count":3,"outage":{"retry":"2s","max_retry":"8s"},"http":{"url":"http://x/{doc_id}"}}]}]}`, ordering)))
	if err != nil {
		t.Fatal(err)
	}
	r := &outageRun{t: t, f: f, sqs: &fakeSQS{}, outages: &fakeOutages{}, secrets: &fakeSecrets{}, emf: &bytes.Buffer{},
		clock: clock.NewManual(time.Date(2026, 11, 26, 8, 0, 0, 0, time.UTC))}
	sink := &fakeSink{apply: func(c *change.Envelope) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.down != nil {
			return r.down
		}
		r.applied = append(r.applied, c.DocID)
		return nil
	}}
	r.sink = sink
	r.h = newHandler(f, sink, r.sqs)
	r.h.Sinks = func(context.Context, config.Route) (deliver.Sink, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.opens++
		if r.openErr != nil {
			return nil, r.openErr
		}
		return sink, nil
	}
	r.h.Outages, r.h.Secrets, r.h.Metrics, r.h.Now = r.outages, r.secrets, r.emf, r.clock.Now
	return r
}

func (r *outageRun) set(down, openErr error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down, r.openErr = down, openErr
}

// handle runs one batch of messages m1..mn (documents d1..dn) on their
// receives-th receive and returns the ids reported failed.
func (r *outageRun) handle(receives int, docs ...string) []string {
	r.t.Helper()
	var recs []events.SQSMessage
	for i, d := range docs {
		recs = append(recs, record(r.t, r.f, fmt.Sprintf("m%d", i+1), d, "1-"+d, int64(i+1), receives))
	}
	return r.handleRecords(recs...)
}

func (r *outageRun) handleRecords(recs ...events.SQSMessage) []string {
	r.t.Helper()
	resp, err := r.h.Handle(r.t.Context(), events.SQSEvent{Records: recs})
	if err != nil {
		r.t.Fatal(err)
	}
	var failed []string
	for _, f := range resp.BatchItemFailures {
		failed = append(failed, f.ItemIdentifier)
	}
	return failed
}

func (r *outageRun) dead() int {
	n := 0
	for _, in := range r.sqs.sent {
		if strings.Contains(aws.ToString(in.QueueUrl), "-dlq") {
			n++
		}
	}
	return n
}

// An output that refuses connections for longer than the messages' receives
// would last: nothing is dead-lettered whatever the receive count, each
// message goes back with a fresh receive count before its last receive, the
// output is tried again after the retry wait (not before), doubling to
// max_retry, its sink opened again and the secrets read again; the outage
// is recorded and reported, and ends with the first delivery.
func TestOutputDownHoldsTheBatch(t *testing.T) {
	t.Parallel()
	r := newOutageRun(t, "none")
	r.set(errRefusedConn, nil)

	// First receive: held in flight for the first retry wait (2 s plus
	// jitter, whole seconds).
	failed := r.handle(1, "a", "b")
	if d := cmp.Diff([]string{"m1", "m2"}, failed); d != "" {
		t.Errorf("failed (-want +got):\n%s", d)
	}
	for _, v := range r.sqs.visibility {
		if v < 2 || v > 3 {
			t.Errorf("held %d s, want the retry wait of 2 s (with jitter)", v)
		}
	}
	if r.secrets.refreshed != 1 || len(r.outages.marks) != 1 || r.outages.marks[0].Held != 2 ||
		!strings.Contains(r.outages.marks[0].LastError, "connection refused") {
		t.Errorf("refreshed %d, marks %+v: want the secrets read again and the outage recorded with 2 held", r.secrets.refreshed, r.outages.marks)
	}

	// Within the wait: not tried, not opened again, held.
	opens := r.opens
	r.clock.Advance(time.Second)
	r.handle(2, "a", "b")
	if r.opens != opens {
		t.Errorf("opened %d times within the retry wait, want none", r.opens-opens)
	}

	// The last receive: sent back with a fresh receive count, never to the
	// DLQ; the next wait has doubled.
	r.clock.Advance(2 * time.Second)
	r.sqs.visibility, r.sqs.sent = nil, nil
	failed = r.handle(3, "a", "b")
	if len(failed) != 0 || r.dead() != 0 || len(r.sqs.sent) != 2 {
		t.Fatalf("last receive: failed %v, %d to the DLQ, %d sent; want both sent back, none dead-lettered", failed, r.dead(), len(r.sqs.sent))
	}
	for _, in := range r.sqs.sent {
		if in.DelaySeconds < 4 || in.DelaySeconds > 5 {
			t.Errorf("sent back with a delay of %d s, want the doubled wait of 4 s", in.DelaySeconds)
		}
	}
	if r.opens != opens+1 || r.secrets.refreshed != 2 {
		t.Errorf("opens %d, refreshed %d: want the sink opened again and the secrets read again on the try", r.opens-opens, r.secrets.refreshed)
	}
	if st := r.h.Stats()["j/o"]; st.DeadLettered != 0 || st.Held != 6 {
		t.Errorf("stats %+v, want 6 held, none dead-lettered", st)
	}

	// Back: delivered, the outage ends.
	r.set(nil, nil)
	r.clock.Advance(5 * time.Second)
	r.emf.Reset()
	if failed := r.handle(1, "a", "b"); len(failed) != 0 {
		t.Errorf("failed %v after recovery", failed)
	}
	if d := cmp.Diff([]string{"a", "b"}, r.applied); d != "" {
		t.Errorf("applied (-want +got):\n%s", d)
	}
	if r.outages.cleared != 1 || !strings.Contains(r.emf.String(), `"OutputDown":0`) {
		t.Errorf("cleared %d, metrics %s: want the outage cleared and OutputDown 0", r.outages.cleared, r.emf.String())
	}
}

// A batch held on a standard queue is held ten messages to a request: 25
// messages extend their visibility in three requests, and on their last
// receive go back to the queue in three; a message SQS did not take back is
// reported failed, to be received again, and the others handled.
func TestHeldBatchIsHeldTenToARequest(t *testing.T) {
	t.Parallel()
	r := newOutageRun(t, "none")
	r.set(errRefusedConn, nil)
	docs := make([]string, 25)
	for i := range docs {
		docs[i] = fmt.Sprintf("d%02d", i)
	}
	if failed := r.handle(1, docs...); len(failed) != 25 || len(r.sqs.visibility) != 25 {
		t.Fatalf("first receive: %d failed, %d visibility changes; want all 25 held in flight", len(failed), len(r.sqs.visibility))
	}
	if d := cmp.Diff([]int{5, 10, 10}, sorted(r.sqs.batches)); d != "" {
		t.Errorf("visibility requests (-want +got):\n%s", d)
	}

	r.sqs.batches, r.sqs.failEntries = nil, map[string]bool{"3": true}
	r.clock.Advance(5 * time.Second)
	failed := r.handle(3, docs...)
	if d := cmp.Diff([]int{5, 10, 10}, sorted(r.sqs.batches)); d != "" {
		t.Errorf("send-back requests (-want +got):\n%s", d)
	}
	if len(failed) != 3 || len(r.sqs.sent) != 22 || r.dead() != 0 {
		t.Errorf("last receive: %d failed, %d sent back, %d dead-lettered; want the 3 SQS failed to be received again and 22 sent back", len(failed), len(r.sqs.sent), r.dead())
	}
}

// sorted returns a sorted copy of s.
func sorted(s []int) []int { return slices.Sorted(slices.Values(s)) }

// An output that cannot be opened (a secret not set or unparsable) is down:
// its messages are held, and it is opened again, with the secrets read
// again, on each try.
func TestOutputOpenFailureHolds(t *testing.T) {
	t.Parallel()
	r := newOutageRun(t, "per_document")
	r.set(nil, errors.New("parse postgres dsn: malformed connection string"))
	for i, receives := range []int{1, 2, 3} {
		r.clock.Advance(10 * time.Second)
		r.handle(receives, "a")
		if r.opens != i+1 || r.secrets.refreshed != i+1 {
			t.Fatalf("try %d: opens %d, refreshed %d", i+1, r.opens, r.secrets.refreshed)
		}
	}
	if r.dead() != 0 {
		t.Errorf("%d dead-lettered, want none while the output cannot be opened", r.dead())
	}
	r.set(nil, nil)
	r.clock.Advance(10 * time.Second)
	if failed := r.handle(1, "a"); len(failed) != 0 || len(r.applied) != 1 {
		t.Errorf("after the secret was fixed: failed %v, applied %v", failed, r.applied)
	}
}

// The decision is the batch's: a change that fails while the output takes
// others, or fails in a way that is the change's own, still counts toward
// the DLQ; so does a change queued longer than max_hold ago.
func TestDocumentFailureStillDeadLetters(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		fail     map[string]error // doc -> answer; others are applied
		docs     []string
		maxHold  bool // the changes were queued longer ago than max_hold
		wantDead int
	}{
		{name: "connection reset while another change passes", fail: map[string]error{"a": errRefusedConn}, docs: []string{"a", "b"}, wantDead: 1},
		{name: "500 from every request", fail: map[string]error{"a": &deliver.Error{Class: deliver.Transient, Reason: "http_status", HTTPStatus: 500, Err: errors.New("500")}}, docs: []string{"a"}, wantDead: 1},
		{name: "permanent 422", fail: map[string]error{"a": &deliver.Error{Class: deliver.Permanent, Reason: "http_status", HTTPStatus: 422, Err: errors.New("422")}}, docs: []string{"a"}, wantDead: 1},
		{name: "502 from every request is the output", fail: map[string]error{"a": &deliver.Error{Class: deliver.Transient, Reason: "http_status", HTTPStatus: 502, Err: errors.New("502")}}, docs: []string{"a"}},
		{name: "401 is the output", fail: map[string]error{"a": &deliver.Error{Class: deliver.Permanent, Reason: "http_status", HTTPStatus: 401, Err: errors.New("401")}}, docs: []string{"a"}},
		{name: "down past max_hold", fail: map[string]error{"a": errRefusedConn}, docs: []string{"a"}, maxHold: true, wantDead: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newOutageRun(t, "none")
			r.h.Sinks = func(context.Context, config.Route) (deliver.Sink, error) {
				return &fakeSink{apply: func(c *change.Envelope) error { return tt.fail[c.DocID] }}, nil
			}
			var recs []events.SQSMessage
			for i, d := range tt.docs {
				m := record(t, r.f, fmt.Sprintf("m%d", i+1), d, "1-"+d, int64(i+1), 3)
				if tt.maxHold {
					r.f.Jobs[0].Outputs[0].Outage.MaxHold = config.Duration(time.Hour)
					m.Body = enqueuedAt(t, m.Body, r.clock.Now().Add(-2*time.Hour))
				}
				recs = append(recs, m)
			}
			r.handleRecords(recs...)
			if got := r.dead(); got != tt.wantDead {
				t.Errorf("%d dead-lettered, want %d", got, tt.wantDead)
			}
		})
	}
}

// enqueuedAt returns the envelope body with its enqueued-at time set to at.
func enqueuedAt(t *testing.T, body string, at time.Time) string {
	t.Helper()
	var e change.Envelope
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatal(err)
	}
	e.EnqueuedAt = at
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// outputFailure names the failures that are the output's, not a change's.
func TestOutputFailure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  *deliver.Error
		want bool
	}{
		{errRefusedConn, true},
		{deliver.TransientError(reasonUnavailable, errors.New("secret not set")), true},
		{&deliver.Error{Class: deliver.Transient, Reason: "http_status", HTTPStatus: 503}, true},
		{&deliver.Error{Class: deliver.Transient, Reason: "http_status", HTTPStatus: 504}, true},
		{&deliver.Error{Class: deliver.Transient, Reason: "http_status", HTTPStatus: 500}, false},
		{&deliver.Error{Class: deliver.Transient, Reason: "http_status", HTTPStatus: 429}, false},
		{&deliver.Error{Class: deliver.Permanent, Reason: "http_status", HTTPStatus: 403}, true},
		{&deliver.Error{Class: deliver.Transient, Reason: "s3_status", HTTPStatus: 500}, true},
		{&deliver.Error{Class: deliver.Permanent, Reason: "s3_status", HTTPStatus: 404}, false},
		{&deliver.Error{Class: deliver.Transient, Reason: "sql_error", SQLState: "08006"}, true},
		{&deliver.Error{Class: deliver.Transient, Reason: "sql_error", SQLState: "57P01"}, true},
		{&deliver.Error{Class: deliver.Permanent, Reason: "sql_error", SQLState: "28P01"}, true},
		{&deliver.Error{Class: deliver.Transient, Reason: "sql_error", SQLState: "40001"}, false},
		{&deliver.Error{Class: deliver.Permanent, Reason: "sql_error", SQLState: "23505"}, false},
		{deliver.TransientError("timeout", errors.New("deadline")), false},
		{deliver.PermanentError("invalid_body", errors.New("not JSON")), false},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			t.Parallel()
			if got := outputFailure(tt.err); got != tt.want {
				t.Errorf("outputFailure(%s) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

// On a halting output an outage does not halt: in either ordering the held
// change waits in flight at the head of its group (a resend would pass later
// changes), and where nothing pauses the output's intake it halts only on
// receive config.MaxFIFOReceiveCount, far from SQS's 1000.
func TestOutageOnHaltingOutput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ordering string
		receives int
		wantHalt bool
	}{
		{ordering: "per_document", receives: 3},
		{ordering: "total", receives: 3},
		{ordering: "total", receives: config.MaxFIFOReceiveCount, wantHalt: true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s receive %d", tt.ordering, tt.receives), func(t *testing.T) {
			t.Parallel()
			r := newHaltRun(t, tt.ordering)
			r.setFail("x", errRefusedConn)
			r.handle(r.rec("m1", "x", 1, tt.receives))
			group := r.rec("m1", "x", 1, 1).Attributes["MessageGroupId"]
			st, _ := r.halts.Get(t.Context(), "j", "o", group)
			if got := st != nil; got != tt.wantHalt {
				t.Errorf("halt %+v, want halted: %v", st, tt.wantHalt)
			}
			for _, in := range r.sqs.sent {
				t.Errorf("sent to %s, want the change kept in flight", aws.ToString(in.QueueUrl))
			}
		})
	}
}

// Against DynamoDB Local: an outage seen by one writer instance that is
// gone before the output is back (Lambda reclaimed it) ends for the alarm
// too. A fresh instance, with nothing of the outage in memory, that
// delivers to the output finds the outage record, deletes it and reports
// OutputDown 0; a fresh instance that finds no record reports nothing, so
// that an output never down publishes no OutputDown at all.
func TestOutputDownClearedByAFreshInstance(t *testing.T) {
	t.Parallel()
	db, table := testenv.StateTable(t)
	store := &outage.Store{DB: db, Table: table}
	seer := newOutageRun(t, "none")
	seer.h.Outages = store
	seer.set(errRefusedConn, nil)
	seer.handle(1, "a")
	if !strings.Contains(seer.emf.String(), `"OutputDown":1`) {
		t.Fatalf("metrics %s: want OutputDown 1 from the instance that saw the outage", seer.emf.String())
	}
	if st, err := store.Get(t.Context(), "j", "o"); err != nil || st == nil {
		t.Fatalf("outage record after the outage began: %+v, %v", st, err)
	}

	// The seer is gone; the output is back; a fresh instance delivers.
	fresh := newOutageRun(t, "none")
	fresh.h.Outages = store
	if failed := fresh.handle(1, "b"); len(failed) != 0 {
		t.Fatalf("failed %v", failed)
	}
	if got := fresh.emf.String(); !strings.Contains(got, `"OutputDown":0`) {
		t.Errorf("metrics of the fresh instance %s: want OutputDown 0", got)
	}
	if st, err := store.Get(t.Context(), "j", "o"); err != nil || st != nil {
		t.Errorf("outage record after a delivery: %+v, %v; want none", st, err)
	}

	// Another fresh instance: no record, nothing to report.
	quiet := newOutageRun(t, "none")
	quiet.h.Outages = store
	quiet.handle(1, "c")
	if got := quiet.emf.String(); strings.Contains(got, `"OutputDown"`) {
		t.Errorf("metrics %s: want no OutputDown from an instance that found no outage", got)
	}
}
