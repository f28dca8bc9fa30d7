package dlq

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/statetable"
)

// DynamoDB is the part of the DynamoDB client the journal calls.
type DynamoDB interface {
	BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	BatchWriteItem(ctx context.Context, in *dynamodb.BatchWriteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error)
}

// State is what the journal knows about one DLQ message.
type State string

const (
	// Unknown: no entry; the message was never sent by a redrive.
	Unknown State = ""
	// Sending: a redrive was about to send the message to the work queue
	// and had not yet recorded the outcome. If that redrive died, the
	// message may or may not be on the work queue.
	Sending State = "sending"
	// Sent: the work queue accepted the message; only its deletion from the
	// DLQ may be missing.
	Sent State = "sent"
)

// Entry is one journal record.
type Entry struct {
	MessageID     string
	State         State
	At            time.Time
	WorkMessageID string
}

// Journal records, per DLQ message, how far a copy redrive got, so that a
// redrive interrupted between sending a message to the work queue and
// deleting it from the DLQ does not send it again when resumed. It lives in
// the stack's state table (the one holding the job items, keyed by job_id),
// one small item per message in flight, keyed
// "redrive/<job>/<output>/<DLQ message id>"; job ids cannot contain '/', so
// these keys never meet a job item. Entries are removed once their message
// left the DLQ; they carry an expires_at epoch (for a TTL on the table, if
// enabled) after the DLQ retention period. Safe for concurrent use.
type Journal struct {
	DB          DynamoDB
	Table       string
	Job, Output string
	// Retention sets expires_at; default 14 days, the longest a DLQ keeps a
	// message.
	Retention time.Duration
	Now       clock.Clock // zero: the system clock
}

// Journal item attributes; the key is statetable.KeyAttr.
const (
	jAttrState   = "redrive_state"
	jAttrAt      = "redrive_at"
	jAttrWorkID  = "work_message_id"
	jAttrExpires = "expires_at"
)

func (j *Journal) key(id string) string {
	return "redrive/" + j.Job + "/" + j.Output + "/" + id
}

// Lookup reads the entries of the given DLQ message ids with strongly
// consistent reads. Ids without an entry are absent from the result.
func (j *Journal) Lookup(ctx context.Context, ids []string) (map[string]Entry, error) {
	out := map[string]Entry{}
	for chunk := range slices.Chunk(ids, 100) {
		keys := make([]map[string]types.AttributeValue, 0, len(chunk))
		byKey := map[string]string{}
		for _, id := range chunk {
			k := j.key(id)
			if _, dup := byKey[k]; dup {
				continue
			}
			byKey[k] = id
			keys = append(keys, statetable.Key(k))
		}
		req := map[string]types.KeysAndAttributes{j.Table: {Keys: keys, ConsistentRead: aws.Bool(true)}}
		for attempt := 0; len(req) > 0; attempt++ {
			if attempt > 0 {
				if err := pause(ctx, attempt); err != nil {
					return nil, fmt.Errorf("read redrive journal: %w", err)
				}
			}
			res, err := j.DB.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
			if err != nil {
				return nil, fmt.Errorf("read redrive journal: %w", err)
			}
			for _, item := range res.Responses[j.Table] {
				e := decodeEntry(item)
				if id, ok := byKey[e.MessageID]; ok {
					e.MessageID = id
					out[id] = e
				}
			}
			req = res.UnprocessedKeys
		}
	}
	return out, nil
}

// Mark records state for the given DLQ message ids; workIDs, when not nil,
// gives the work queue's message id of each.
func (j *Journal) Mark(ctx context.Context, ids []string, state State, workIDs map[string]string) error {
	now := j.Now.Now()
	retention := j.Retention
	if retention <= 0 {
		retention = 14 * 24 * time.Hour
	}
	reqs := make([]types.WriteRequest, 0, len(ids))
	for _, id := range ids {
		item := map[string]types.AttributeValue{
			statetable.KeyAttr: statetable.Str(j.key(id)),
			jAttrState:         statetable.Str(string(state)),
			jAttrAt:            statetable.Stamp(now),
			jAttrExpires:       statetable.Num(now.Add(retention).Unix()),
		}
		if w := workIDs[id]; w != "" {
			item[jAttrWorkID] = statetable.Str(w)
		}
		reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: item}})
	}
	if err := j.write(ctx, reqs); err != nil {
		return fmt.Errorf("write redrive journal (%s): %w", state, err)
	}
	return nil
}

// Forget removes the entries of the given DLQ message ids.
func (j *Journal) Forget(ctx context.Context, ids []string) error {
	reqs := make([]types.WriteRequest, 0, len(ids))
	for _, id := range ids {
		reqs = append(reqs, types.WriteRequest{DeleteRequest: &types.DeleteRequest{
			Key: statetable.Key(j.key(id)),
		}})
	}
	if err := j.write(ctx, reqs); err != nil {
		return fmt.Errorf("clear redrive journal: %w", err)
	}
	return nil
}

// write sends write requests in batches of 25, retrying unprocessed items.
func (j *Journal) write(ctx context.Context, reqs []types.WriteRequest) error {
	for chunk := range slices.Chunk(reqs, 25) {
		pending := map[string][]types.WriteRequest{j.Table: chunk}
		for attempt := 0; len(pending) > 0; attempt++ {
			if attempt > 0 {
				if err := pause(ctx, attempt); err != nil {
					return err
				}
			}
			res, err := j.DB.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: pending})
			if err != nil {
				return err
			}
			pending = res.UnprocessedItems
		}
	}
	return nil
}

// Entries lists every journal entry of this (job, output), for inspection
// and tests. It scans the state table, which holds one item per job besides
// the journal, so it is cheap.
func (j *Journal) Entries(ctx context.Context, db statetable.Scanner) (map[string]Entry, error) {
	prefix := j.key("")
	out := map[string]Entry{}
	items, err := statetable.ScanPrefix(ctx, db, j.Table, prefix)
	if err != nil {
		return nil, fmt.Errorf("scan redrive journal: %w", err)
	}
	for _, item := range items {
		e := decodeEntry(item)
		e.MessageID = e.MessageID[len(prefix):]
		out[e.MessageID] = e
	}
	return out, nil
}

// decodeEntry reads an item; MessageID is the item's whole key.
func decodeEntry(item map[string]types.AttributeValue) Entry {
	return Entry{
		MessageID: statetable.String(item, statetable.KeyAttr), State: State(statetable.String(item, jAttrState)),
		At: statetable.Time(item, jAttrAt), WorkMessageID: statetable.String(item, jAttrWorkID),
	}
}

// pause waits before retry attempt n (1, 2, ...): 50ms, 100ms, ... up to 2s.
func pause(ctx context.Context, n int) error {
	return clock.Sleep(ctx, min(time.Duration(50<<min(n-1, 6))*time.Millisecond, 2*time.Second))
}
