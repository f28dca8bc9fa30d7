package writer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	lambdatypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/statetable/outage"
)

var (
	err503 = &deliver.Error{Class: deliver.Transient, Reason: "http_status", HTTPStatus: 503, Err: errors.New("503 Service Unavailable")}
	err429 = &deliver.Error{Class: deliver.Transient, Reason: "http_status", HTTPStatus: 429, Backpressure: true, RetryAfter: 7 * time.Second, Err: errors.New("429 Too Many Requests")}
)

// On a FIFO output a held change keeps its place at the head of its group
// whatever its receive count, for an output that is down or asks to slow
// down: it is never sent back to the queue (where it would go behind m2, the
// newer change of its document, and a receiver that applies requests as
// they come would end at the older one) and never to the DLQ.
func TestHeldChangeKeepsItsPlaceInItsGroup(t *testing.T) {
	t.Parallel()
	for _, ordering := range []string{"per_document", "total"} {
		for _, cause := range []*deliver.Error{err503, err429} {
			t.Run(fmt.Sprintf("%s %d", ordering, cause.HTTPStatus), func(t *testing.T) {
				t.Parallel()
				r := newOutageRun(t, ordering)
				r.set(cause, nil)
				m1 := record(t, r.f, "m1", "a", "1-a", 1, 3) // its last receive
				m2 := record(t, r.f, "m2", "a", "2-a", 2, 1)
				if ordering == "total" {
					m1.Attributes["MessageGroupId"], m2.Attributes["MessageGroupId"] = "o", "o"
				}
				failed := r.handleRecords(m1, m2)
				if d := cmp.Diff([]string{"m1", "m2"}, failed); d != "" {
					t.Errorf("failed (-want +got):\n%s", d)
				}
				for _, in := range r.sqs.sent {
					where := "back to the work queue, behind m2"
					if strings.Contains(aws.ToString(in.QueueUrl), "-dlq") {
						where = "to the DLQ"
					}
					t.Errorf("%s sent %s", aws.ToString(in.MessageDeduplicationId), where)
				}
				// The held messages come back together, the later ones
				// never after the first: their visibility is set last to
				// first, to one delay.
				if d := cmp.Diff([]string{"rh-m2", "rh-m1"}, r.sqs.handles); d != "" {
					t.Errorf("visibility changes (-want +got):\n%s", d)
				}
				if len(r.sqs.visibility) == 2 && r.sqs.visibility[0] != r.sqs.visibility[1] {
					t.Errorf("visibility %v, want one delay for the group", r.sqs.visibility)
				}
			})
		}
	}
}

// fakeIntake records the pauses and resumes of one output's intake.
type fakeIntake struct {
	mu      sync.Mutex
	paused  bool
	pauses  int
	resumes int
	err     error
}

func (f *fakeIntake) Pause(ctx context.Context, r config.Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pauses++
	if f.err != nil {
		return f.err
	}
	f.paused = true
	return nil
}

func (f *fakeIntake) Resume(ctx context.Context, r config.Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resumes++
	if f.err != nil {
		return f.err
	}
	f.paused = false
	return nil
}

// newIntakeRun is an outage run whose handler pauses the output's intake.
func newIntakeRun(t *testing.T, ordering string) (*outageRun, *fakeIntake) {
	t.Helper()
	r := newOutageRun(t, ordering)
	in := &fakeIntake{}
	r.h.Intake = in
	return r, in
}

