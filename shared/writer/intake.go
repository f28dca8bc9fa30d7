package writer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	lambdatypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/metrics"
	"github.com/changes-worker/changes-worker/shared/statetable/outage"
)

// On a FIFO output a held change keeps its place at the head of its message
// group: SQS hands out nothing else of the group while it is in flight, so
// the document's later changes wait behind it. It is never sent back to the
// queue, which would put it behind them. While the held changes' receives
// allow (below max_receive_count - 1), they wait in flight for the retry
// wait or the pause the output asked for. From the receive before the last
// on, the writer pauses the output's intake instead: it records the pause
// in the outage record, with the held change the output is to be probed
// with, and turns off what hands it the queue's messages (Intake: its event
// source mapping on Lambda, the receivers under changesctl run). Receives
// then stop, and so does the count toward SQS's redrive limit, whatever the
// outage's length; the queue's redrive policy allows SQS's maximum of
// receives (config.Output.QueueMaxReceiveCount), and the writer counts
// max_receive_count itself for changes that fail on their own.
//
// While the record says the intake is paused, no writer gives anything to
// the output: batches received before the intake stopped are held in
// flight, and the intake is paused again if it runs. Only the probe
// (Handler.Probe, from a schedule) tries the output, with the record's
// change, one probe at a time: that change is still at the head of its
// group (it was held, and nothing was applied since), so applying it cannot
// pass a newer change of its document. Once the output takes it, or fails it
// in a way that is the change's own, the probe marks the record resuming,
// turns the intake on and deletes the record; the writers deliver from the
// head of every group on. Standard-queue outputs (ordering none) promise no
// order and never pause: their held changes go back to the queue with a
// fresh receive count (deferMessage).

// Intake turns on and off what hands the writer the messages of an output's
// work queue. Both calls are idempotent and safe for concurrent use; a call
// that fails is made again by the next batch or probe.
type Intake interface {
	Pause(ctx context.Context, r config.Route) error
	Resume(ctx context.Context, r config.Route) error
}

// Failure reasons of changes not given to the output because of its intake.
const (
	// reasonIntakePaused: the output's intake is paused; only the probe
	// tries it.
	reasonIntakePaused = "intake_paused"
	// reasonOutageState: the outage record could not be read.
	reasonOutageState = "outage_state"
)

// pauseCheckEvery is how often a writer process turns an output's intake
// off again while batches still arrive for it with its intake paused.
const pauseCheckEvery = 10 * time.Second

// pauses reports whether the writer pauses r's intake when its changes are
// held: a FIFO output, with an outage store and an intake to turn off.
func (h *Handler) pauses(r config.Route) bool {
	return r.Output.FIFO() && h.Outages != nil && h.Intake != nil
}

// readIntake reads, on an output whose intake the writer pauses, its outage
// record before anything of the batch is applied. While the record says
// the intake is paused, every change is held in flight without a try, and
// the intake is turned off again (at most once per pauseCheckEvery): it may
// be running, if a pause did not take or a probe's resume crossed it. A
// resuming record, or none, lets the batch try the output at once even if
// this process still waits to retry it: the probe, or another writer, found
// it back. A record that cannot be read holds the batch too.
func (b *batch) readIntake(ctx context.Context) {
	if !b.h.pauses(b.route) {
		return
	}
	rec, err := b.h.Outages.Get(ctx, b.route.Job.ID, b.route.Output.ID)
	if err != nil {
		b.log.WarnContext(ctx, "read outage record; holding the batch", "error", err)
		b.holdAll(deliver.TransientError(reasonOutageState, err))
		return
	}
	switch {
	case rec == nil || rec.Intake == outage.IntakeResuming:
		b.tryNow = true
	case rec.Intake == outage.IntakePaused:
		b.holdAll(deliver.TransientError(reasonIntakePaused, fmt.Errorf("the output's intake is paused since %s (%s); the probe tries it", rec.PausedAt.UTC().Format(time.RFC3339), rec.LastError)))
		if b.h.pauseCheck(b.route).due(b.h.Now.Now(), pauseCheckEvery) {
			if err := b.h.Intake.Pause(ctx, b.route); err != nil {
				b.h.pauseCheck(b.route).again()
				b.log.WarnContext(ctx, "pause intake", "error", err)
			}
		}
	}
}

// holdAll fails every change not failed yet with e and holds it in flight
// for the output's outage.max_retry, not counted toward the DLQ.
func (b *batch) holdAll(e *deliver.Error) {
	for _, it := range b.items {
		if it.err == nil {
			it.err, it.hold, it.delay = e, heldForIntake, holdFor(b.route.Output.Outage.MaxRetry.D())
		}
	}
}

