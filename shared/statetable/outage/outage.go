// Package outage records the outputs that are down: an output the writer
// cannot reach, that refuses our credentials, or that fails every request,
// so that the writer holds its messages instead of dead-lettering them. The
// writer writes the record while the output is down and deletes it when the
// output takes changes again; changesctl status reads it. A record that a
// writer deletes tells it that an outage was reported (OutputDown) and is
// over, whichever writer instance saw it.
//
// A record is one item of the stack's state table, keyed
// "outage/<job>/<output>". Several writer instances may report the same
// outage: the record keeps the earliest Since, the latest error, and the sum
// of the messages they held.
package outage

import (
	"context"
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
}

// State is one output that is down.
type State struct {
	Job, Output string
	// Since is when a writer first found the output down.
	Since time.Time
	// LastAt is when a writer last found it down, LastError what it
	// answered then (classified, without secrets or document bodies).
	LastAt    time.Time
	LastError string
	// Held counts the messages held back for the output since Since.
	Held int64
}

// Store reads and writes outage records. Safe for concurrent use.
type Store struct {
	DB    DynamoDB
	Table string
}

const (
	attrJob       = "outage_job"
	attrOutput    = "outage_output"
	attrSince     = "down_since"
	attrLastAt    = "down_last_at"
	attrLastError = "down_last_error"
	attrHeld      = "messages_held"
)

// Key is the state-table key of an output's record.
func Key(job, output string) string { return JobPrefix(job) + output }

// JobPrefix is the key prefix of a job's records.
func JobPrefix(job string) string { return "outage/" + job + "/" }

// Mark records that the output was found down at st.LastAt with
// st.LastError, and that st.Held more messages were held back. The first
// mark of an outage sets Since. Not idempotent: Held is added.
func (s *Store) Mark(ctx context.Context, st State) error {
	k := Key(st.Job, st.Output)
	_, err := s.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &s.Table, Key: statetable.Key(k),
		UpdateExpression: aws.String("SET #job = :job, #out = :out, #since = if_not_exists(#since, :since), #last = :last, #err = :err ADD #held :held"),
		ExpressionAttributeNames: map[string]string{
			"#job": attrJob, "#out": attrOutput, "#since": attrSince, "#last": attrLastAt, "#err": attrLastError, "#held": attrHeld,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":job": statetable.Str(st.Job), ":out": statetable.Str(st.Output), ":since": statetable.Stamp(st.Since),
			":last": statetable.Stamp(st.LastAt), ":err": statetable.Str(st.LastError), ":held": statetable.Num(st.Held),
		},
	})
	if err != nil {
		return fmt.Errorf("mark outage %s: %w", k, err)
	}
	return nil
}

// Clear deletes the output's record: it takes changes again. It reports
// whether there was one: clearing a record that is gone does nothing.
func (s *Store) Clear(ctx context.Context, job, output string) (bool, error) {
	k := Key(job, output)
	out, err := s.DB.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: &s.Table, Key: statetable.Key(k), ReturnValues: types.ReturnValueAllOld})
	if err != nil {
		return false, fmt.Errorf("clear outage %s: %w", k, err)
	}
	return len(out.Attributes) > 0, nil
}

// Get returns the output's record, or nil when no writer found it down
// since it last took changes. The read is strongly consistent.
func (s *Store) Get(ctx context.Context, job, output string) (*State, error) {
	k := Key(job, output)
	out, err := s.DB.GetItem(ctx, &dynamodb.GetItemInput{TableName: &s.Table, Key: statetable.Key(k), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, fmt.Errorf("get outage %s: %w", k, err)
	}
	if out.Item == nil {
		return nil, nil
	}
	return &State{
		Job: statetable.String(out.Item, attrJob), Output: statetable.String(out.Item, attrOutput),
		Since: statetable.Time(out.Item, attrSince), LastAt: statetable.Time(out.Item, attrLastAt),
		LastError: statetable.String(out.Item, attrLastError), Held: statetable.Int(out.Item, attrHeld),
	}, nil
}
