// Package writer is the writer Lambda's handler: it turns an SQS batch of
// change envelopes into changes (resolving claim-checked bodies), applies
// them to their output through a deliver.Sink, moves the failures that
// retrying cannot fix to the output's DLQ with their failure.Record, and
// answers with the messages to retry, following the Lambda SQS event source
// contract (ReportBatchItemFailures).
package writer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/backpressure"
	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/docid"
	"github.com/changes-worker/changes-worker/shared/failure"
	"github.com/changes-worker/changes-worker/shared/metrics"
	"github.com/changes-worker/changes-worker/shared/statetable/halt"
)

// SQS is the part of the SQS client the handler calls: moving failures to the
// DLQ and pacing transient retries.
type SQS interface {
	GetQueueUrl(ctx context.Context, in *sqs.GetQueueUrlInput, optFns ...func(*sqs.Options)) (*sqs.GetQueueUrlOutput, error)
	SendMessage(ctx context.Context, in *sqs.SendMessageInput, optFns ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
	ChangeMessageVisibility(ctx context.Context, in *sqs.ChangeMessageVisibilityInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
	SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, optFns ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
	ChangeMessageVisibilityBatch(ctx context.Context, in *sqs.ChangeMessageVisibilityBatchInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityBatchOutput, error)
}

// S3 is the part of the S3 client the handler calls to read claim checks.
type S3 interface {
	GetObject(ctx context.Context, in *s3.GetObjectInput, optFns ...func(*s3.Options)) (*s3.GetObjectOutput, error)
}

// Halts is the part of the halt store the handler calls for outputs with
// on_failure halt (see package halt).
type Halts interface {
	Get(ctx context.Context, job, output, group string) (*halt.State, error)
	Record(ctx context.Context, st halt.State) (*halt.State, error)
	Clear(ctx context.Context, job, output, group, messageID string) error
	Check(ctx context.Context, job, output string) (halt.OutputStatus, error)
}

// SinkFactory returns the sink of a route; it is called once per route and
// the result reused for the life of the process.
type SinkFactory func(ctx context.Context, r config.Route) (deliver.Sink, error)

// Handler is the writer: it handles SQS batches from the work queues of every
// configured output. Safe for concurrent use.
type Handler struct {
	Config  *config.File
	Sinks   SinkFactory
	SQS     SQS
	S3      S3
	Log     *slog.Logger
	Metrics io.Writer   // EMF destination
	Now     clock.Clock // failure times and end-to-end latency; zero: the system clock
	// Halts records halted message groups; required when an output has
	// on_failure halt.
	Halts Halts
	// Outages, when set, records the outputs that are down.
	Outages Outages
	// Secrets, when set, is told to read secrets again when an output is
	// down, before it is opened again.
	Secrets Secrets
	// Intake, when set with Outages, turns off and on what hands the writer
	// a FIFO output's messages: the writer pauses it while it holds the
	// output's changes (see Intake).
	Intake Intake

	sinks    sync.Map // "job/output" -> deliver.Sink
	trackers sync.Map // "job/output" -> *backpressure.Tracker
	outages  sync.Map // "job/output" -> *outputState
	checks   sync.Map // "job/output" -> *periodic: the halt check of a halting output
	pausing  sync.Map // "job/output" -> *periodic: the re-pause of a paused intake
	slow     sync.Map // "job/output" -> bool: the output was slow at its last batch
	urls     sync.Map // queue name -> URL
	mu       sync.Mutex
	stats    map[string]*Stats
}

// Stats counts what the handler did for one output since the process started.
type Stats struct {
	Delivered    int64 // applied, or already superseded by a newer change
	DeadLettered int64 // moved to the DLQ
	Retried      int64 // returned to the queue for another attempt
	Deferred     int64 // held back because the output asked to slow down (also in Retried when the receive was kept)
	Held         int64 // held back because the output was down or its intake paused (also in Retried when the receive was kept)
}

// outputKey is "job/output": the key of an output's sink, tracker and
// counters in a Handler.
func outputKey(job, output string) string { return job + "/" + output }

// Stats returns a copy of the counters, keyed "job/output".
func (h *Handler) Stats() map[string]Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]Stats, len(h.stats))
	for k, v := range h.stats {
		out[k] = *v
	}
	return out
}