// pauseCheck returns the periodic re-pause of a route, one per process.
func (h *Handler) pauseCheck(r config.Route) *periodic {
	key := outputKey(r.Job.ID, r.Output.ID)
	if p, ok := h.pausing.Load(key); ok {
		return p.(*periodic)
	}
	kept, _ := h.pausing.LoadOrStore(key, &periodic{})
	return kept.(*periodic)
}

// pauseIfDue pauses the output's intake when a change the batch holds for
// the output (down, or asking to slow down) is on the receive before its
// last or later (see the package comment above).
func (b *batch) pauseIfDue(ctx context.Context) {
	if !b.h.pauses(b.route) {
		return
	}
	due := max(1, b.route.Output.MaxReceiveCount-1)
	var probe *item
	for _, it := range b.items {
		if it.hold != heldForOutage && it.hold != heldForBackpressure {
			continue
		}
		if probe == nil && it.behind == nil {
			probe = it
		}
		if receiveCount(it.rec) >= due && probe != nil {
			b.pauseIntake(ctx, probe)
			return
		}
	}
}

// pauseIntake records the pause with probe, the first held change at the
// head of its group, then turns the intake off. The changes stay in flight
// either way; when the record cannot be written the intake stays on, and a
// later batch pauses it.
func (b *batch) pauseIntake(ctx context.Context, probe *item) {
	now := b.h.Now.Now()
	since := b.h.outputState(b.route).sinceTime()
	if since.IsZero() {
		since = now
	}
	st := outage.State{Job: b.route.Job.ID, Output: b.route.Output.ID, Since: since, LastAt: now, LastError: probe.err.Error(),
		ProbeMessageID: probe.rec.MessageId, ProbeBody: probe.rec.Body}
	paused, err := b.h.Outages.Pause(ctx, st)
	if err != nil {
		b.log.WarnContext(ctx, "record intake pause; the held changes wait in flight", "error", err)
		return
	}
	if err := b.h.Intake.Pause(ctx, b.route); err != nil {
		b.log.WarnContext(ctx, "pause intake; the next batch tries again", "error", err)
	}
	if paused {
		b.log.WarnContext(ctx, "output intake paused; the probe tries the output until it takes a change",
			"reason", probe.err.Reason, "error", probe.err.Error(), "probe_message_id", probe.rec.MessageId, "attempts", receiveCount(probe.rec))
	}
}

// visibility is a held message's visibility change, made once the batch is
// disposed of.
type visibility struct {
	it    *item
	delay time.Duration
}

// holdInFlight keeps a held message of a FIFO output in flight for delay.
// The changes are made in reverse batch order (flushVisibility): a message
// held behind another of its group then never becomes visible later than
// that one, so even an SQS that hands out the visible messages of a group
// around one in flight (LocalStack does) gives them out in order.
func (b *batch) holdInFlight(it *item, delay time.Duration) {
	b.visibilities = append(b.visibilities, visibility{it: it, delay: delay})
}

// flushVisibility makes the visibility changes holdInFlight collected, last
// message first. Best effort: a message whose change fails comes back after
// the visibility it was received with.
func (b *batch) flushVisibility(ctx context.Context) {
	if len(b.visibilities) == 0 {
		return
	}
	q, err := b.h.queueURL(ctx, b.h.Config.QueueName(b.route.Job, b.route.Output))
	if err != nil {
		b.log.WarnContext(ctx, "hold back", "error", err)
		return
	}
	for _, v := range slices.Backward(b.visibilities) {
		if v.it.rec.ReceiptHandle == "" {
			continue
		}
		if _, err := b.h.SQS.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
			QueueUrl: &q, ReceiptHandle: &v.it.rec.ReceiptHandle, VisibilityTimeout: int32(v.delay / time.Second),
		}); err != nil {
			b.log.WarnContext(ctx, "hold back: extend visibility", "message_id", v.it.rec.MessageId, "error", err)
		}
	}
}

// ProbeEvent asks the writer to probe the outputs of Job whose intake is
// paused: what its probe schedule sends, {"probe": {"job": "<id>"}}.
type ProbeEvent struct {
	Job string `json:"job"`
}

// Input is what the writer function is invoked with: an SQS batch from one
// of its event source mappings, or a probe from its schedule.
type Input struct {
	events.SQSEvent
	Probe *ProbeEvent `json:"probe,omitempty"`
}

// Invoke is the writer function's handler: it handles an SQS batch
// (Handle) or a probe (Probe).
func (h *Handler) Invoke(ctx context.Context, in Input) (events.SQSEventResponse, error) {
	if in.Probe != nil {
		return events.SQSEventResponse{}, h.Probe(ctx, in.Probe.Job)
	}
	return h.Handle(ctx, in.SQSEvent)
}