// The intake of a FIFO output that is down pauses once a held change is on
// the receive before its last: the outage record says so, with that change
// as the probe's. Until the probe finds the output back, nothing is given
// to the output, even a batch received before the intake stopped and the
// output answering again; every change waits in flight. The probe tries
// the output with the record's change only: while it fails the intake stays
// paused and OutputDown stays 1; once it passes, the intake runs again, the
// record is deleted, OutputDown goes to 0, and the held changes are
// delivered in their order.
func TestIntakePausedAndProbed(t *testing.T) {
	t.Parallel()
	r, in := newIntakeRun(t, "per_document")
	r.set(err503, nil)

	// Receive 1 of 3: held in flight, the intake runs.
	if failed := r.handle(1, "a"); len(failed) != 1 || in.pauses != 0 {
		t.Fatalf("first receive: failed %v, %d pauses; want held in flight, intake running", failed, in.pauses)
	}
	// Receive 2 of 3, with a newer change of its document behind it.
	r.clock.Advance(10 * time.Second)
	m1 := record(t, r.f, "m1", "a", "1-a", 1, 2)
	m2 := record(t, r.f, "m2", "a", "2-a", 2, 1)
	if d := cmp.Diff([]string{"m1", "m2"}, r.handleRecords(m1, m2)); d != "" {
		t.Errorf("failed (-want +got):\n%s", d)
	}
	st := r.outages.state()
	if !in.paused || st == nil || st.Intake != outage.IntakePaused || st.ProbeMessageID != "m1" || st.ProbeBody != m1.Body {
		t.Fatalf("intake paused %v, record %+v: want paused with m1 as the probe's change", in.paused, st)
	}

	// A batch received before the intake stopped, the output back: held,
	// not tried; the intake is paused again.
	r.set(nil, nil)
	r.clock.Advance(10 * time.Second)
	in.paused = false
	m3 := record(t, r.f, "m3", "b", "1-b", 3, 1)
	if failed := r.handleRecords(m3); len(failed) != 1 || len(r.applied) != 0 || !in.paused {
		t.Fatalf("batch while paused: failed %v, applied %v, intake paused %v; want held untried, intake paused again", failed, r.applied, in.paused)
	}
	if n := len(r.sqs.sent); n != 0 {
		t.Fatalf("%d messages sent, want none", n)
	}

	// The probe while the output is down: still paused.
	r.set(err503, nil)
	r.emf.Reset()
	if err := r.h.Probe(t.Context(), "j"); err != nil {
		t.Fatal(err)
	}
	if st := r.outages.state(); !in.paused || in.resumes != 0 || st == nil || st.Intake != outage.IntakePaused || !strings.Contains(st.LastError, "503") {
		t.Fatalf("after a failed probe: intake paused %v, %d resumes, record %+v", in.paused, in.resumes, st)
	}
	if !strings.Contains(r.emf.String(), `"OutputDown":1`) {
		t.Errorf("metrics %s: want OutputDown 1 from the failed probe", r.emf.String())
	}

	// The probe once the output is back: m1 applied, the intake resumes.
	r.set(nil, nil)
	r.emf.Reset()
	if err := r.h.Probe(t.Context(), "j"); err != nil {
		t.Fatal(err)
	}
	if in.paused || in.resumes != 1 || r.outages.state() != nil {
		t.Fatalf("after the probe passed: intake paused %v, %d resumes, record %+v; want running, record deleted", in.paused, in.resumes, r.outages.state())
	}
	if d := cmp.Diff([]string{"a"}, r.applied); d != "" {
		t.Errorf("applied by the probe (-want +got):\n%s", d)
	}
	if !strings.Contains(r.emf.String(), `"OutputDown":0`) {
		t.Errorf("metrics %s: want OutputDown 0 once the intake resumed", r.emf.String())
	}
	// The held changes come back, in their order, and are delivered.
	m1 = record(t, r.f, "m1", "a", "1-a", 1, 3)
	m2 = record(t, r.f, "m2", "a", "2-a", 2, 2)
	if failed := r.handleRecords(m1, m2); len(failed) != 0 {
		t.Fatalf("after resuming: failed %v", failed)
	}
	if d := cmp.Diff([][]string{{"a@1-a"}, {"a@1-a"}, {"a@2-a"}}, r.sinkCalls()[len(r.sinkCalls())-3:]); d != "" {
		t.Errorf("sink calls (-want +got):\n%s", d)
	}
	if st := r.h.Stats()["j/o"]; st.DeadLettered != 0 {
		t.Errorf("stats %+v, want nothing dead-lettered", st)
	}
}

// A long backpressure pauses the intake the same way once the held change
// is on the receive before its last, and the probe keeps it paused while
// the output still asks to slow down.
func TestLongBackpressurePausesTheIntake(t *testing.T) {
	t.Parallel()
	r, in := newIntakeRun(t, "total")
	r.set(err429, nil)
	m1 := record(t, r.f, "m1", "a", "1-a", 1, 2)
	m1.Attributes["MessageGroupId"] = "o"
	if failed := r.handleRecords(m1); len(failed) != 1 || !in.paused {
		t.Fatalf("failed %v, intake paused %v; want m1 in flight and the intake paused", failed, in.paused)
	}
	r.clock.Advance(time.Minute)
	r.emf.Reset()
	if err := r.h.Probe(t.Context(), "j"); err != nil {
		t.Fatal(err)
	}
	if !in.paused || !strings.Contains(r.emf.String(), `"BackpressureActive":1`) {
		t.Errorf("intake paused %v, metrics %s: want it paused while the output asks to slow down", in.paused, r.emf.String())
	}
	if n := len(r.sqs.sent); n != 0 {
		t.Errorf("%d messages sent, want none", n)
	}
}

