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
//
// On a FIFO output the record is also the one place that says whether the
// output's intake is paused (the writer's event source mapping turned off,
// or the local runtime's receivers stopped) and with which change the probe
// tries the output meanwhile. Its intake goes from none to IntakePaused
// (Pause, by a writer), to IntakeResuming (Resuming, by the probe once the
// output took the change), and the record is deleted once the intake runs
// again (Resumed). A record whose intake is paused or resuming is deleted by
// Resumed only, never by Clear.
package outage

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
	// Intake is "" while the writers receive the output's messages,
	// IntakePaused once a writer paused them, IntakeResuming once the probe
	// found the output back.
	Intake string
	// PausedAt is when the intake was paused.
	PausedAt time.Time
	// ProbeMessageID and ProbeBody are the change the probe tries the
	// output with while the intake is paused: a held message at the head of
	// its message group (its SQS message id, and its body when it is at
	// most MaxProbeBody bytes; "" otherwise).
	ProbeMessageID, ProbeBody string
	// ProbeUntil: a probe of the output is under way until then.
	ProbeUntil time.Time
}

// The states of an output's intake (State.Intake).
const (
	IntakePaused   = "paused"
	IntakeResuming = "resuming"
)

// MaxProbeBody is the largest message body a record keeps as its probe
// change (a DynamoDB item holds at most 400 KB).
const MaxProbeBody = 300_000

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
	attrIntake    = "intake_state"
	attrPausedAt  = "intake_paused_at"
	attrProbeID   = "probe_message_id"
	attrProbeBody = "probe_message_body"
	// attrProbeUntil is a number, Unix milliseconds, compared in conditions.
	attrProbeUntil = "probe_until_ms"
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
// whether there was one: clearing a record that is gone does nothing, and so
// does clearing one whose intake is paused or resuming (see Resumed).
func (s *Store) Clear(ctx context.Context, job, output string) (bool, error) {
	k := Key(job, output)
	out, err := s.DB.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: &s.Table, Key: statetable.Key(k), ReturnValues: types.ReturnValueAllOld,
		ConditionExpression:      aws.String("attribute_not_exists(#intake)"),
		ExpressionAttributeNames: map[string]string{"#intake": attrIntake},
	})
	if err != nil {
		if conditionFailed(err) {
			return false, nil
		}
		return false, fmt.Errorf("clear outage %s: %w", k, err)
	}
	return len(out.Attributes) > 0, nil
}

// Pause records that the output's intake is paused since st.LastAt, found
// down with st.LastError, with st's probe change (a body longer than
// MaxProbeBody is left out). It reports whether this call paused it: an
// intake already paused keeps its probe change and its time, and reports
// false. Pausing a resuming intake pauses it again. Idempotent.
func (s *Store) Pause(ctx context.Context, st State) (bool, error) {
	k := Key(st.Job, st.Output)
	body := st.ProbeBody
	if len(body) > MaxProbeBody {
		body = ""
	}
	_, err := s.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &s.Table, Key: statetable.Key(k),
		UpdateExpression: aws.String("SET #job = :job, #out = :out, #since = if_not_exists(#since, :since), #last = :last, #err = :err, " +
			"#intake = :paused, #pausedAt = :last, #pid = :pid, #pbody = :pbody REMOVE #until"),
		ConditionExpression: aws.String("attribute_not_exists(#intake) OR #intake <> :paused"),
		ExpressionAttributeNames: map[string]string{
			"#job": attrJob, "#out": attrOutput, "#since": attrSince, "#last": attrLastAt, "#err": attrLastError,
			"#intake": attrIntake, "#pausedAt": attrPausedAt, "#pid": attrProbeID, "#pbody": attrProbeBody, "#until": attrProbeUntil,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":job": statetable.Str(st.Job), ":out": statetable.Str(st.Output), ":since": statetable.Stamp(st.Since),
			":last": statetable.Stamp(st.LastAt), ":err": statetable.Str(st.LastError), ":paused": statetable.Str(IntakePaused),
			":pid": statetable.Str(st.ProbeMessageID), ":pbody": statetable.Str(body),
		},
	})
	if err != nil {
		if conditionFailed(err) {
			return false, nil
		}
		return false, fmt.Errorf("pause intake %s: %w", k, err)
	}
	return true, nil
}

