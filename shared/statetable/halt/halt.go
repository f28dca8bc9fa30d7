// Package halt records the message groups of halting outputs (on_failure
// halt) that stopped at a change they cannot deliver: which change, why,
// since when, and what the operator asked for (retry or skip). The writer
// writes and clears the records; changesctl reads them and records the
// operator's request.
//
// A record is one item of the stack's state table (the table of the job
// items, keyed by job_id), keyed "halt/<job>/<output>/<group>"; job ids cannot
// contain '/', so these keys never meet a job item. The group is the SQS
// message group: the output id under ordering total, the document's group
// under per_document.
package halt

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/changes-worker/changes-worker/shared/statetable"
)

// DynamoDB is the part of the DynamoDB client the store calls.
type DynamoDB interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	statetable.Scanner
}

// Action is what the operator asked for a halted change.
type Action string

const (
	// None: nothing asked; the writer retries the change on its own,
	// with a growing delay.
	None Action = ""
	// Retry: the cause was fixed; deliver the change again now.
	Retry Action = "retry"
	// Skip: move the change to the DLQ with its reason and go on.
	Skip Action = "skip"
)

// State is one halted message group.
type State struct {
	Job, Output, Group string
	// MessageID is the SQS message id of the blocked change (the same on
	// every receive).
	MessageID string
	// ReceiptHandle is the handle of the message's latest receive, which
	// changesctl uses to make the message visible at once.
	ReceiptHandle string
	DocID, Rev    string
	Seq           string // the source's seq, as JSON
	// Body is the SQS message body (the change envelope) when it is at
	// most MaxBody bytes, so that it can be inspected while the message is
	// in flight.
	Body          string
	Class, Reason string
	Error         string
	HTTPStatus    int
	SQLState      string
	Since, LastAt time.Time
	// Attempts counts the deliveries of the change since it halted the group.
	Attempts int
	Action   Action
	ActionAt time.Time
}

// Store reads and writes halt records. Safe for concurrent use.
type Store struct {
	DB    DynamoDB
	Table string
}

// MaxBody is the largest message body a record keeps (a DynamoDB item
// holds at most 400 KB).
const MaxBody = 300_000

// ErrNotHalted is returned by Request when the group is not halted.
var ErrNotHalted = errors.New("not halted")

const (
	attrJob       = "halt_job"
	attrOutput    = "halt_output"
	attrGroup     = "halt_group"
	attrMessageID = "message_id"
	attrReceipt   = "receipt_handle"
	attrDocID     = "doc_id"
	attrRev       = "rev"
	attrSeq       = "seq"
	attrBody      = "message_body"
	attrClass     = "failure_class"
	attrReason    = "failure_reason"
	attrError     = "failure_error"
	attrHTTP      = "http_status"
	attrSQLState  = "sqlstate"
	attrSince     = "halted_since"
	attrLastAt    = "last_attempt_at"
	attrAttempts  = "halt_attempts"
	attrAction    = "operator_action"
	attrActionAt  = "operator_action_at"
)

// Key is the state-table key of a group's record.
func Key(job, output, group string) string { return "halt/" + job + "/" + output + "/" + group }

func prefix(job, output string) string { return JobPrefix(job) + output + "/" }

// JobPrefix is the key prefix of every record of job's outputs.
func JobPrefix(job string) string { return "halt/" + job + "/" }

