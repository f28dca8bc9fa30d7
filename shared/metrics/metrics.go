// Package metrics writes CloudWatch Embedded Metric Format (EMF) records: one
// JSON line on standard output per flush, which CloudWatch Logs turns into
// metrics. No PutMetricData calls are made.
package metrics

import (
	"encoding/json"
	"io"
	"sort"
	"sync"
	"time"
)

// Namespace of every metric the functions emit.
const Namespace = "ChangesWorker"

// Metric names. The CDK stack builds its alarms and dashboard from these.
const (
	// Poller, dimension Job.
	ChangesRead          = "ChangesRead"
	DocumentsEnqueued    = "DocumentsEnqueued"
	BytesEnqueued        = "BytesEnqueued"
	BatchSize            = "BatchSize"
	PendingChanges       = "PendingChanges"
	LagSeconds           = "LagSeconds"
	CheckpointAgeSeconds = "CheckpointAgeSeconds"
	Checkpoints          = "Checkpoints"
	LeaseAcquired        = "LeaseAcquired"
	LeaseRenewed         = "LeaseRenewed"
	LeaseLost            = "LeaseLost"
	Failovers            = "Failovers"
	Handoffs             = "Handoffs"
	Role                 = "Role" // 1 active, 0 standby (high resolution)
	HeartbeatAgeSeconds  = "HeartbeatAgeSeconds"
	PollerErrors         = "PollerErrors"
	// MalformedRows counts feed rows that name no document, recorded in the
	// job's quarantine and skipped.
	MalformedRows = "MalformedRows"
	// MalformedPages counts failed reads of a page the poller is blocked on
	// (recorded in the job's quarantine), from the QuarantineAfter-th on.
	MalformedPages = "MalformedPages"

	// Attachment stage of the poller, dimension Job.
	AttachmentsUploaded     = "AttachmentsUploaded"
	AttachmentsPresent      = "AttachmentsPresent" // already in S3, not fetched
	AttachmentsSkipped      = "AttachmentsSkipped" // delivered without a copy, for whatever reason
	AttachmentBytesUploaded = "AttachmentBytesUploaded"
	// AttachmentsQuarantined counts the attachments delivered without a
	// copy because the copy cannot be made (content that does not match
	// its entry, an invalid entry, a refused object, a transfer given up),
	// each recorded in the job's quarantine.
	AttachmentsQuarantined = "AttachmentsQuarantined"

	// Writer, dimensions Job and Output.
	Delivered           = "Delivered"
	Superseded          = "Superseded"
	FailedTransient     = "FailedTransient"
	FailedPermanent     = "FailedPermanent"
	EndToEndLatencyMs   = "EndToEndLatency"
	WriterBatchFailures = "WriterBatchFailures"
	// OutputHalted is 1 when a writer halted a message group of an output
	// with on_failure halt (or tried its halted change again and failed),
	// and 0 once no group of the output is halted any more, from whichever
	// writer instance finds it so.
	OutputHalted = "OutputHalted"
	// OutputDown is 1 for every batch a writer found its output down (it
	// cannot be reached, refuses our credentials, cannot be opened, or
	// failed every change of the batch), 0 when it took changes again, from
	// the instance that saw the outage or one that found its record.
	OutputDown = "OutputDown"
	// MessagesHeld counts the messages held back for an output that is
	// down, at each hold; they do not count toward the DLQ.
	MessagesHeld = "MessagesHeld"

	// Backpressure, writer, dimensions Job and Output.
	BackpressureActive       = "BackpressureActive"       // 1 while the output is struggling, 0 otherwise (one value per batch)
	BackpressureDelays       = "BackpressureDelays"       // messages held back for the output
	BackpressureDelaySeconds = "BackpressureDelaySeconds" // how long each was held back

	// Output requests, writer, dimensions Job and Output: "their
	// credentials".
	OutputRequests     = "OutputRequests"     // requests to the output (one per document, or per PostgreSQL batch)
	OutputAuthFailures = "OutputAuthFailures" // 401/403, S3 AccessDenied, SQLSTATE 28P01/28000
	OutputRequestTime  = "OutputRequestTime"  // milliseconds per request

	// DLQ archive, poller, dimensions Job and Output: at every sweep of the
	// output's DLQ, while its archive holds messages, how many and how long
	// ago the one queued first was queued.
	ArchivedMessages = "ArchivedMessages"
	ArchiveOldestAge = "ArchiveOldestAge"

	// Source requests and floods, poller, dimension Job: "our credentials".
	SourceRequests     = "SourceRequests"     // requests to the source
	SourceAuthFailures = "SourceAuthFailures" // 401/403 from the source
	SourceRequestTime  = "SourceRequestTime"  // milliseconds per request (a _changes long-poll included)
	LargestBatch       = "LargestBatch"       // changes read by one poller invocation (Maximum: largest seen)
	FloodBatches       = "FloodBatches"       // invocations that read more than feed.flood_threshold changes
)