// count adds d to the counters of r's output.
func (h *Handler) count(r config.Route, d Stats) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stats == nil {
		h.stats = map[string]*Stats{}
	}
	k := outputKey(r.Job.ID, r.Output.ID)
	st := h.stats[k]
	if st == nil {
		st = &Stats{}
		h.stats[k] = st
	}
	st.Delivered += d.Delivered
	st.DeadLettered += d.DeadLettered
	st.Retried += d.Retried
	st.Deferred += d.Deferred
	st.Held += d.Held
}

// item is one record on its way through the handler.
type item struct {
	rec   events.SQSMessage
	env   *change.Envelope
	group string
	err   *deliver.Error
	done  bool
	// On a halting output: the group's halt record when this message is the
	// change it stopped at, and whether the operator asked to skip it.
	halted *halt.State
	skip   bool
	// uncleared: the halted change was delivered but its halt record could
	// not be cleared; it stays in the queue, at the head of its group.
	uncleared bool
	// held: not attempted because an earlier change of its group failed or
	// halted it; behind: that change, when it was in the batch.
	held   bool
	behind *item
	// tried: given to the sink.
	tried bool
	// hold: held back without counting toward the DLQ, for delay, and why
	// (blame).
	hold  holdKind
	delay time.Duration
}

// Handle processes one batch and returns the messages to retry
// (ReportBatchItemFailures). Permanent failures, and transient ones on their
// last allowed receive, are moved to the DLQ with their reason and count as
// handled. On FIFO queues, once a message of a group fails, later messages of
// that group in the batch are not applied and are returned as failed too.
func (h *Handler) Handle(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
	var resp events.SQSEventResponse
	work, cancel := workContext(ctx)
	defer cancel()
	byQueue := map[string][]*item{}
	var order []string
	for _, rec := range ev.Records {
		q := queueName(rec.EventSourceARN)
		if _, ok := byQueue[q]; !ok {
			order = append(order, q)
		}
		byQueue[q] = append(byQueue[q], &item{rec: rec, group: rec.Attributes["MessageGroupId"]})
	}
	for _, q := range order {
		failed, err := h.handleQueue(ctx, work, q, byQueue[q])
		if err != nil {
			return resp, err
		}
		for _, id := range failed {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: id})
		}
	}
	return resp, nil
}

// handleQueue handles the messages of one work queue and returns those to
// retry. Reading claim checks, opening the output and applying end with
// work (workContext); what they did not finish is retried (cutShort). A
// queue that belongs to no configured output fails the whole batch.
func (h *Handler) handleQueue(ctx, work context.Context, queue string, items []*item) ([]string, error) {
	route, ok := h.Config.RouteByQueueName(queue)
	if !ok {
		// Not ours: a configuration mismatch. Fail the whole batch so nothing
		// is lost; the messages reach the DLQ through the redrive policy.
		return nil, fmt.Errorf("handle batch: queue %q belongs to no configured output", queue)
	}
	b := h.newBatch(route, items)
	defer b.flush()
	b.decode(work)
	b.readHalts(ctx)
	b.readIntake(ctx)
	open := b.undecided()
	b.apply(work)
	b.cutShort(ctx, work, open)
	b.blame(ctx)
	b.dispose(ctx)
	return b.failed, nil
}

// workContext returns the context of a batch's work: it ends a reserve
// before ctx's deadline (a fifth of the time left, between 500 ms and 5 s),
// which is kept for reporting the outcome. An invocation that outlasts its
// timeout reports nothing, and on Lambda its instance is reset, its pools
// and opened outputs lost: the next one starts cold and may run out of time
// again. The changes the work did not finish are retried instead.
func workContext(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	reserve := min(max(time.Until(deadline)/5, 500*time.Millisecond), 5*time.Second)
	return context.WithDeadline(ctx, deadline.Add(-reserve))
}

// Failure reasons: the batch's work ended before the change was applied;
// its claim-checked body could not be read (for now).
const (
	reasonCutShort   = "cut_short"
	reasonClaimCheck = "claim_check"
)

var errCutShort = errors.New("the invocation's time for work ran out before the change was applied")

// undecided returns the changes nothing has failed yet: those apply gives
// the output.
func (b *batch) undecided() map[*item]bool {
	open := map[*item]bool{}
	for _, it := range b.items {
		if it.err == nil {
			open[it] = true
		}
	}
	return open
}

