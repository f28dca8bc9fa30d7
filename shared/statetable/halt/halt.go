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
//
// Beside its records, an output that halted has an index item keyed
// "halt/<job>/<output>" (output ids cannot contain '/', so it never meets a
// record) naming its halted groups, written in the same transaction as each
// record and each clear. It answers whether the output is halted (Check)
// with reads of the index and its groups, where the records themselves could
// only be found by scanning the table, which the writer may not do. The
// index outlives the last halt of the output until a Check finds it empty:
// that Check answers Resumed once, so that whichever writer makes it reports
// the output running again.
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
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
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
	// attrGroups is the index item's set of halted groups.
	attrGroups = "halted_groups"
)

// Key is the state-table key of a group's record.
func Key(job, output, group string) string { return "halt/" + job + "/" + output + "/" + group }

func prefix(job, output string) string { return JobPrefix(job) + output + "/" }

// indexKey is the state-table key of an output's index item.
func indexKey(job, output string) string { return JobPrefix(job) + output }

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
// A request the operator made for the same message is kept. The output's
// index names the group from the same write on. It returns the record as
// stored.
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
	_, err := s.DB.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Update: &types.Update{
			TableName: &s.Table, Key: statetable.Key(k), UpdateExpression: &update,
			ConditionExpression:       aws.String("attribute_not_exists(#msg) OR #msg = :msg"),
			ExpressionAttributeNames:  names,
			ExpressionAttributeValues: set,
		}},
		s.index(st.Job, st.Output, st.Group, "ADD"),
	}})
	if conditionFailed(err) {
		// Another message: a new halt replaces the old record entirely.
		if _, err := s.DB.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: &s.Table, Key: statetable.Key(k)}); err != nil {
			return nil, fmt.Errorf("replace halt %s: %w", k, err)
		}
		return s.Record(ctx, st)
	}
	if err != nil {
		return nil, fmt.Errorf("record halt %s: %w", k, err)
	}
	got, err := s.Get(ctx, st.Job, st.Output, st.Group)
	if err != nil {
		return nil, fmt.Errorf("record halt %s: %w", k, err)
	}
	if got == nil {
		// Cleared between the write and the read: as recorded.
		got = &st
	}
	return got, nil
}

// index is the transaction item that adds group to (op "ADD") or deletes
// it from (op "DELETE") the output's index.
func (s *Store) index(job, output, group, op string) types.TransactWriteItem {
	return types.TransactWriteItem{Update: &types.Update{
		TableName: &s.Table, Key: statetable.Key(indexKey(job, output)),
		UpdateExpression:          aws.String(op + " #groups :grp"),
		ExpressionAttributeNames:  map[string]string{"#groups": attrGroups},
		ExpressionAttributeValues: map[string]types.AttributeValue{":grp": &types.AttributeValueMemberSS{Value: []string{group}}},
	}}
}

// conditionFailed reports whether a transaction was cancelled because the
// condition of its first item failed.
func conditionFailed(err error) bool {
	var tc *types.TransactionCanceledException
	if !errors.As(err, &tc) || len(tc.CancellationReasons) == 0 {
		return false
	}
	return aws.ToString(tc.CancellationReasons[0].Code) == "ConditionalCheckFailed"
}

// Clear removes the group's record if it is still about messageID: the
// change was delivered or skipped. The output's index no longer names the
// group from the same write on. Clearing a record that is gone, or about
// another message, does nothing.
func (s *Store) Clear(ctx context.Context, job, output, group, messageID string) error {
	k := Key(job, output, group)
	_, err := s.DB.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Delete: &types.Delete{
			TableName: &s.Table, Key: statetable.Key(k),
			ConditionExpression:       aws.String("#msg = :msg"),
			ExpressionAttributeNames:  map[string]string{"#msg": attrMessageID},
			ExpressionAttributeValues: map[string]types.AttributeValue{":msg": str(messageID)},
		}},
		s.index(job, output, group, "DELETE"),
	}})
	if err != nil && !conditionFailed(err) {
		return fmt.Errorf("clear halt %s: %w", k, err)
	}
	return nil
}

// OutputStatus is what Check found of an output's halts.
type OutputStatus int

const (
	// Unhalted: no group halted since the last Check that found none.
	Unhalted OutputStatus = iota
	// Resumed: the output had halted, and no group of it is halted any
	// more. The next Check answers Unhalted.
	Resumed
	// Halted: at least one group of the output is halted.
	Halted
)

// Check says whether any group of the output is halted, with strongly
// consistent reads of its index and of the records the index names (at most
// one standing record is read). A group the index names without a record
// (one deleted by hand) is dropped from it. Once the index names no group,
// Check deletes it and answers Resumed: one Check, of all the writers that
// may make it at once, answers Resumed for each time the output resumes.
func (s *Store) Check(ctx context.Context, job, output string) (OutputStatus, error) {
	k := indexKey(job, output)
	out, err := s.DB.GetItem(ctx, &dynamodb.GetItemInput{TableName: &s.Table, Key: statetable.Key(k), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return Unhalted, fmt.Errorf("check halts of %s/%s: %w", job, output, err)
	}
	if out.Item == nil {
		return Unhalted, nil
	}
	var groups []string
	if ss, ok := out.Item[attrGroups].(*types.AttributeValueMemberSS); ok {
		groups = ss.Value
	}
	for _, g := range groups {
		st, err := s.Get(ctx, job, output, g)
		if err != nil {
			return Unhalted, fmt.Errorf("check halts of %s/%s: %w", job, output, err)
		}
		if st != nil {
			return Halted, nil
		}
		// Dropped only while the group still has no record.
		_, err = s.DB.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
			{Delete: &types.Delete{
				TableName: &s.Table, Key: statetable.Key(Key(job, output, g)),
				ConditionExpression:      aws.String("attribute_not_exists(#msg)"),
				ExpressionAttributeNames: map[string]string{"#msg": attrMessageID},
			}},
			s.index(job, output, g, "DELETE"),
		}})
		if conditionFailed(err) {
			return Halted, nil
		}
		if err != nil {
			return Unhalted, fmt.Errorf("check halts of %s/%s: drop group %s: %w", job, output, g, err)
		}
	}
	// Deleted only while it names no group: a halt recorded since stands.
	// Another writer's Check may have deleted it first.
	del, err := s.DB.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: &s.Table, Key: statetable.Key(k),
		ConditionExpression:      aws.String("attribute_not_exists(#groups)"),
		ExpressionAttributeNames: map[string]string{"#groups": attrGroups},
		ReturnValues:             types.ReturnValueAllOld,
	})
	var cond *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &cond):
		return Halted, nil
	case err != nil:
		return Unhalted, fmt.Errorf("check halts of %s/%s: %w", job, output, err)
	case len(del.Attributes) == 0:
		return Unhalted, nil
	}
	return Resumed, nil
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
