// Package fanout sends change envelopes to the work queues of a job's outputs
// with SendMessageBatch, putting bodies too large for a message in S3 (claim
// check). A Send succeeds only when SQS accepted every entry.
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
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/config"
)

// SQS is the part of the SQS client the sender calls.
type SQS interface {
	SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, optFns ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
}

// S3 is the part of the S3 client the sender calls.
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
}

// NewTarget is the target of an output's work queue at url.
func NewTarget(o *config.Output, url string) Target {
	return Target{Output: o.ID, QueueURL: url, FIFO: o.FIFO(), Total: o.Ordering == config.OrderingTotal}
}

// Sender sends envelopes. Safe for concurrent use.
type Sender struct {
	SQS    SQS
	S3     S3
	Bucket string
	// MaxBytes is the largest message body; larger envelopes carry an S3 pointer.
	MaxBytes int
	// Attempts bounds the retries of entries SQS did not accept. Default 5.
	Attempts int
}

// ErrRejected is returned when SQS refuses entries for a reason retrying
// cannot fix (SenderFault), or keeps failing them.
var ErrRejected = errors.New("sqs rejected entries")

// batchLimit is SQS's cap on entries per SendMessageBatch.
const batchLimit = 10

// Fence is called before every SQS request; a non-nil error stops the send
// (the poller's lease may have expired).
type Fence func() error

// Stats describes what a Send queued.
type Stats struct {
	Messages   int
	Bytes      int
	ClaimCheck int
}

// Send queues every change to every target. Changes carry everything but the
// Output field, which Send fills per target. It returns nil only when SQS
// accepted every entry; on error some entries may have been queued, which is
// harmless: FIFO queues deduplicate and sinks apply changes monotonically.
func (s *Sender) Send(ctx context.Context, targets []Target, changes []*change.Envelope, fence Fence) (Stats, error) {
	var st Stats
	for _, t := range targets {
		entries, err := s.entries(ctx, t, changes, &st)
		if err != nil {
			return st, err
		}
		for _, chunk := range s.chunks(entries) {
			if err := s.sendBatch(ctx, t, chunk, fence); err != nil {
				return st, err
			}
			for _, e := range chunk {
				st.Messages++
				st.Bytes += len(aws.ToString(e.MessageBody))
			}
		}
	}
	return st, nil
}

func (s *Sender) entries(ctx context.Context, t Target, changes []*change.Envelope, st *Stats) ([]sqstypes.SendMessageBatchRequestEntry, error) {
	entries := make([]sqstypes.SendMessageBatchRequestEntry, 0, len(changes))
	for i, c := range changes {
		env := *c
		env.Output = t.Output
		body, err := json.Marshal(&env)
		if err != nil {
			return nil, fmt.Errorf("encode envelope %s: %w", c.DocID, err)
		}
		if len(body) > s.MaxBytes {
			ref, err := s.claimCheck(ctx, c)
			if err != nil {
				return nil, err
			}
			env.Doc, env.DocRef = nil, ref
			if body, err = json.Marshal(&env); err != nil {
				return nil, fmt.Errorf("encode envelope %s: %w", c.DocID, err)
			}
			st.ClaimCheck++
		}
		e := sqstypes.SendMessageBatchRequestEntry{
			Id:          aws.String(strconv.Itoa(i)),
			MessageBody: aws.String(string(body)),
		}
		if t.FIFO {
			group := c.DocID
			if t.Total {
				group = t.Output
			}
			e.MessageGroupId = aws.String(GroupID(group))
			e.MessageDeduplicationId = aws.String(DeduplicationID(c.Job, t.Output, c.DocID, c.Seq))
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// claimCheck puts the change's body in S3 once (the key depends only on the
// change, so every output's envelope points at the same object).
func (s *Sender) claimCheck(ctx context.Context, c *change.Envelope) (*change.ObjectRef, error) {
	if c.DocRef != nil {
		return c.DocRef, nil
	}
	key := claimcheck.Key(c.Job, c.Version)
	_, err := s.S3.PutObject(ctx, &s3.PutObjectInput{
		Bucket:      &s.Bucket,
		Key:         &key,
		Body:        bytes.NewReader(c.Doc),
		ContentType: aws.String("application/json"),
	})
	if err != nil {
		return nil, fmt.Errorf("put claim check %s: %w", key, err)
	}
	c.DocRef = &change.ObjectRef{Bucket: s.Bucket, Key: key, Size: int64(len(c.Doc))}
	return c.DocRef, nil
}

// chunks groups entries into SendMessageBatch requests of at most ten entries
// and at most MaxBytes of bodies.
func (s *Sender) chunks(entries []sqstypes.SendMessageBatchRequestEntry) [][]sqstypes.SendMessageBatchRequestEntry {
	var out [][]sqstypes.SendMessageBatchRequestEntry
	var cur []sqstypes.SendMessageBatchRequestEntry
	size := 0
	for _, e := range entries {
		n := len(aws.ToString(e.MessageBody))
		if len(cur) == batchLimit || (len(cur) > 0 && size+n > s.MaxBytes) {
			out = append(out, cur)
			cur, size = nil, 0
		}
		cur = append(cur, e)
		size += n
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// sendBatch sends one request's entries, retrying the entries SQS did not
// accept; the fence is asked before every request, retries included.
func (s *Sender) sendBatch(ctx context.Context, t Target, entries []sqstypes.SendMessageBatchRequestEntry, fence Fence) error {
	attempts := s.Attempts
	if attempts == 0 {
		attempts = 5
	}
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		if err := fence(); err != nil {
			return err
		}
		out, err := s.SQS.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: &t.QueueURL, Entries: entries})
		if err != nil {
			return fmt.Errorf("send message batch to %s: %w", t.Output, err)
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
		entries = retry
		select {
		case <-ctx.Done():
			return fmt.Errorf("send message batch to %s: %w", t.Output, ctx.Err())
		case <-time.After(backoff):
		}
		backoff *= 2
	}
}

// GroupID is the FIFO message group of a document: the id itself when SQS
// accepts it (at most 128 printable ASCII characters), otherwise a hash of it.
func GroupID(docID string) string {
	if len(docID) <= 128 && printableASCII(docID) {
		return docID
	}
	sum := sha256.Sum256([]byte(docID))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// DeduplicationID identifies one change on one output: the seq, not the rev,
// because the same revision can legitimately become the winner again.
func DeduplicationID(job, output, docID string, seq json.RawMessage) string {
	h := sha256.New()
	for _, p := range []string{job, output, docID, string(seq)} {
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