// cutShort, once work ended before ctx, marks the changes it left undone:
// those of open not applied and not failed for good, and those whose claim
// check could not be read. Their messages are retried (disposeOne), neither
// blamed on the output nor counted toward the DLQ: the output did not fail
// them, time ran out.
func (b *batch) cutShort(ctx, work context.Context, open map[*item]bool) {
	if work.Err() == nil || ctx.Err() != nil {
		return
	}
	n := 0
	for _, it := range b.items {
		unread := it.err != nil && it.err.Class == deliver.Transient && it.err.Reason == reasonClaimCheck
		if it.done || !(open[it] || unread) || it.hold != notHeld || (it.err != nil && it.err.Class == deliver.Permanent) {
			continue
		}
		it.err, it.tried, it.held, it.behind = deliver.TransientError(reasonCutShort, errCutShort), false, false, nil
		n++
	}
	if n > 0 {
		b.log.WarnContext(ctx, "work cut short before the deadline; the changes not applied are received again", "changes", n)
	}
}

// batch is the messages of one work queue in an SQS batch, on their way
// through the handler's phases: decode, readHalts (halting outputs only),
// readIntake (outputs whose intake the writer pauses), apply, blame and
// dispose. Each phase works on what the earlier ones left in the items. Used
// by one goroutine.
type batch struct {
	h     *Handler
	route config.Route
	log   *slog.Logger
	rec   *metrics.Recorder
	tr    *backpressure.Tracker
	items []*item
	// failed: the message ids to retry; n: what the batch did, added to
	// the handler's counters at the end.
	failed []string
	n      Stats
	// tryNow: the output is tried even if this process waits to retry it
	// (readIntake). visibilities: the visibility changes of held messages
	// of a FIFO output (holdInFlight); extensions and sendBacks: the
	// requests that hold messages of a standard queue (deferMessage).
	tryNow       bool
	visibilities []visibility
	extensions   []visibility
	sendBacks    []sendBack
}

func (h *Handler) newBatch(route config.Route, items []*item) *batch {
	return &batch{
		h:     h,
		route: route,
		log:   h.Log.With("job", route.Job.ID, "output", route.Output.ID),
		rec:   metrics.New(h.metricsOut(), map[string]string{"Job": route.Job.ID, "Output": route.Output.ID}),
		tr:    h.tracker(route),
		items: items,
	}
}

// flush writes the batch's metrics.
func (b *batch) flush() {
	if err := b.rec.Flush(); err != nil {
		b.log.Warn("flush metrics", "error", err)
	}
}

// decode turns each message into its envelope, with its claim-checked body
// read: a message that cannot be decoded or belongs to another output
// fails permanently.
func (b *batch) decode(ctx context.Context) {
	for _, it := range b.items {
		env, err := change.Decode([]byte(it.rec.Body))
		if err != nil {
			it.err = deliver.PermanentError("decode", err)
			continue
		}
		if env.Job != b.route.Job.ID || env.Output != b.route.Output.ID {
			it.err = deliver.PermanentError("misrouted", fmt.Errorf("envelope for %s/%s on queue of %s/%s", env.Job, env.Output, b.route.Job.ID, b.route.Output.ID))
			continue
		}
		it.env = env
		if env.DocRef != nil && !env.Tombstone() {
			if err := b.h.resolve(ctx, env); err != nil {
				it.err = err
			}
		}
	}
}

// apply gives the batch's changes to the output (attempt); a change the
// output answered with backpressure pauses the output's tracker.
func (b *batch) apply(ctx context.Context) {
	b.attempt(ctx)
	ids := b.h.ids()
	for _, it := range b.items {
		if it.err != nil && it.env != nil && it.err.Err != nil {
			// Whatever the error says of the document is shown from here
			// on as stack.doc_ids says: logs, DLQ attributes, halt and
			// outage records.
			it.err.Err = ids.ScrubError(it.err.Err, it.env.DocID, it.group)
		}
		if it.err != nil && it.err.Backpressure {
			b.tr.Pause(it.err.RetryAfter)
		}
	}
}

// ids is how the handler shows document ids outside the messages
// themselves (stack.doc_ids).
func (h *Handler) ids() docid.Exposure { return docid.Exposure(h.Config.Stack.DocIDs) }