// Get returns the group's record, or nil when the group is not halted.
// The read is strongly consistent.
func (s *Store) Get(ctx context.Context, job, output, group string) (*State, error) {
	out, err := s.DB.GetItem(ctx, &dynamodb.GetItemInput{TableName: &s.Table, Key: statetable.Key(Key(job, output, group)), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, fmt.Errorf("get halt %s/%s/%s: %w", job, output, group, err)
	}
	if out.Item == nil {
		return nil, nil
	}
	st := decode(out.Item)
	return &st, nil
}

// List returns every halted group of an output, oldest halt first.
func (s *Store) List(ctx context.Context, job, output string) ([]State, error) {
	items, err := statetable.ScanPrefix(ctx, s.DB, s.Table, prefix(job, output))
	if err != nil {
		return nil, fmt.Errorf("list halts of %s/%s: %w", job, output, err)
	}
	list := make([]State, 0, len(items))
	for _, it := range items {
		list = append(list, decode(it))
	}
	for i := 1; i < len(list); i++ {
		for k := i; k > 0 && list[k].Since.Before(list[k-1].Since); k-- {
			list[k], list[k-1] = list[k-1], list[k]
		}
	}
	return list, nil
}

// Record writes the failure of a delivery attempt of the group's blocked
// change. The first record of a change sets Since; a record for another
// message than the one recorded replaces it (and its operator request).
// A request the operator made for the same message is kept. It returns the
// record as stored.
func (s *Store) Record(ctx context.Context, st State) (*State, error) {
	k := Key(st.Job, st.Output, st.Group)
	body := st.Body
	if len(body) > MaxBody {
		body = ""
	}
	set := map[string]types.AttributeValue{
		":job": str(st.Job), ":out": str(st.Output), ":grp": str(st.Group), ":msg": str(st.MessageID),
		":rh": str(st.ReceiptHandle), ":doc": str(st.DocID), ":rev": str(st.Rev), ":seq": str(st.Seq), ":body": str(body),
		":cls": str(st.Class), ":rsn": str(st.Reason), ":err": str(st.Error),
		":http": num(st.HTTPStatus), ":sql": str(st.SQLState), ":last": str(st.LastAt.UTC().Format(time.RFC3339Nano)),
		":since": str(st.Since.UTC().Format(time.RFC3339Nano)), ":one": num(1), ":zero": num(0),
	}
	update := "SET #job = :job, #out = :out, #grp = :grp, #rh = :rh, #doc = :doc, #rev = :rev, #seq = :seq, #body = :body, " +
		"#cls = :cls, #rsn = :rsn, #err = :err, #http = :http, #sql = :sql, #last = :last, " +
		"#since = if_not_exists(#since, :since), #att = if_not_exists(#att, :zero) + :one, #msg = :msg"
	names := map[string]string{
		"#job": attrJob, "#out": attrOutput, "#grp": attrGroup, "#msg": attrMessageID, "#rh": attrReceipt,
		"#doc": attrDocID, "#rev": attrRev, "#seq": attrSeq, "#body": attrBody, "#cls": attrClass, "#rsn": attrReason, "#err": attrError,
		"#http": attrHTTP, "#sql": attrSQLState, "#last": attrLastAt, "#since": attrSince, "#att": attrAttempts,
	}
	// The same message: keep Since, count the attempt, keep the request.
	out, err := s.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &s.Table, Key: statetable.Key(k), UpdateExpression: &update,
		ConditionExpression:       aws.String("attribute_not_exists(#msg) OR #msg = :msg"),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: set,
		ReturnValues:              types.ReturnValueAllNew,
	})
	var cond *types.ConditionalCheckFailedException
	if errors.As(err, &cond) {
		// Another message: a new halt replaces the old record entirely.
		if _, err := s.DB.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: &s.Table, Key: statetable.Key(k)}); err != nil {
			return nil, fmt.Errorf("replace halt %s: %w", k, err)
		}
		return s.Record(ctx, st)
	}
	if err != nil {
		return nil, fmt.Errorf("record halt %s: %w", k, err)
	}
	got := decode(out.Attributes)
	return &got, nil
}

// Clear removes the group's record if it is still about messageID: the
// change was delivered or skipped. Clearing a record that is gone, or about
// another message, does nothing.
func (s *Store) Clear(ctx context.Context, job, output, group, messageID string) error {
	k := Key(job, output, group)
	_, err := s.DB.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: &s.Table, Key: statetable.Key(k),
		ConditionExpression:       aws.String("#msg = :msg"),
		ExpressionAttributeNames:  map[string]string{"#msg": attrMessageID},
		ExpressionAttributeValues: map[string]types.AttributeValue{":msg": str(messageID)},
	})
	var cond *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &cond) {
		return fmt.Errorf("clear halt %s: %w", k, err)
	}
	return nil
}

// Request records the operator's action for the group's blocked change
// (messageID, as the operator saw it) and returns the record. It fails with
// ErrNotHalted when the group no longer stops at that message.
func (s *Store) Request(ctx context.Context, job, output, group, messageID string, a Action, at time.Time) (*State, error) {
	k := Key(job, output, group)
	out, err := s.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &s.Table, Key: statetable.Key(k),
		UpdateExpression:         aws.String("SET #act = :act, #at = :at"),
		ConditionExpression:      aws.String("#msg = :msg"),
		ExpressionAttributeNames: map[string]string{"#act": attrAction, "#at": attrActionAt, "#msg": attrMessageID},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":act": str(string(a)), ":at": str(at.UTC().Format(time.RFC3339Nano)), ":msg": str(messageID),
		},
		ReturnValues: types.ReturnValueAllNew,
	})
	var cond *types.ConditionalCheckFailedException
	if errors.As(err, &cond) {
		return nil, fmt.Errorf("request %s for %s: %w", a, k, ErrNotHalted)
	}
	if err != nil {
		return nil, fmt.Errorf("request %s for %s: %w", a, k, err)
	}
	st := decode(out.Attributes)
	return &st, nil
}

func str(v string) types.AttributeValue { return statetable.Str(v) }

func num(n int) types.AttributeValue { return statetable.Num(int64(n)) }

func decode(item map[string]types.AttributeValue) State {
	s := func(name string) string { return statetable.String(item, name) }
	n := func(name string) int { return int(statetable.Int(item, name)) }
	t := func(name string) time.Time { return statetable.Time(item, name) }
	return State{
		Job: s(attrJob), Output: s(attrOutput), Group: s(attrGroup), MessageID: s(attrMessageID),
		ReceiptHandle: s(attrReceipt), DocID: s(attrDocID), Rev: s(attrRev), Seq: s(attrSeq), Body: s(attrBody),
		Class: s(attrClass), Reason: s(attrReason), Error: s(attrError), HTTPStatus: n(attrHTTP), SQLState: s(attrSQLState),
		Since: t(attrSince), LastAt: t(attrLastAt), Attempts: n(attrAttempts),
		Action: Action(s(attrAction)), ActionAt: t(attrActionAt),
	}
}