// ClaimProbe takes the probe of the output's paused intake at now until
// until, so that no other probe tries the output meanwhile, and returns the
// record. It returns nil when the intake is not paused or another probe's
// claim has not ended.
func (s *Store) ClaimProbe(ctx context.Context, job, output string, now, until time.Time) (*State, error) {
	k := Key(job, output)
	out, err := s.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &s.Table, Key: statetable.Key(k),
		UpdateExpression:         aws.String("SET #until = :until"),
		ConditionExpression:      aws.String("#intake = :paused AND (attribute_not_exists(#until) OR #until < :now)"),
		ExpressionAttributeNames: map[string]string{"#intake": attrIntake, "#until": attrProbeUntil},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":paused": statetable.Str(IntakePaused), ":until": statetable.Num(until.UnixMilli()), ":now": statetable.Num(now.UnixMilli()),
		},
		ReturnValues: types.ReturnValueAllNew,
	})
	if err != nil {
		if conditionFailed(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("claim probe %s: %w", k, err)
	}
	return decode(out.Attributes), nil
}

// ProbeFailed records that the probe claimed until until found the output
// still down at st.LastAt with st.LastError, and ends its claim.
func (s *Store) ProbeFailed(ctx context.Context, st State, until time.Time) error {
	k := Key(st.Job, st.Output)
	_, err := s.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &s.Table, Key: statetable.Key(k),
		UpdateExpression:         aws.String("SET #last = :last, #err = :err REMOVE #until"),
		ConditionExpression:      aws.String("#until = :until"),
		ExpressionAttributeNames: map[string]string{"#last": attrLastAt, "#err": attrLastError, "#until": attrProbeUntil},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":last": statetable.Stamp(st.LastAt), ":err": statetable.Str(st.LastError), ":until": statetable.Num(until.UnixMilli()),
		},
	})
	if err != nil && !conditionFailed(err) {
		return fmt.Errorf("record probe %s: %w", k, err)
	}
	return nil
}

// Resuming records that the output took the probe's change: its intake is
// to run again. From then on the writers deliver to it, and no probe tries
// it. It does nothing unless the intake is paused.
func (s *Store) Resuming(ctx context.Context, job, output string) error {
	k := Key(job, output)
	_, err := s.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &s.Table, Key: statetable.Key(k),
		UpdateExpression:          aws.String("SET #intake = :resuming REMOVE #until"),
		ConditionExpression:       aws.String("#intake = :paused"),
		ExpressionAttributeNames:  map[string]string{"#intake": attrIntake, "#until": attrProbeUntil},
		ExpressionAttributeValues: map[string]types.AttributeValue{":paused": statetable.Str(IntakePaused), ":resuming": statetable.Str(IntakeResuming)},
	})
	if err != nil && !conditionFailed(err) {
		return fmt.Errorf("resume intake %s: %w", k, err)
	}
	return nil
}

// Resumed deletes the record of an output whose intake runs again, and
// reports whether it did: it does nothing unless the intake is resuming (a
// writer may have paused it again meanwhile).
func (s *Store) Resumed(ctx context.Context, job, output string) (bool, error) {
	k := Key(job, output)
	_, err := s.DB.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: &s.Table, Key: statetable.Key(k),
		ConditionExpression:       aws.String("#intake = :resuming"),
		ExpressionAttributeNames:  map[string]string{"#intake": attrIntake},
		ExpressionAttributeValues: map[string]types.AttributeValue{":resuming": statetable.Str(IntakeResuming)},
	})
	if err != nil {
		if conditionFailed(err) {
			return false, nil
		}
		return false, fmt.Errorf("end outage %s: %w", k, err)
	}
	return true, nil
}

// conditionFailed reports whether err is DynamoDB refusing a write whose
// condition did not hold.
func conditionFailed(err error) bool {
	var ccf *types.ConditionalCheckFailedException
	return errors.As(err, &ccf)
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
	return decode(out.Item), nil
}

// decode reads a record's item.
func decode(item map[string]types.AttributeValue) *State {
	st := &State{
		Job: statetable.String(item, attrJob), Output: statetable.String(item, attrOutput),
		Since: statetable.Time(item, attrSince), LastAt: statetable.Time(item, attrLastAt),
		LastError: statetable.String(item, attrLastError), Held: statetable.Int(item, attrHeld),
		Intake: statetable.String(item, attrIntake), PausedAt: statetable.Time(item, attrPausedAt),
		ProbeMessageID: statetable.String(item, attrProbeID), ProbeBody: statetable.String(item, attrProbeBody),
	}
	if ms := statetable.Int(item, attrProbeUntil); ms > 0 {
		st.ProbeUntil = time.UnixMilli(ms).UTC()
	}
	return st
}