// attempt gives the decodable changes to the sink, unless the output is
// down and its next try is not due, cannot be opened, or asked for a pause:
// then every change not failed yet fails with that. On a FIFO queue it goes
// in rounds (applyGroups).
func (b *batch) attempt(ctx context.Context) {
	if wait, cause := b.h.outputState(b.route).waiting(b.h.Now.Now()); wait > 0 && !b.tryNow {
		b.failRest(errDown(wait, cause))
		return
	}
	sink, err := b.h.sink(ctx, b.route)
	if err != nil {
		// A DSN or secret not set or unparsable, a pool that cannot be
		// built: the output is down (blame).
		b.log.ErrorContext(ctx, "open output", "error", err)
		b.failRest(deliver.TransientError(reasonUnavailable, err))
		return
	}
	if st := b.tr.State(); st.Paused > 0 {
		// The output asked for a pause: do not knock again before it ends.
		b.failRest(&deliver.Error{Class: deliver.Transient, Reason: "backpressure", Backpressure: true, RetryAfter: st.Paused, Err: errPaused})
		return
	}
	b.h.noteSlow(ctx, b.log, b.route, b.tr.State())
	ctx = deliver.WithPacer(ctx, meter{Tracker: b.tr, rec: b.rec})
	if !b.route.Output.FIFO() {
		var round []*item
		for _, it := range b.items {
			if it.err == nil {
				round = append(round, it)
			}
		}
		applyRound(ctx, sink, round)
		return
	}
	b.applyGroups(ctx, sink)
}

// failRest fails with e every change not failed yet.
func (b *batch) failRest(e *deliver.Error) {
	for _, it := range b.items {
		if it.err == nil {
			it.err = e
		}
	}
}

// applyGroups sends the decodable changes of a FIFO queue to the sink in
// rounds, the k-th message of every group in round k, and drops a group
// from later rounds once one of its messages failed transiently (on a
// halting output: failed at all, except a change the operator skips). On a
// halting output, an applied change that halted its group has its halt
// cleared before anything later of the group is applied; a record that
// cannot be cleared drops the group from later rounds.
func (b *batch) applyGroups(ctx context.Context, sink deliver.Sink) {
	halts := b.route.Output.Halts()
	var groups []string
	byGroup := map[string][]*item{}
	for _, it := range b.items {
		if _, ok := byGroup[it.group]; !ok {
			groups = append(groups, it.group)
		}
		byGroup[it.group] = append(byGroup[it.group], it)
	}
	broken := map[string]*item{}
	for round := 0; ; round++ {
		var batch []*item
		more := false
		for _, g := range groups {
			its := byGroup[g]
			if round >= len(its) {
				continue
			}
			more = true
			it := its[round]
			if first := broken[g]; first != nil {
				it.err = deliver.TransientError(reasonGroupBlocked, fmt.Errorf("an earlier message of group %s failed (%s)", g, first.rec.MessageId))
				it.held, it.behind = true, first
				continue
			}
			if it.err != nil {
				if it.err.Class == deliver.Transient || (halts && !it.skip) {
					broken[g] = it
				}
				continue
			}
			batch = append(batch, it)
		}
		if !more {
			return
		}
		applyRound(ctx, sink, batch)
		for _, it := range batch {
			if it.err != nil && (it.err.Class == deliver.Transient || halts) {
				broken[it.group] = it
			}
			if halts && it.done && it.halted != nil && !b.clearDelivered(ctx, it) {
				broken[it.group] = it
			}
		}
	}
}

// dispose turns the outcome of each change into what becomes of its
// message: handled (applied, or moved to the DLQ), held back, or retried;
// on a halting output it records and clears halts (disposeHalting).
func (b *batch) dispose(ctx context.Context) {
	if b.route.Output.Halts() {
		b.disposeHalting(ctx)
	} else {
		for _, it := range b.items {
			if b.disposeOne(ctx, it) {
				b.failed = append(b.failed, it.rec.MessageId)
			}
		}
	}
	b.pauseIfDue(ctx)
	b.flushVisibility(ctx)
	b.flushHolds(ctx)
	b.n.Retried = int64(len(b.failed))
	b.h.count(b.route, b.n)
	backpressureMetrics(b.rec, b.tr.State())
	if len(b.failed) > 0 {
		b.rec.Add(metrics.WriterBatchFailures, float64(len(b.failed)), metrics.Count)
	}
}