// The probe's change failing on its own (the output answered, refusing that
// change) resumes the intake: the change then fails through the queue, as
// any change that fails on its own. So does a record that keeps no change
// (its body was too large).
func TestProbeResumesWhenTheOutputAnswers(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		answer error
		body   bool
	}{
		{name: "422", answer: &deliver.Error{Class: deliver.Permanent, Reason: "http_status", HTTPStatus: 422, Err: errors.New("422")}, body: true},
		{name: "no change kept", answer: err503},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, in := newIntakeRun(t, "per_document")
			r.set(tt.answer, nil)
			st := outage.State{Job: "j", Output: "o", Since: r.clock.Now(), LastAt: r.clock.Now(), LastError: "503", ProbeMessageID: "m1"}
			if tt.body {
				st.ProbeBody = record(t, r.f, "m1", "a", "1-a", 1, 1).Body
			}
			if _, err := r.outages.Pause(t.Context(), st); err != nil {
				t.Fatal(err)
			}
			in.paused = true
			if err := r.h.Probe(t.Context(), "j"); err != nil {
				t.Fatal(err)
			}
			if in.paused || r.outages.state() != nil {
				t.Errorf("intake paused %v, record %+v: want resumed", in.paused, r.outages.state())
			}
		})
	}
}

// A resume that fails leaves the record resuming; the next probe turns the
// intake on without trying the output again, and deletes the record. A
// batch that finds the record resuming tries the output at once, though
// this process still waits to retry it.
func TestResumeRetriedByTheNextProbe(t *testing.T) {
	t.Parallel()
	r, in := newIntakeRun(t, "per_document")
	r.set(err503, nil)
	r.handleRecords(record(t, r.f, "m1", "a", "1-a", 1, 2))
	r.set(nil, nil)
	in.err = errors.New("throttled")
	if err := r.h.Probe(t.Context(), "j"); err != nil {
		t.Fatal(err)
	}
	if st := r.outages.state(); st == nil || st.Intake != outage.IntakeResuming {
		t.Fatalf("record %+v, want it resuming", st)
	}
	applied := len(r.applied)
	if failed := r.handleRecords(record(t, r.f, "m1", "a", "1-a", 1, 3)); len(failed) != 0 || len(r.applied) != applied+1 {
		t.Fatalf("batch while resuming: failed %v; want it delivered at once", failed)
	}
	in.err = nil
	if err := r.h.Probe(t.Context(), "j"); err != nil {
		t.Fatal(err)
	}
	if in.paused || in.resumes != 2 || r.outages.state() != nil {
		t.Errorf("intake paused %v after %d resumes, record %+v: want running, record deleted", in.paused, in.resumes, r.outages.state())
	}
	if len(r.applied) != applied+1 {
		t.Errorf("the second probe applied %d changes, want none", len(r.applied)-applied-1)
	}
}

// An outage record that cannot be read holds the batch, untried, and
// counts nothing toward the DLQ.
func TestUnreadableOutageRecordHolds(t *testing.T) {
	t.Parallel()
	r, _ := newIntakeRun(t, "per_document")
	r.outages.getErr = errors.New("throttled")
	if failed := r.handleRecords(record(t, r.f, "m1", "a", "1-a", 1, 3)); len(failed) != 1 || len(r.applied) != 0 || r.dead() != 0 {
		t.Errorf("failed %v, applied %v, %d dead-lettered: want m1 held", failed, r.applied, r.dead())
	}
}

func TestProbeUnknownJob(t *testing.T) {
	t.Parallel()
	r, _ := newIntakeRun(t, "per_document")
	if err := r.h.Probe(t.Context(), "nope"); err == nil || !strings.Contains(err.Error(), `no job "nope"`) {
		t.Errorf("probe of an unknown job: %v", err)
	}
}

// The writer function's input is an SQS batch or its probe schedule's
// event; Invoke handles each.
func TestInvokeInput(t *testing.T) {
	t.Parallel()
	r, _ := newIntakeRun(t, "per_document")
	var probe Input
	if err := json.Unmarshal([]byte(`{"probe":{"job":"j"}}`), &probe); err != nil || probe.Probe == nil || probe.Probe.Job != "j" || len(probe.Records) != 0 {
		t.Fatalf("probe event decoded as %+v, %v", probe, err)
	}
	if _, err := r.h.Invoke(t.Context(), Input{Probe: &ProbeEvent{Job: "nope"}}); err == nil {
		t.Error("a probe of an unknown job: no error")
	}
	rec := record(t, r.f, "m1", "a", "1-a", 1, 1)
	raw, err := json.Marshal(events.SQSEvent{Records: []events.SQSMessage{rec}})
	if err != nil {
		t.Fatal(err)
	}
	var batch Input
	if err := json.Unmarshal(raw, &batch); err != nil || batch.Probe != nil || len(batch.Records) != 1 {
		t.Fatalf("SQS event decoded as %+v, %v", batch, err)
	}
	resp, err := r.h.Invoke(t.Context(), batch)
	if err != nil || len(resp.BatchItemFailures) != 0 || len(r.applied) != 1 {
		t.Errorf("batch: %+v, %v, applied %v", resp, err, r.applied)
	}
}

