// Package fanout sends change envelopes to the work queues of a job's outputs
// with SendMessageBatch, putting bodies too large for a message in S3 (claim
// check). A Send succeeds only when SQS accepted every entry.
//
// The requests of one Send run concurrently, the claim checks first, then
// the batches of every output; a Sender has at most Sender.Concurrency
// requests in flight, across the Sends it runs at once. Changes of
// one document bound for a FIFO queue are sent in their order (see Send).
package fanout

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"golang.org/x/sync/errgroup"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
)

// SQS is the part of the SQS client the sender calls. It must be safe for
// concurrent use (the SDK's client is).
type SQS interface {
	SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, optFns ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
}

// S3 is the part of the S3 client the sender calls. It must be safe for
// concurrent use (the SDK's client is).
type S3 interface {
	PutObject(ctx context.Context, in *s3.PutObjectInput, optFns ...func(*s3.Options)) (*s3.PutObjectOutput, error)
}

// Target is one output's work queue.
type Target struct {
	Output   string
	QueueURL string
	FIFO     bool
	// Total puts every message of a FIFO queue in one message group named
	// after the output (ordering total), so the writer sees the whole feed in
	// order; otherwise each document has its own group.
	Total bool
	// Epoch is the job's replay epoch (lease.State.ReplayEpoch), part of
	// every FIFO deduplication id: changes queued again after an operator
	// set the checkpoint back are not taken for repeats.
	Epoch int64
}

// NewTarget is the target of an output's work queue at url.
func NewTarget(o *config.Output, url string) Target {
	return Target{Output: o.ID, QueueURL: url, FIFO: o.FIFO(), Total: o.Ordering == config.OrderingTotal}
}

// Group is the FIFO message group of a change of document docID on t: the
// output's single group when t.Total, else the document's.
func (t Target) Group(docID string) string {
	if t.Total {
		return GroupID(t.Output)
	}
	return GroupID(docID)
}

// DefaultConcurrency is how many requests a Sender keeps in flight when
// Sender.Concurrency is zero: config.DefaultSendConcurrency, the poller's
// default.
const DefaultConcurrency = config.DefaultSendConcurrency

// Sender sends envelopes. Safe for concurrent use.
type Sender struct {
	SQS    SQS
	S3     S3
	Bucket string
	// Stack is the stack's prefix, which claim-check keys start with
	// (claimcheck.Key); required to send a body as a claim check.
	Stack string
	// MaxBytes is the largest message body; larger envelopes carry an S3
	// pointer. It also bounds the bodies of one SendMessageBatch.
	MaxBytes int
	// Attempts bounds the retries of entries SQS did not accept. Default 5.
	Attempts int
	// Concurrency bounds the SQS and S3 requests the Sender has in flight,
	// across concurrent Sends. Default DefaultConcurrency.
	Concurrency int
	// Backoff is the wait before the first retry of entries SQS did not
	// accept; it doubles for every further retry. Default 100ms.
	Backoff time.Duration

	slotsOnce sync.Once
	slots     chan struct{} // one token per request in flight
}

// ErrRejected is returned when SQS refuses entries for a reason retrying
// cannot fix (SenderFault), or keeps failing them.
var ErrRejected = errors.New("sqs rejected entries")

// batchLimit is SQS's cap on entries per SendMessageBatch.
const batchLimit = 10

// Fence is called before every SQS request; a non-nil error stops the send
// (the poller's lease may have expired). One Send calls it from one
// goroutine at a time, so it may renew the lease in place; a caller that
// runs Sends side by side serializes its fence across them.
type Fence func() error

// Stats describes what a Send queued.
type Stats struct {
	Messages   int
	Bytes      int
	ClaimCheck int
	Requests   int // SendMessageBatch requests, retries included
	Puts       int // claim checks put in S3
}

// Send queues every change to every target. Changes carry everything but the
// Output field, which Send fills per target; changes are numbered in the
// order given (their counters), which is the order of the feed.
//
// Requests run concurrently, at most Concurrency at a time. On a FIFO target,
// SQS keeps the order of messages of one group only among requests that do
// not overlap. So on a per-document target, the changes of a document that
// appears more than once are sent in waves: its first change in the first
// wave, its second in the second, and so on, each wave starting once the
// previous one was accepted. On a target with ordering total (one group),
// the requests go one after another, in feed order, beside the others.
//
// Send returns nil only when SQS accepted every entry. On error some entries
// may have been queued and others not, in any order: the caller must not
// record any of the changes as queued. Sending them again is harmless: FIFO
// queues deduplicate and sinks apply changes monotonically.
func (s *Sender) Send(ctx context.Context, targets []Target, changes []*change.Envelope, fence Fence) (Stats, error) {
	var st Stats
	if len(targets) == 0 || len(changes) == 0 {
		return st, nil
	}
	run := &send{s: s, fence: fence}
	enc, err := run.encode(ctx, targets, changes)
	if err != nil {
		return run.stats(), err
	}
	for _, wave := range s.waves(targets, changes, enc) {
		if err := run.lanes(ctx, wave); err != nil {
			return run.stats(), err
		}
	}
	return run.stats(), nil
}