// disposeOne disposes of one change of an output that does not halt and
// returns whether its message is to be retried.
func (b *batch) disposeOne(ctx context.Context, it *item) (retry bool) {
	if it.err == nil {
		if it.done {
			b.n.Delivered++
			b.h.delivered(b.rec, it)
		}
		return false
	}
	docID := ""
	if it.env != nil {
		docID = it.env.DocID
	}
	attempts := receiveCount(it.rec)
	last := attempts >= b.route.Output.MaxReceiveCount
	if deliver.AuthFailure(it.err) {
		lg0 := b.log.With("doc_id", docID, "status", it.err.HTTPStatus, "sqlstate", it.err.SQLState)
		lg0.ErrorContext(ctx, "output rejected our credentials")
	}
	lg := b.log.With("doc_id", docID, "message_id", it.rec.MessageId, "attempts", attempts, "class", it.err.Class, "reason", it.err.Reason)
	if it.hold != notHeld {
		return b.holdBack(ctx, lg, it, attempts)
	}
	if it.err.Reason == reasonCutShort {
		return true
	}
	if it.err.Class == deliver.Permanent || last {
		b.rec.Add(metrics.FailedPermanent, 1, metrics.Count)
		if err := b.toDLQ(ctx, it, attempts); err != nil {
			lg.ErrorContext(ctx, "move to dlq failed; message will be retried", "error", err)
			return true
		}
		lg.WarnContext(ctx, "moved to dlq", "error", it.err.Error())
		b.n.DeadLettered++
		return false
	}
	b.rec.Add(metrics.FailedTransient, 1, metrics.Count)
	lg.WarnContext(ctx, "delivery failed; will retry", "error", it.err.Error())
	b.pace(ctx, it, attempts)
	return true
}

// delivered records the metrics of an applied change.
func (h *Handler) delivered(rec *metrics.Recorder, it *item) {
	rec.Add(metrics.Delivered, 1, metrics.Count)
	if it.env != nil && !it.env.EnqueuedAt.IsZero() {
		rec.Add(metrics.EndToEndLatencyMs, float64(h.Now.Since(it.env.EnqueuedAt).Milliseconds()), metrics.Milliseconds)
	}
}

// applyRound gives a round of changes to the sink at once and records
// each one's outcome.
func applyRound(ctx context.Context, sink deliver.Sink, batch []*item) {
	if len(batch) == 0 {
		return
	}
	envs := make([]*change.Envelope, len(batch))
	for i, it := range batch {
		envs[i] = it.env
	}
	errs := sink.Apply(ctx, envs)
	for i, it := range batch {
		it.tried = true
		var err error
		if i < len(errs) {
			err = errs[i]
		} else {
			err = deliver.TransientError("sink_contract", errors.New("sink returned fewer results than changes"))
		}
		if err != nil {
			it.err = deliver.Classify(err)
			continue
		}
		it.done = true
	}
}

// resolve fetches a claim-checked body from S3: only from the stack bucket,
// under the claim-check prefix of the stack and the envelope's job, and never more than the
// size the envelope declares (claimcheck.Fetch).
func (h *Handler) resolve(ctx context.Context, env *change.Envelope) *deliver.Error {
	b, err := claimcheck.Fetch(ctx, h.S3, env.DocRef, h.Config.Stack.Bucket, h.Config.Stack.Prefix, env.Job)
	if err != nil {
		return claimCheckError(err)
	}
	env.Doc = b
	return nil
}

// claimCheckError classifies a claimcheck.Fetch error: what claimcheck marks
// permanent goes to the DLQ at once with its reason, the rest is retried.
func claimCheckError(err error) *deliver.Error {
	for _, p := range []struct {
		sentinel error
		reason   string
	}{
		{claimcheck.ErrRefused, "claim_check_refused"},
		{claimcheck.ErrSize, "claim_check_size"},
		{claimcheck.ErrMissing, "claim_check_missing"},
		{claimcheck.ErrDenied, "claim_check_denied"},
	} {
		if errors.Is(err, p.sentinel) {
			return deliver.PermanentError(p.reason, err)
		}
	}
	return deliver.TransientError(reasonClaimCheck, err)
}