// fakeLambda holds the event source mappings of functions.
type fakeLambda struct {
	mu       sync.Mutex
	mappings []lambdatypes.EventSourceMappingConfiguration
	updates  []string // "uuid=enabled"
	inUse    bool
}

func (f *fakeLambda) ListEventSourceMappings(ctx context.Context, in *lambda.ListEventSourceMappingsInput, _ ...func(*lambda.Options)) (*lambda.ListEventSourceMappingsOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []lambdatypes.EventSourceMappingConfiguration
	for _, m := range f.mappings {
		// As LocalStack does: a function name matches any ARN holding it.
		if strings.Contains(aws.ToString(m.FunctionArn), aws.ToString(in.FunctionName)) {
			out = append(out, m)
		}
	}
	return &lambda.ListEventSourceMappingsOutput{EventSourceMappings: out}, nil
}

func (f *fakeLambda) UpdateEventSourceMapping(ctx context.Context, in *lambda.UpdateEventSourceMappingInput, _ ...func(*lambda.Options)) (*lambda.UpdateEventSourceMappingOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inUse {
		return nil, &lambdatypes.ResourceInUseException{Message: aws.String("in use")}
	}
	f.updates = append(f.updates, fmt.Sprintf("%s=%v", aws.ToString(in.UUID), aws.ToBool(in.Enabled)))
	for i, m := range f.mappings {
		if aws.ToString(m.UUID) == aws.ToString(in.UUID) {
			f.mappings[i].State = aws.String(map[bool]string{true: "Enabling", false: "Disabling"}[aws.ToBool(in.Enabled)])
		}
	}
	return &lambda.UpdateEventSourceMappingOutput{}, nil
}

// Mappings turns off and on the writer function's own mapping of the
// output's queue, found by the queue's name among the function's mappings,
// and leaves one already in the state asked for.
func TestMappings(t *testing.T) {
	t.Parallel()
	f := testConfig(t, "per_document")
	j := f.Jobs[0]
	route := config.Route{Job: j, Output: j.Outputs[0]}
	queue := f.QueueName(j, j.Outputs[0])
	fl := &fakeLambda{mappings: []lambdatypes.EventSourceMappingConfiguration{
		{UUID: aws.String("other-queue"), FunctionArn: aws.String("arn:aws:lambda:us-east-1:1:function:w"), EventSourceArn: aws.String("arn:aws:sqs:us-east-1:1:x.fifo"), State: aws.String("Enabled")},
		{UUID: aws.String("other-function"), FunctionArn: aws.String("arn:aws:lambda:us-east-1:1:function:w2"), EventSourceArn: aws.String("arn:aws:sqs:us-east-1:1:" + queue), State: aws.String("Enabled")},
		{UUID: aws.String("ours"), FunctionArn: aws.String("arn:aws:lambda:us-east-1:1:function:w"), EventSourceArn: aws.String("arn:aws:sqs:us-east-1:1:" + queue), State: aws.String("Enabled")},
	}}
	m := &Mappings{Lambda: fl, Function: "w", Config: f}
	for range 2 {
		if err := m.Pause(t.Context(), route); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Resume(t.Context(), route); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"ours=false", "ours=true"}, fl.updates); d != "" {
		t.Errorf("updates (-want +got):\n%s", d)
	}
	fl.mappings[2].State = aws.String("Enabled")
	fl.inUse = true
	if err := m.Pause(t.Context(), route); err == nil || !strings.Contains(err.Error(), "event source mapping ours is Enabled") {
		t.Errorf("pause of a mapping in use: %v", err)
	}
	gone := &Mappings{Lambda: fl, Function: "nope", Config: f}
	if err := gone.Pause(t.Context(), route); err == nil || !strings.Contains(err.Error(), "function nope has no event source mapping of queue "+queue) {
		t.Errorf("pause without a mapping: %v", err)
	}
}

// sinkCalls returns the doc@rev lists the run's sink was called with.
func (r *outageRun) sinkCalls() [][]string {
	r.sink.mu.Lock()
	defer r.sink.mu.Unlock()
	return append([][]string(nil), r.sink.calls...)
}