// Probe tries every output of job whose intake is paused with the change
// its outage record keeps, under a claim on the record that ends with ctx's
// deadline (one probe at a time per output). When the output takes it, or
// fails it in a way that is the change's own (the output answered), the
// intake runs again and the record is deleted; otherwise the record keeps
// the error and the intake stays paused. A record left resuming (its
// intake could not be turned on) has its intake turned on again. Only a job
// that is not configured is an error; each output's failures are logged.
// Safe for concurrent use.
func (h *Handler) Probe(ctx context.Context, job string) error {
	j := h.Config.Job(job)
	if j == nil {
		return fmt.Errorf("probe: no job %q in the configuration", job)
	}
	for _, o := range j.Outputs {
		r := config.Route{Job: j, Output: o}
		if h.pauses(r) {
			h.probe(ctx, r)
		}
	}
	return nil
}

// probe probes one output (see Probe).
func (h *Handler) probe(ctx context.Context, r config.Route) {
	log := h.Log.With("job", r.Job.ID, "output", r.Output.ID)
	rec := metrics.New(h.metricsOut(), map[string]string{"Job": r.Job.ID, "Output": r.Output.ID})
	defer func() {
		if err := rec.Flush(); err != nil {
			log.Warn("flush metrics", "error", err)
		}
	}()
	cur, err := h.Outages.Get(ctx, r.Job.ID, r.Output.ID)
	switch {
	case err != nil:
		log.WarnContext(ctx, "probe: read outage record", "error", err)
		return
	case cur == nil || cur.Intake == "":
		return
	case cur.Intake == outage.IntakeResuming:
		// A resume that failed: turn the intake on again.
		h.resumeIntake(ctx, log, rec, r, cur)
		return
	}
	now := h.Now.Now()
	until, ok := ctx.Deadline()
	if !ok {
		until = now.Add(h.Config.Stack.WriterTimeout.D())
	}
	st, err := h.Outages.ClaimProbe(ctx, r.Job.ID, r.Output.ID, now, until)
	if err != nil {
		log.WarnContext(ctx, "probe: claim", "error", err)
		return
	}
	if st == nil {
		return // resumed meanwhile, or another probe is under way
	}
	if e := h.tryProbe(ctx, log, rec, r, st); e != nil {
		if isBackpressure(e, false) {
			rec.Add(metrics.BackpressureActive, 1, metrics.None)
		} else {
			rec.Add(metrics.OutputDown, 1, metrics.None)
		}
		log.WarnContext(ctx, "output still down; its intake stays paused", "error", e.Error(),
			"paused_for", h.Now.Since(st.PausedAt).Round(time.Second).String())
		if err := h.Outages.ProbeFailed(ctx, outage.State{Job: r.Job.ID, Output: r.Output.ID, LastAt: h.Now.Now(), LastError: e.Error()}, until); err != nil {
			log.WarnContext(ctx, "probe: record", "error", err)
		}
		return
	}
	if err := h.Outages.Resuming(ctx, r.Job.ID, r.Output.ID); err != nil {
		log.WarnContext(ctx, "probe: record resuming; the next probe tries again", "error", err)
		return
	}
	h.resumeIntake(ctx, log, rec, r, st)
}

// tryProbe gives the output the change of its outage record st, and
// returns the failure that keeps its intake paused: the output down or
// asking to slow down (blame's classes). It returns nil when the output
// took the change or failed it for a reason of the change's own, and when
// st keeps no change (its body was too large): the queue's own messages
// then try the output.
func (h *Handler) tryProbe(ctx context.Context, log *slog.Logger, rec *metrics.Recorder, r config.Route, st *outage.State) *deliver.Error {
	if st.ProbeBody == "" {
		return nil
	}
	env, err := change.Decode([]byte(st.ProbeBody))
	if err != nil {
		return nil
	}
	if env.DocRef != nil && !env.Tombstone() {
		if e := h.resolve(ctx, env); e != nil {
			if e.Class == deliver.Permanent {
				return nil
			}
			return e
		}
	}
	sink, err := h.sink(ctx, r)
	if err != nil {
		h.forgetSink(r)
		return deliver.TransientError(reasonUnavailable, err)
	}
	tr := h.tracker(r)
	errs := sink.Apply(deliver.WithPacer(ctx, meter{Tracker: tr, rec: rec}), []*change.Envelope{env})
	if len(errs) == 0 || errs[0] == nil {
		log.InfoContext(ctx, "probe: the output took the change", "doc_id", env.DocID, "message_id", st.ProbeMessageID)
		return nil
	}
	e := deliver.Classify(errs[0])
	if e.Err != nil {
		// Logged and recorded as stack.doc_ids says (as batch.apply does).
		e.Err = h.ids().ScrubError(e.Err, env.DocID)
	}
	switch {
	case outputFailure(e):
		h.forgetSink(r)
		return e
	case isBackpressure(e, false):
		tr.Pause(e.RetryAfter)
		return e
	}
	log.InfoContext(ctx, "probe: the output answered; the change failed on its own", "doc_id", env.DocID, "reason", e.Reason)
	return nil
}