func (h *Handler) sink(ctx context.Context, r config.Route) (deliver.Sink, error) {
	key := outputKey(r.Job.ID, r.Output.ID)
	if s, ok := h.sinks.Load(key); ok {
		return s.(deliver.Sink), nil
	}
	s, err := h.Sinks(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("open output %s: %w", key, err)
	}
	// Two batches may open the same output at once: the first one kept wins.
	kept, _ := h.sinks.LoadOrStore(key, s)
	return kept.(deliver.Sink), nil
}

// toDLQ sends the original body to the route's DLQ with the failure reason in
// message attributes. The work-queue message is deleted only after this
// succeeded (the caller reports it handled).
func (b *batch) toDLQ(ctx context.Context, it *item, attempts int) error {
	url, err := b.h.queueURL(ctx, b.h.Config.DLQName(b.route.Job, b.route.Output))
	if err != nil {
		return err
	}
	now := b.h.Now.Now().UTC()
	first := now
	if ms, err := strconv.ParseInt(it.rec.Attributes["ApproximateFirstReceiveTimestamp"], 10, 64); err == nil {
		first = time.UnixMilli(ms).UTC()
	}
	rec := failure.Record{
		Class: string(it.err.Class), Reason: it.err.Reason, Error: it.err.Error(),
		HTTPStatus: it.err.HTTPStatus, SQLState: it.err.SQLState,
		Attempts: attempts, FirstAt: first, LastAt: now, Job: b.route.Job.ID, Output: b.route.Output.ID,
	}
	if it.env != nil {
		rec.DocID = b.h.ids().Show(it.env.DocID)
	}
	// A message redriven from the DLQ carries its earlier failure history.
	rec = rec.After(failure.Parse(failure.Values(it.rec.MessageAttributes, eventStringValue)))
	attrs := rec.Attributes()
	if _, err := b.h.SQS.SendMessage(ctx, it.resend(b.route, url, attrs, it.rec.MessageId)); err != nil {
		return fmt.Errorf("send to dlq: %w", err)
	}
	return nil
}

// resend returns the message that sends the body of it to the queue at url
// with attrs; on a FIFO output in its own group ("unknown" when it had
// none) with the deduplication id dedup.
func (it *item) resend(r config.Route, url string, attrs map[string]sqstypes.MessageAttributeValue, dedup string) *sqs.SendMessageInput {
	in := &sqs.SendMessageInput{QueueUrl: &url, MessageBody: aws.String(it.rec.Body), MessageAttributes: attrs}
	if r.Output.FIFO() {
		group := it.group
		if group == "" {
			group = "unknown"
		}
		in.MessageGroupId = aws.String(group)
		in.MessageDeduplicationId = aws.String(dedup)
	}
	return in
}

// queueURL resolves a queue name to its URL once per process.
func (h *Handler) queueURL(ctx context.Context, name string) (string, error) {
	if u, ok := h.urls.Load(name); ok {
		return u.(string), nil
	}
	out, err := h.SQS.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		return "", fmt.Errorf("get queue url %s: %w", name, err)
	}
	u := aws.ToString(out.QueueUrl)
	h.urls.Store(name, u)
	return u, nil
}

// pace sets the visibility of a transiently failed message to an exponential
// backoff of its receive count, so retries neither hammer a struggling output
// nor wait a whole visibility timeout. Best effort.
func (b *batch) pace(ctx context.Context, it *item, attempts int) {
	if it.rec.ReceiptHandle == "" {
		return
	}
	q, err := b.h.queueURL(ctx, b.h.Config.QueueName(b.route.Job, b.route.Output))
	if err != nil {
		return
	}
	delay := int32(math.Min(math.Pow(2, float64(attempts)), 300))
	_, _ = b.h.SQS.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: &q, ReceiptHandle: &it.rec.ReceiptHandle, VisibilityTimeout: delay,
	})
}

func (h *Handler) metricsOut() io.Writer {
	if h.Metrics == nil {
		return io.Discard
	}
	return h.Metrics
}

func receiveCount(m events.SQSMessage) int {
	n, err := strconv.Atoi(m.Attributes["ApproximateReceiveCount"])
	if err != nil || n < 1 {
		return 1
	}
	return n
}

func queueName(arn string) string {
	if i := strings.LastIndexByte(arn, ':'); i >= 0 {
		return arn[i+1:]
	}
	return arn
}

func eventStringValue(a events.SQSMessageAttribute) *string { return a.StringValue }
