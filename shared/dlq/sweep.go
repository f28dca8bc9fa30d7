package dlq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/statetable"
)

// Sweeper moves the messages of one DLQ that have waited After since they
// were queued into the DLQ's archive, before SQS's retention drops them.
//
// A message is written to the archive before it is deleted from the DLQ,
// so a sweep that dies between the two leaves it in both places: the next
// sweep writes the same object again and deletes it, and a redrive of
// both sends it once (the journal knows it by its DLQ message id) or, at
// worst, twice, which the output ignores (same version).
type Sweeper struct {
	SQS     SQS
	Archive *Archive
	// DLQURL and DLQName are the DLQ's.
	DLQURL, DLQName string
	// After is the age, from the message's SentTimestamp, at which it is
	// archived (stack.dlq.archive_after). SQS keeps that timestamp when its
	// redrive policy moves a message to a standard DLQ, and drops the
	// message its retention after it; on a FIFO DLQ its retention counts
	// from the move, so the age is a bound from above there.
	After time.Duration
	// Max bounds the messages one sweep receives; 0 means DefaultScanMax.
	Max int
	Log *slog.Logger
	Now clock.Clock // zero: the system clock
}

// SweepResult is what a sweep did.
type SweepResult struct {
	// Archived messages moved from the DLQ to the archive.
	Archived int
	// Kept messages received and left in the DLQ, younger than After.
	Kept int
}

// sweepVisibility hides each message a sweep received until it is
// archived, or until the sweep ends and makes it visible again.
const sweepVisibility = 60 * time.Second

func (s *Sweeper) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.New(slog.DiscardHandler)
}

// Sweep archives the DLQ's messages that have waited After. It receives every visible message once (up to Max): those it
// does not archive are hidden from other readers (a redrive, changesctl
// dlq list) while it runs, and each DLQ receive count goes up by one, which
// nothing reads but changesctl dlq show. A message that cannot be archived
// stays in the DLQ, for the next sweep; the error says why. Safe for
// concurrent use: concurrent sweeps receive different messages.
func (s *Sweeper) Sweep(ctx context.Context) (SweepResult, error) {
	var res SweepResult
	depth, err := QueueDepth(ctx, s.SQS, s.DLQURL)
	if err != nil {
		return res, fmt.Errorf("sweep %s: %w", s.DLQName, err)
	}
	if depth.Visible > 0 {
		err = s.move(ctx, &res)
	}
	if res.Archived > 0 {
		s.log().Info("dlq messages archived", "dlq", s.DLQName, "archived", res.Archived, "kept", res.Kept, "archive", s.Archive.Location())
	}
	return res, err
}

// move receives the DLQ's visible messages and archives those due.
func (s *Sweeper) move(ctx context.Context, res *SweepResult) error {
	limit := s.Max
	if limit <= 0 {
		limit = DefaultScanMax
	}
	seen := map[string]bool{}
	var held []sqstypes.Message
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := release(rctx, s.SQS, s.DLQURL, held); err != nil {
			s.log().Warn("dlq messages stay hidden until their visibility timeout", "dlq", s.DLQName, "error", err)
		}
	}()
	var errs []error
	for len(seen) < limit && ctx.Err() == nil {
		out, err := s.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    &s.DLQURL,
			MaxNumberOfMessages:         int32(min(10, limit-len(seen))),
			WaitTimeSeconds:             1,
			VisibilityTimeout:           int32(sweepVisibility / time.Second),
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
			MessageAttributeNames:       []string{"All"},
		})
		if err != nil {
			return errors.Join(append(errs, fmt.Errorf("receive from dlq %s: %w", s.DLQName, err))...)
		}
		if len(out.Messages) == 0 {
			break
		}
		var archived []sqstypes.Message
		for _, raw := range out.Messages {
			id := aws.ToString(raw.MessageId)
			if seen[id] {
				// Received again: its visibility ran out during the sweep.
				held = append(held, raw)
				continue
			}
			seen[id] = true
			m := Decode(raw)
			now := s.Now.Now()
			if now.Sub(m.SentAt) < s.After {
				held = append(held, raw)
				res.Kept++
				continue
			}
			if _, err := s.Archive.Put(ctx, &m, s.DLQName, now); err != nil {
				errs = append(errs, err)
				held = append(held, raw)
				continue
			}
			archived = append(archived, raw)
		}
		n, err := s.delete(ctx, archived)
		res.Archived += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// delete removes archived messages from the DLQ and returns how many went.
// One that is not deleted comes back after its visibility timeout, and the
// next sweep archives it again, to the same object.
func (s *Sweeper) delete(ctx context.Context, msgs []sqstypes.Message) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	entries := make([]sqstypes.DeleteMessageBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		entries[i] = sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
	}
	out, err := s.SQS.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: &s.DLQURL, Entries: entries})
	if err != nil {
		return 0, fmt.Errorf("delete archived messages from dlq %s: %w", s.DLQName, err)
	}
	for _, f := range out.Failed {
		s.log().Warn("an archived message stays in the dlq until the next sweep", "dlq", s.DLQName, "code", aws.ToString(f.Code))
	}
	return len(out.Successful), nil
}

// SweepKey is the state table item that records when job's DLQs were last
// swept. Job ids contain no '/', so it never meets a job item.
func SweepKey(job string) string { return "dlq-archive/" + job }

// ClaimDB is the DynamoDB call SweepClaim makes.
type ClaimDB interface {
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
}

// SweepClaim lets one poller invocation of a job sweep its DLQs at a time,
// at most once an interval, whichever invocation asks first: the job's
// item SweepKey in the state table holds when the last sweep began. Safe
// for concurrent use.
type SweepClaim struct {
	DB    ClaimDB
	Table string
	Job   string
	Now   clock.Clock // zero: the system clock
}

// sweptAt is the claim item's attribute: Unix milliseconds.
const sweptAt = "swept_at"

// Take claims a sweep when none began in the last every (less a tenth, for
// the invocations' timers) and reports whether the caller got it.
func (c *SweepClaim) Take(ctx context.Context, every time.Duration) (bool, error) {
	now := c.Now.Now()
	due := now.Add(-every + every/10)
	_, err := c.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                &c.Table,
		Key:                      statetable.Key(SweepKey(c.Job)),
		UpdateExpression:         aws.String("SET #at = :now"),
		ConditionExpression:      aws.String("attribute_not_exists(#at) OR #at <= :due"),
		ExpressionAttributeNames: map[string]string{"#at": sweptAt},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":now": statetable.Num(now.UnixMilli()), ":due": statetable.Num(due.UnixMilli()),
		},
	})
	var taken *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &taken):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("claim the dlq sweep of %s: %w", c.Job, err)
	}
	return true, nil
}