// Unit of a value.
type Unit string

const (
	Count        Unit = "Count"
	Seconds      Unit = "Seconds"
	Milliseconds Unit = "Milliseconds"
	Bytes        Unit = "Bytes"
	None         Unit = "None"
)

type value struct {
	unit    Unit
	highRes bool
	values  []float64
}

// Recorder accumulates values for one set of dimensions and writes them as one
// EMF record on Flush. Safe for concurrent use.
type Recorder struct {
	w    io.Writer
	dims map[string]string
	now  func() time.Time

	mu     sync.Mutex
	values map[string]*value
}

// New returns a recorder writing to w with the given dimensions (for example
// {"Job": "orders"}).
func New(w io.Writer, dims map[string]string) *Recorder {
	return &Recorder{w: w, dims: dims, now: time.Now, values: map[string]*value{}}
}

// Add records one value of a metric.
func (r *Recorder) Add(name string, v float64, unit Unit) { r.add(name, v, unit, false) }

// AddHighRes records one value of a metric stored at 1-second resolution.
func (r *Recorder) AddHighRes(name string, v float64, unit Unit) { r.add(name, v, unit, true) }

func (r *Recorder) add(name string, v float64, unit Unit, highRes bool) {
	r.update(name, unit, highRes, func(m *value) { m.values = append(m.values, v) })
}

// Sum adds v to the one value a metric holds until the next flush: for
// counts of frequent events, so a record stays within EMF's 100 values.
func (r *Recorder) Sum(name string, v float64, unit Unit) {
	r.update(name, unit, false, func(m *value) {
		if len(m.values) == 0 {
			m.values = []float64{v}
			return
		}
		m.values[len(m.values)-1] += v
	})
}

// update applies f, under the lock, to the metric's values, created with
// unit and resolution on first use. A nil recorder records nothing.
func (r *Recorder) update(name string, unit Unit, highRes bool, f func(*value)) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.values[name]
	if m == nil {
		m = &value{unit: unit, highRes: highRes}
		r.values[name] = m
	}
	f(m)
}

// Discard drops the values of the named metrics recorded since the last
// flush, by whoever recorded them.
func (r *Recorder) Discard(names ...string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range names {
		delete(r.values, n)
	}
}

// maxValues is how many values of one metric an EMF record may carry.
const maxValues = 100

// Flush writes the accumulated values as EMF records and clears them: one
// record, or more when a metric holds more than 100 values. It writes
// nothing when no value was recorded.
func (r *Recorder) Flush() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	vals := r.values
	r.values = map[string]*value{}
	r.mu.Unlock()
	for len(vals) > 0 {
		part := map[string]*value{}
		for n, v := range vals {
			k := min(len(v.values), maxValues)
			part[n] = &value{unit: v.unit, highRes: v.highRes, values: v.values[:k]}
			if k == len(v.values) {
				delete(vals, n)
			} else {
				v.values = v.values[k:]
			}
		}
		if err := r.write(part); err != nil {
			return err
		}
	}
	return nil
}

// write writes one EMF record of vals.
func (r *Recorder) write(vals map[string]*value) error {
	names := make([]string, 0, len(vals))
	for n := range vals {
		names = append(names, n)
	}
	sort.Strings(names)
	dimKeys := make([]string, 0, len(r.dims))
	for k := range r.dims {
		dimKeys = append(dimKeys, k)
	}
	sort.Strings(dimKeys)

	type def struct {
		Name              string `json:"Name"`
		Unit              Unit   `json:"Unit"`
		StorageResolution int    `json:"StorageResolution,omitempty"`
	}
	defs := make([]def, 0, len(names))
	rec := map[string]any{}
	for k, v := range r.dims {
		rec[k] = v
	}
	for _, n := range names {
		v := vals[n]
		d := def{Name: n, Unit: v.unit}
		if v.highRes {
			d.StorageResolution = 1
		}
		defs = append(defs, d)
		if len(v.values) == 1 {
			rec[n] = v.values[0]
		} else {
			rec[n] = v.values
		}
	}
	rec["_aws"] = map[string]any{
		"Timestamp": r.now().UnixMilli(),
		"CloudWatchMetrics": []any{map[string]any{
			"Namespace":  Namespace,
			"Dimensions": [][]string{dimKeys},
			"Metrics":    defs,
		}},
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err = r.w.Write(b)
	return err
}