// send is the state of one Send shared by its goroutines.
type send struct {
	s *Sender

	fenceMu sync.Mutex
	fence   Fence

	mu sync.Mutex
	st Stats
}

func (r *send) stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st
}

func (r *send) add(f func(*Stats)) {
	r.mu.Lock()
	f(&r.st)
	r.mu.Unlock()
}

// askFence asks the caller's fence, one goroutine at a time.
func (r *send) askFence() error {
	r.fenceMu.Lock()
	defer r.fenceMu.Unlock()
	return r.fence()
}

func (s *Sender) limit() int {
	if s.Concurrency > 0 {
		return s.Concurrency
	}
	return DefaultConcurrency
}

// request runs one SQS or S3 request once fewer than limit are in flight.
func (s *Sender) request(ctx context.Context, f func() error) error {
	s.slotsOnce.Do(func() { s.slots = make(chan struct{}, s.limit()) })
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("wait for a request slot: %w", ctx.Err())
	}
	defer func() { <-s.slots }()
	return f()
}

// encoded is one change's message body with the output left out: the body of
// an output is head + `"output":"<id>"` + tail.
type encoded struct {
	head, tail []byte
	claim      bool // the body travels as a claim check
}

func (e encoded) body(output []byte) string {
	var b strings.Builder
	b.Grow(len(e.head) + len(output) + len(e.tail))
	b.Write(e.head)
	b.Write(output)
	b.Write(e.tail)
	return b.String()
}

// outputField is how the envelope's empty Output field encodes.
var outputField = []byte(`"output":""`)