// resumeIntake turns the intake of r on again and deletes its resuming
// outage record st; this process tries the output at once.
func (h *Handler) resumeIntake(ctx context.Context, log *slog.Logger, rec *metrics.Recorder, r config.Route, st *outage.State) {
	if err := h.Intake.Resume(ctx, r); err != nil {
		log.ErrorContext(ctx, "resume intake; the next probe tries again", "error", err)
		return
	}
	h.outputState(r).recovered(h.Now.Now())
	deleted, err := h.Outages.Resumed(ctx, r.Job.ID, r.Output.ID)
	if err != nil {
		log.WarnContext(ctx, "probe: delete outage record", "error", err)
		return
	}
	if deleted {
		rec.Add(metrics.OutputDown, 0, metrics.None)
		log.InfoContext(ctx, "output intake resumed; the output takes changes again",
			"down_for", h.Now.Since(st.Since).Round(time.Second).String(), "paused_for", h.Now.Since(st.PausedAt).Round(time.Second).String())
	}
}

// forgetSink drops the output's sink, so that the next try opens it anew,
// and has the secrets read again.
func (h *Handler) forgetSink(r config.Route) {
	h.sinks.Delete(outputKey(r.Job.ID, r.Output.ID))
	if h.Secrets != nil {
		h.Secrets.Refresh()
	}
}

// LambdaAPI is the part of the Lambda client Mappings calls.
type LambdaAPI interface {
	ListEventSourceMappings(ctx context.Context, in *lambda.ListEventSourceMappingsInput, optFns ...func(*lambda.Options)) (*lambda.ListEventSourceMappingsOutput, error)
	UpdateEventSourceMapping(ctx context.Context, in *lambda.UpdateEventSourceMappingInput, optFns ...func(*lambda.Options)) (*lambda.UpdateEventSourceMappingOutput, error)
}

// Mappings is the writer function's Intake on Lambda: its event source
// mapping of an output's work queue, found among Function's mappings by the
// queue's name, disabled and enabled. Safe for concurrent use.
type Mappings struct {
	Lambda LambdaAPI
	// Function is the writer function's name (AWS_LAMBDA_FUNCTION_NAME).
	Function string
	Config   *config.File
}

var _ Intake = (*Mappings)(nil)

// Pause disables the mapping; one disabled or disabling is left as it is.
func (m *Mappings) Pause(ctx context.Context, r config.Route) error { return m.set(ctx, r, false) }

// Resume enables the mapping; one enabled or enabling is left as it is.
func (m *Mappings) Resume(ctx context.Context, r config.Route) error { return m.set(ctx, r, true) }

func (m *Mappings) set(ctx context.Context, r config.Route, enabled bool) error {
	verb := "pause"
	if enabled {
		verb = "resume"
	}
	queue := m.Config.QueueName(r.Job, r.Output)
	mp, err := m.find(ctx, queue)
	if err != nil {
		return fmt.Errorf("%s intake of %s: %w", verb, queue, err)
	}
	state := aws.ToString(mp.State)
	switch {
	case enabled && (state == "Enabled" || state == "Enabling"),
		!enabled && (state == "Disabled" || state == "Disabling"):
		return nil
	}
	_, err = m.Lambda.UpdateEventSourceMapping(ctx, &lambda.UpdateEventSourceMappingInput{UUID: mp.UUID, Enabled: aws.Bool(enabled)})
	if err != nil {
		var inUse *lambdatypes.ResourceInUseException
		if errors.As(err, &inUse) {
			return fmt.Errorf("%s intake of %s: event source mapping %s is %s: %w", verb, queue, aws.ToString(mp.UUID), state, err)
		}
		return fmt.Errorf("%s intake of %s: update event source mapping %s: %w", verb, queue, aws.ToString(mp.UUID), err)
	}
	return nil
}

// find returns the function's mapping of the queue named queue.
func (m *Mappings) find(ctx context.Context, queue string) (lambdatypes.EventSourceMappingConfiguration, error) {
	p := lambda.NewListEventSourceMappingsPaginator(m.Lambda, &lambda.ListEventSourceMappingsInput{FunctionName: &m.Function})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return lambdatypes.EventSourceMappingConfiguration{}, fmt.Errorf("list event source mappings of %s: %w", m.Function, err)
		}
		for _, mp := range page.EventSourceMappings {
			if queueName(aws.ToString(mp.EventSourceArn)) == queue && queueName(aws.ToString(mp.FunctionArn)) == m.Function {
				return mp, nil
			}
		}
	}
	return lambdatypes.EventSourceMappingConfiguration{}, fmt.Errorf("function %s has no event source mapping of queue %s", m.Function, queue)
}