// encode encodes every change once, with the output left out, and puts the
// bodies of those whose envelope would not fit a message (for the longest
// output name) in S3, concurrently.
func (r *send) encode(ctx context.Context, targets []Target, changes []*change.Envelope) ([]encoded, error) {
	longest := 0
	for _, t := range targets {
		longest = max(longest, len(outputJSON(t.Output)))
	}
	enc := make([]encoded, len(changes))
	var big []int
	for i, c := range changes {
		e, err := split(c)
		if err != nil {
			return nil, err
		}
		enc[i] = e
		if len(e.head)+longest+len(e.tail) > r.s.MaxBytes && c.Doc != nil {
			big = append(big, i)
		}
	}
	if len(big) == 0 {
		return enc, nil
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.s.limit())
	refs := make([]*change.ObjectRef, len(big))
	for k, i := range big {
		g.Go(func() error {
			return r.s.request(gctx, func() error {
				ref, put, err := r.s.claimCheck(gctx, changes[i])
				refs[k] = ref
				if put {
					r.add(func(st *Stats) { st.Puts++ })
				}
				return err
			})
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for k, i := range big {
		c := *changes[i]
		c.Doc, c.DocRef = nil, refs[k]
		e, err := split(&c)
		if err != nil {
			return nil, err
		}
		e.claim = true
		enc[i] = e
		// Later Sends of the same change (a retry) reuse the object.
		changes[i].DocRef = refs[k]
	}
	return enc, nil
}

// envelopeFields is about what an envelope's JSON holds besides its
// strings and raw values: names, punctuation, numbers, the time.
const envelopeFields = 160

// split encodes a change with an empty Output and cuts it where the output
// goes. The field is the third of the envelope, after "v" and "job", whose
// values cannot contain it, so its first occurrence is the field itself.
func split(c *change.Envelope) (encoded, error) {
	env := *c
	env.Output = ""
	b, err := env.AppendJSON(make([]byte, 0, len(c.Job)+len(c.DocID)+len(c.Rev)+len(c.Seq)+len(c.Doc)+envelopeFields))
	if err != nil {
		return encoded{}, fmt.Errorf("encode envelope %s: %w", c.DocID, err)
	}
	i := bytes.Index(b, outputField)
	if i < 0 {
		return encoded{}, fmt.Errorf("encode envelope %s: no output field in %.40q", c.DocID, b)
	}
	j := i + len(`"output":`)
	return encoded{head: b[:j], tail: b[j+len(`""`):]}, nil
}

func outputJSON(output string) []byte {
	b, _ := json.Marshal(output) // a string always encodes
	return b
}

// claimCheck puts the change's body in S3 once (the key depends only on the
// change, so every output's envelope points at the same object). It reports
// whether it put an object.
func (s *Sender) claimCheck(ctx context.Context, c *change.Envelope) (*change.ObjectRef, bool, error) {
	if c.DocRef != nil {
		return c.DocRef, false, nil
	}
	if s.Stack == "" {
		return nil, false, fmt.Errorf("put claim check of %s: the sender has no stack prefix", c.DocID)
	}
	key := claimcheck.Key(s.Stack, c.Job, c.Version)
	_, err := s.S3.PutObject(ctx, &s3.PutObjectInput{
		Bucket:      &s.Bucket,
		Key:         &key,
		Body:        bytes.NewReader(c.Doc),
		ContentType: aws.String("application/json"),
	})
	if err != nil {
		return nil, false, fmt.Errorf("put claim check %s: %w", key, err)
	}
	return &change.ObjectRef{Bucket: s.Bucket, Key: key, Size: int64(len(c.Doc))}, true, nil
}

// batch is one SendMessageBatch request's worth of entries for one target.
type batch struct {
	t       Target
	entries []sqstypes.SendMessageBatchRequestEntry
	claims  int // entries carrying a claim check
}

// lane is a sequence of requests sent one after another, in order; the
// lanes of a wave run concurrently.
type lane []batch

// waves builds the requests: per target, entries grouped into batches of at
// most ten entries and MaxBytes of bodies, in feed order. Standard queues
// need one wave of one-request lanes. On a per-document FIFO queue the k-th
// change of a document goes in wave k, so that no two requests in flight
// together hold the same group. A FIFO queue with ordering total has one
// group: all its requests form one lane, in feed order.
func (s *Sender) waves(targets []Target, changes []*change.Envelope, enc []encoded) [][]lane {
	// wave[i] is the number of earlier changes of change i's document, on
	// a per-document FIFO queue.
	var wave []int
	waves := 1
	for _, t := range targets {
		if t.FIFO && !t.Total {
			wave = make([]int, len(changes))
			seen := make(map[string]int, len(changes))
			for i, c := range changes {
				wave[i] = seen[c.DocID]
				seen[c.DocID]++
				waves = max(waves, wave[i]+1)
			}
			break
		}
	}
	out := make([][]lane, waves)
	// The entries of change i on every target have the id ids[i].
	ids := make([]string, len(changes))
	all := make([]int, len(changes))
	for i := range all {
		ids[i], all[i] = strconv.Itoa(i), i
	}
	for _, t := range targets {
		output := outputJSON(t.Output)
		switch {
		case t.FIFO && t.Total:
			out[0] = append(out[0], lane(s.chunks(t, changes, enc, ids, output, all)))
		case t.FIFO:
			per := make([][]int, waves)
			for i := range changes {
				per[wave[i]] = append(per[wave[i]], i)
			}
			for w, idx := range per {
				for _, b := range s.chunks(t, changes, enc, ids, output, idx) {
					out[w] = append(out[w], lane{b})
				}
			}
		default:
			for _, b := range s.chunks(t, changes, enc, ids, output, all) {
				out[0] = append(out[0], lane{b})
			}
		}
	}
	return out
}

// chunks groups the entries of changes idx for target t into batches of at
// most ten entries and at most MaxBytes of bodies. The strings the entries
// point at are allocated together, per call.
func (s *Sender) chunks(t Target, changes []*change.Envelope, enc []encoded, ids []string, output []byte, idx []int) []batch {
	perEntry := 1 // the body; on a FIFO queue also the group and the deduplication id
	if t.FIFO {
		perEntry = 3
	}
	strs := make([]string, len(idx)*perEntry)
	entries := make([]sqstypes.SendMessageBatchRequestEntry, len(idx))
	var out []batch
	cur := batch{t: t}
	first, size := 0, 0 // the current batch is entries[first:k]
	for k, i := range idx {
		body := &strs[k*perEntry]
		*body = enc[i].body(output)
		if n := k - first; n == batchLimit || (n > 0 && size+len(*body) > s.MaxBytes) {
			cur.entries = entries[first:k:k]
			out = append(out, cur)
			cur, first, size = batch{t: t}, k, 0
		}
		e := &entries[k]
		e.Id, e.MessageBody = &ids[i], body
		if t.FIFO {
			c := changes[i]
			group, dedup := &strs[k*perEntry+1], &strs[k*perEntry+2]
			*group = t.Group(c.DocID)
			*dedup = DeduplicationID(c.Job, t.Output, c.DocID, c.Seq, t.Epoch)
			e.MessageGroupId, e.MessageDeduplicationId = group, dedup
		}
		if enc[i].claim {
			cur.claims++
		}
		size += len(*body)
	}
	if first < len(idx) {
		cur.entries = entries[first:len(idx):len(idx)]
		out = append(out, cur)
	}
	return out
}

// lanes sends the lanes of one wave concurrently, each lane's requests in
// order, and returns when every request was accepted, or with the first
// error (the others are cancelled).
func (r *send) lanes(ctx context.Context, ls []lane) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.s.limit())
	for _, l := range ls {
		g.Go(func() error {
			for _, b := range l {
				if err := r.sendBatch(gctx, b.t, b.entries); err != nil {
					return err
				}
				n := 0
				for _, e := range b.entries {
					n += len(aws.ToString(e.MessageBody))
				}
				r.add(func(st *Stats) {
					st.Messages += len(b.entries)
					st.Bytes += n
					st.ClaimCheck += b.claims
				})
			}
			return nil
		})
	}
	return g.Wait()
}

// sendBatch sends one request's entries, retrying the entries SQS did not
// accept; the fence is asked before every request, retries included.
func (r *send) sendBatch(ctx context.Context, t Target, entries []sqstypes.SendMessageBatchRequestEntry) error {
	attempts := r.s.Attempts
	if attempts == 0 {
		attempts = 5
	}
	backoff := r.s.Backoff
	if backoff == 0 {
		backoff = 100 * time.Millisecond
	}
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("send message batch to %s: %w", t.Output, err)
		}
		var out *sqs.SendMessageBatchOutput
		err := r.s.request(ctx, func() error {
			// The fence is asked once the request has its slot, just
			// before it goes.
			if err := r.askFence(); err != nil {
				return err
			}
			r.add(func(st *Stats) { st.Requests++ })
			var err error
			in := &sqs.SendMessageBatchInput{QueueUrl: &t.QueueURL, Entries: entries}
			if out, err = r.s.SQS.SendMessageBatch(ctx, in, requestOptions(in)); err != nil {
				return fmt.Errorf("send message batch to %s: %w", t.Output, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if len(out.Failed) == 0 {
			return nil
		}
		byID := make(map[string]sqstypes.SendMessageBatchRequestEntry, len(entries))
		for _, e := range entries {
			byID[aws.ToString(e.Id)] = e
		}
		var retry []sqstypes.SendMessageBatchRequestEntry
		for _, f := range out.Failed {
			if f.SenderFault {
				return fmt.Errorf("send message batch to %s: %w: %s %s", t.Output, ErrRejected, aws.ToString(f.Code), aws.ToString(f.Message))
			}
			retry = append(retry, byID[aws.ToString(f.Id)])
		}
		if attempt >= attempts {
			f := out.Failed[0]
			return fmt.Errorf("send message batch to %s: %w: %d entries still failing after %d attempts: %s", t.Output, ErrRejected, len(retry), attempt, aws.ToString(f.Code))
		}
		// On a FIFO queue the retried entries keep their order: SQS lists
		// failures in any order, the request must list them as sent.
		entries = inOrder(entries, retry)
		if err := clock.Sleep(ctx, backoff); err != nil {
			return fmt.Errorf("send message batch to %s: %w", t.Output, err)
		}
		backoff *= 2
	}
}

// inOrder returns the entries of subset in the order they have in all.
func inOrder(all, subset []sqstypes.SendMessageBatchRequestEntry) []sqstypes.SendMessageBatchRequestEntry {
	want := make(map[string]bool, len(subset))
	for _, e := range subset {
		want[aws.ToString(e.Id)] = true
	}
	out := make([]sqstypes.SendMessageBatchRequestEntry, 0, len(subset))
	for _, e := range all {
		if want[aws.ToString(e.Id)] {
			out = append(out, e)
		}
	}
	return out
}

// hashedGroup prefixes the hashed form of a group id.
const hashedGroup = "sha256:"

// GroupID is the FIFO message group of a document: the id itself when SQS
// accepts it (at most 128 printable ASCII characters), otherwise
// "sha256:" and the hex SHA-256 of the id. An id that itself begins with
// "sha256:" is always hashed, so the two forms never meet: no document can
// name itself into another's group (whose failure, with on_failure halt,
// would then halt it). The plain form is kept for every other id, so the
// groups of messages already queued do not change.
func GroupID(docID string) string {
	if len(docID) <= 128 && printableASCII(docID) && !strings.HasPrefix(docID, hashedGroup) {
		return docID
	}
	sum := sha256.Sum256([]byte(docID))
	return hashedGroup + hex.EncodeToString(sum[:])
}

// DeduplicationID identifies one change on one output within a replay
// epoch: the seq, not the rev, because the same revision can legitimately
// become the winner again. Within an epoch, a change sent again (a retry, or
// a failover's replay) is dropped by SQS for five minutes; a checkpoint set
// back by an operator starts a new epoch, whose changes are delivered. Epoch
// zero (never set back) gives the ids of before epochs existed.
func DeduplicationID(job, output, docID string, seq json.RawMessage, epoch int64) string {
	h := sha256.New()
	parts := []string{job, output, docID, string(seq)}
	if epoch != 0 {
		parts = append(parts, strconv.FormatInt(epoch, 10))
	}
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return s != ""
}
