// Package lease keeps each job's lease and checkpoint in one DynamoDB item, so
// that one conditional write both renews the lease and advances the checkpoint.
//
// The item's generation is the fencing token: every takeover increments it, and
// every later write of the holder is conditioned on owner AND generation. A
// refused write means the lease was taken; the holder must stop at once.
package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/statetable"
	"github.com/changes-worker/changes-worker/shared/version"
)

// DynamoDB is the part of the DynamoDB client the store calls.
type DynamoDB interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
}

var (
	// ErrLeaseHeld is returned by Acquire when another owner holds an unexpired lease.
	ErrLeaseHeld = errors.New("lease held by another owner")
	// ErrLeaseLost is returned when a write conditioned on owner and generation
	// is refused: another poller took the lease (or it was force-taken).
	ErrLeaseLost = errors.New("lease lost")
)

// Item attribute names.
const (
	attrOwner        = "owner"
	attrHost         = "owner_host"
	attrGeneration   = "generation"
	attrExpiresMS    = "lease_expires_ms"
	attrAcquiredAt   = "acquired_at"
	attrHeartbeatAt  = "heartbeat_at"
	attrReleased     = "released"
	attrCheckpoint   = "checkpoint_seq"
	attrCheckpointAt = "checkpoint_at"
	attrPending      = "pending"
	attrFailovers    = "failovers"
	attrHandoffs     = "handoffs"
	attrCheckpoints  = "checkpoints"
	attrTakeoverKind = "takeover_kind"
	attrRole         = "role"
	attrStandby      = "standby_owner"
	attrStandbySeen  = "standby_seen_at"
	attrLargest      = "largest_batch"
	attrAuthFailedAt = "source_auth_failed_at"
	attrReplayEpoch  = "replay_epoch"
	// attrHolderVersion is a map {owner, version}: the release of the
	// owner that took the lease. A release before 1.0.0 writes no version,
	// so its take leaves the map naming the owner before it.
	attrHolderVersion = "holder_version"
	attrReleaseAt     = "release_at_ms"
)

// Roles recorded on the job item.
const (
	RoleActive   = "active"
	RoleReleased = "released"
)

// Takeover says how a lease was acquired.
type Takeover string

const (
	// First: the job had no holder before.
	First Takeover = "first"
	// Handoff: the previous holder released the lease.
	Handoff Takeover = "handoff"
	// Failover: the previous holder's lease expired without release.
	Failover Takeover = "failover"
	// Forced: an operator took the lease (changesctl checkpoint --force).
	Forced Takeover = "forced"
)

// State is what the job item holds.
type State struct {
	JobID        string
	Exists       bool
	Owner        string
	Host         string
	Generation   int64
	ExpiresAt    time.Time
	AcquiredAt   time.Time
	HeartbeatAt  time.Time
	Released     bool
	Checkpoint   json.RawMessage // nil: from the beginning
	CheckpointAt time.Time
	Pending      int64 // -1 when unknown
	Failovers    int64
	Handoffs     int64
	Checkpoints  int64
	TakeoverKind Takeover
	Role         string
	// Standby is the last invocation seen waiting for the lease, and when.
	Standby       string
	StandbySeenAt time.Time
	// LargestBatch is the most changes one poller invocation has read.
	LargestBatch int64
	// SourceAuthFailedAt is when the source last refused our credentials
	// (401/403); zero when never.
	SourceAuthFailedAt time.Time
	// ReplayEpoch is the generation of the operator's lease that last set
	// or reset the checkpoint (SetCheckpoint); zero when never. Changes
	// queued again after it are new to FIFO deduplication.
	ReplayEpoch int64
	// HolderVersion is the release of the owner (version.String when it
	// took the lease); empty when the owner recorded none (a release before
	// 1.0.0) or there is no owner.
	HolderVersion string
	// ReleaseAt is when the holder said, as it took the lease, that it
	// will release it (AcquireUntil); zero when it did not say.
	ReleaseAt time.Time
}

// Held reports whether, by the clock value now, someone holds the lease.
func (s *State) Held(now time.Time) bool {
	return s.Exists && s.Owner != "" && !s.Released && now.Before(s.ExpiresAt)
}

// Lease is a held lease. Its methods are not safe for concurrent use.
type Lease struct {
	JobID      string
	Owner      string
	Generation int64
	Kind       Takeover
	// Checkpoint is the stored checkpoint when the lease was taken.
	Checkpoint json.RawMessage
	// RenewedAt is the local time at which the last successful write was sent;
	// the lease is valid until RenewedAt + TTL by the holder's clock.
	RenewedAt time.Time
	TTL       time.Duration
	// Previous is the item before the takeover.
	Previous State
}

// Remaining is how long the lease is still valid by the local clock.
func (l *Lease) Remaining(now time.Time) time.Duration { return l.RenewedAt.Add(l.TTL).Sub(now) }

// Store reads and writes job items. Safe for concurrent use.
type Store struct {
	DB    DynamoDB
	Table string
	// Clock stamps the lease's expiry and decides whether a lease expired.
	// Zero: the system clock.
	Clock clock.Clock
}

// New returns a store on the given table.
func New(db DynamoDB, table string) *Store { return &Store{DB: db, Table: table} }

// Get reads the job item with a strongly consistent read. A missing item
// returns a State with Exists false.
func (s *Store) Get(ctx context.Context, job string) (*State, error) {
	out, err := s.DB.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      &s.Table,
		Key:            statetable.Key(job),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, fmt.Errorf("get job item %s: %w", job, err)
	}
	st := decode(out.Item)
	st.JobID = job
	return st, nil
}

// Acquire takes the lease when the job has no holder, the holder released it,
// or its lease expired by this process's clock. The generation is incremented,
// and this binary's release recorded as the holder's version.
// When another owner holds it, Acquire returns ErrLeaseHeld and that holder's
// state.
func (s *Store) Acquire(ctx context.Context, job, owner, host string, ttl time.Duration) (*Lease, *State, error) {
	return s.take(ctx, job, owner, host, ttl, time.Time{}, false)
}

// AcquireUntil is Acquire by a holder that will release the lease at
// releaseAt (the end of its time budget): the takeover writes that moment
// on the job item, so that a standby looks for the release then
// (Session.Wait) rather than at its next regular look.
func (s *Store) AcquireUntil(ctx context.Context, job, owner, host string, ttl time.Duration, releaseAt time.Time) (*Lease, *State, error) {
	return s.take(ctx, job, owner, host, ttl, releaseAt, false)
}

// ForceTake takes the lease whatever its state, incrementing the generation
// so any running holder is fenced out at its next write.
func (s *Store) ForceTake(ctx context.Context, job, owner, host string, ttl time.Duration) (*Lease, error) {
	l, _, err := s.take(ctx, job, owner, host, ttl, time.Time{}, true)
	return l, err
}

// takeConditions are the conditions of a takeover of each kind but Forced:
// the write records its kind and counts it, so the item never shows a lease
// taken without how, and the kind is exactly the case the condition held.
var takeConditions = map[Takeover]string{
	First:    "attribute_not_exists(#owner)",
	Handoff:  "attribute_exists(#owner) AND #released = :true",
	Failover: "attribute_exists(#owner) AND (attribute_not_exists(#released) OR #released = :false) AND #exp < :now",
}

// takeoverOf is the kind of takeover st allows by the clock value now, and
// false when someone holds the lease.
func takeoverOf(st *State, now time.Time) (Takeover, bool) {
	switch {
	case !st.Exists || st.Owner == "":
		return First, true
	case st.Released:
		return Handoff, true
	case st.ExpiresAt.Before(now):
		return Failover, true
	}
	return "", false
}

// take takes the lease in one conditional write, whose condition is that of
// the takeover it expects: a handoff first, the case of a running job. When
// the condition fails, the item it returns says which takeover it allows, or
// that it is held, and the write is made once more with that condition. A
// forced take has no condition.
func (s *Store) take(ctx context.Context, job, owner, host string, ttl time.Duration, releaseAt time.Time, force bool) (*Lease, *State, error) {
	now := s.Clock.Now()
	kind := Handoff
	if force {
		kind = Forced
	}
	for attempt := 0; ; attempt++ {
		out, err := s.DB.UpdateItem(ctx, s.takeInput(job, owner, host, ttl, releaseAt, now, kind))
		if err == nil {
			prev := decode(out.Attributes)
			prev.JobID = job
			return taken(job, owner, ttl, now, kind, prev), prev, nil
		}
		var ccf *types.ConditionalCheckFailedException
		if !errors.As(err, &ccf) {
			return nil, nil, fmt.Errorf("acquire lease %s: %w", job, err)
		}
		st := decode(ccf.Item)
		if ccf.Item == nil {
			// Some emulators omit the item; read it.
			if got, gerr := s.Get(ctx, job); gerr == nil {
				st = got
			}
		}
		st.JobID = job
		if st.Owner == owner && st.AcquiredAt.Equal(now) {
			// The lease is ours: the SDK sent this write again because the
			// answer to an earlier attempt was lost, and that attempt took the
			// lease (owner ids are unique per invocation, and the acquired-at
			// time is this call's). The item records the kind that attempt's
			// condition held; the lost answer held the item as it was
			// before, and what the takeover did not change (the checkpoint)
			// is still there.
			prev := &State{JobID: job, Exists: st.Generation > 1, Generation: st.Generation - 1,
				Checkpoint: st.Checkpoint, CheckpointAt: st.CheckpointAt, Pending: st.Pending, ReplayEpoch: st.ReplayEpoch}
			return taken(job, owner, ttl, now, st.TakeoverKind, prev), prev, nil
		}
		next, free := takeoverOf(st, now)
		// After three refused attempts the item is changing under us:
		// whoever changed it last holds the lease.
		if !free || next == kind || attempt == 2 {
			return nil, st, ErrLeaseHeld
		}
		kind = next
	}
}

// taken is the lease taken at now with the write of the given kind.
func taken(job, owner string, ttl time.Duration, now time.Time, kind Takeover, prev *State) *Lease {
	return &Lease{
		JobID: job, Owner: owner, Generation: prev.Generation + 1, Kind: kind,
		Checkpoint: prev.Checkpoint, RenewedAt: now, TTL: ttl, Previous: *prev,
	}
}

// takeInput is the write of a takeover of the given kind at now.
func (s *Store) takeInput(job, owner, host string, ttl time.Duration, releaseAt, now time.Time, kind Takeover) *dynamodb.UpdateItemInput {
	in := &dynamodb.UpdateItemInput{
		TableName: &s.Table,
		Key:       statetable.Key(job),
		UpdateExpression: aws.String("SET #owner = :owner, #host = :host, #exp = :exp, #acq = :nowiso, #hb = :nowiso, #released = :false, " +
			"#gen = if_not_exists(#gen, :zero) + :one, #kind = :kind, #role = :active, #hv = :hv"),
		ExpressionAttributeNames: map[string]string{
			"#owner": attrOwner, "#host": attrHost, "#exp": attrExpiresMS, "#acq": attrAcquiredAt,
			"#hb": attrHeartbeatAt, "#released": attrReleased, "#gen": attrGeneration, "#kind": attrTakeoverKind,
			"#role": attrRole, "#hv": attrHolderVersion, "#rel": attrReleaseAt,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":owner":  statetable.Str(owner),
			":host":   statetable.Str(host),
			":exp":    statetable.Num(now.Add(ttl).UnixMilli()),
			":nowiso": statetable.Stamp(now),
			":false":  &types.AttributeValueMemberBOOL{Value: false},
			":zero":   statetable.Num(0),
			":one":    statetable.Num(1),
			":kind":   statetable.Str(string(kind)),
			":active": statetable.Str(RoleActive),
			":hv": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
				"owner": statetable.Str(owner), "version": statetable.Str(version.String()),
			}},
		},
		ReturnValues:                        types.ReturnValueAllOld,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	if releaseAt.IsZero() {
		// The moment the previous holder announced is not this one's.
		*in.UpdateExpression += " REMOVE #rel"
	} else {
		*in.UpdateExpression += ", #rel = :rel"
		in.ExpressionAttributeValues[":rel"] = statetable.Num(releaseAt.UnixMilli())
	}
	// Each handoff and failover is counted by the write that makes it.
	if counter := map[Takeover]string{Handoff: attrHandoffs, Failover: attrFailovers}[kind]; counter != "" {
		*in.UpdateExpression += " ADD #count :one"
		in.ExpressionAttributeNames["#count"] = counter
	}
	if cond, ok := takeConditions[kind]; ok {
		in.ConditionExpression = aws.String(cond)
		switch kind {
		case Handoff:
			in.ExpressionAttributeValues[":true"] = &types.AttributeValueMemberBOOL{Value: true}
		case Failover:
			in.ExpressionAttributeValues[":now"] = statetable.Num(now.UnixMilli())
		}
	}
	return in
}

// Checkpoint stores seq as the job's checkpoint and renews the lease, in one
// write conditioned on the lease's owner and generation. It returns
// ErrLeaseLost when that condition fails. pending < 0 means unknown.
func (s *Store) Checkpoint(ctx context.Context, l *Lease, seq json.RawMessage, pending int64) error {
	now := s.Clock.Now()
	vals := map[string]types.AttributeValue{
		":seq":    statetable.Str(string(seq)),
		":nowiso": statetable.Stamp(now),
		":p":      statetable.Num(pending),
		":one":    statetable.Num(1),
	}
	err := s.write(ctx, l, now, "#cp = :seq, #cpat = :nowiso, #pending = :p", "ADD #cps :one",
		map[string]string{"#cp": attrCheckpoint, "#cpat": attrCheckpointAt, "#pending": attrPending, "#cps": attrCheckpoints}, vals)
	if err != nil {
		return fmt.Errorf("write checkpoint %s: %w", l.JobID, err)
	}
	l.Checkpoint = seq
	return nil
}

// Renew extends the lease (the heartbeat) and records the pending count,
// conditioned on owner and generation. It returns ErrLeaseLost when refused.
func (s *Store) Renew(ctx context.Context, l *Lease, pending int64) error {
	now := s.Clock.Now()
	err := s.write(ctx, l, now, "#pending = :p", "", map[string]string{"#pending": attrPending},
		map[string]types.AttributeValue{":p": statetable.Num(pending)})
	if err != nil {
		return fmt.Errorf("renew lease %s: %w", l.JobID, err)
	}
	return nil
}

// NoteLargestBatch records n as the job's largest batch when it is larger
// than the one recorded. It is an observation for operators, not fenced by
// the lease, and changes nothing when the job item does not exist.
func (s *Store) NoteLargestBatch(ctx context.Context, job string, n int64) error {
	err := s.note(ctx, job, "SET #lb = :n", "attribute_exists(#gen) AND (attribute_not_exists(#lb) OR #lb < :n)",
		map[string]string{"#lb": attrLargest, "#gen": attrGeneration}, map[string]types.AttributeValue{":n": statetable.Num(n)})
	if err != nil {
		return fmt.Errorf("note largest batch %s: %w", job, err)
	}
	return nil
}

// NoteSourceAuthFailure records when the source last refused the job's
// credentials. Like NoteLargestBatch, not fenced.
func (s *Store) NoteSourceAuthFailure(ctx context.Context, job string, at time.Time) error {
	err := s.note(ctx, job, "SET #af = :t", "attribute_exists(#gen)",
		map[string]string{"#af": attrAuthFailedAt, "#gen": attrGeneration}, map[string]types.AttributeValue{":t": statetable.Stamp(at)})
	if err != nil {
		return fmt.Errorf("note source auth failure %s: %w", job, err)
	}
	return nil
}

// note applies an update to the job item that the lease does not fence. A
// refused condition (no job item, or nothing to change) is not an error.
func (s *Store) note(ctx context.Context, job, update, cond string, names map[string]string, vals map[string]types.AttributeValue) error {
	_, err := s.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &s.Table,
		Key:                       statetable.Key(job),
		UpdateExpression:          &update,
		ConditionExpression:       &cond,
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: vals,
	})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		return err
	}
	return nil
}

// write applies sets (SET assignments) and tail (an ADD or REMOVE clause, or
// "") together with the lease renewal, conditioned on owner and generation.
func (s *Store) write(ctx context.Context, l *Lease, now time.Time, sets, tail string, names map[string]string, vals map[string]types.AttributeValue) error {
	names["#owner"], names["#gen"], names["#exp"], names["#hb"] = attrOwner, attrGeneration, attrExpiresMS, attrHeartbeatAt
	vals[":owner"] = statetable.Str(l.Owner)
	vals[":gen"] = statetable.Num(l.Generation)
	vals[":exp"] = statetable.Num(now.Add(l.TTL).UnixMilli())
	vals[":hb"] = statetable.Stamp(now)
	expr := "SET " + sets + ", #exp = :exp, #hb = :hb " + tail
	_, err := s.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &s.Table,
		Key:                       statetable.Key(l.JobID),
		UpdateExpression:          &expr,
		ConditionExpression:       aws.String("#owner = :owner AND #gen = :gen"),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: vals,
	})
	if err != nil {
		var ccf *types.ConditionalCheckFailedException
		if errors.As(err, &ccf) {
			return ErrLeaseLost
		}
		return err
	}
	l.RenewedAt = now
	return nil
}

// Release ends the lease so the next poller takes over without waiting for it
// to expire. It returns ErrLeaseLost when the lease was already taken.
func (s *Store) Release(ctx context.Context, l *Lease) error {
	now := s.Clock.Now()
	_, err := s.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                &s.Table,
		Key:                      statetable.Key(l.JobID),
		UpdateExpression:         aws.String("SET #released = :true, #exp = :now, #role = :released"),
		ConditionExpression:      aws.String("#owner = :owner AND #gen = :gen"),
		ExpressionAttributeNames: map[string]string{"#released": attrReleased, "#exp": attrExpiresMS, "#owner": attrOwner, "#gen": attrGeneration, "#role": attrRole},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":true": &types.AttributeValueMemberBOOL{Value: true}, ":now": statetable.Num(now.UnixMilli()),
			":released": statetable.Str(RoleReleased),
			":owner":    statetable.Str(l.Owner), ":gen": statetable.Num(l.Generation),
		},
	})
	if err != nil {
		var ccf *types.ConditionalCheckFailedException
		if errors.As(err, &ccf) {
			return fmt.Errorf("release lease %s: %w", l.JobID, ErrLeaseLost)
		}
		return fmt.Errorf("release lease %s: %w", l.JobID, err)
	}
	return nil
}

// MarkStandby records that owner is waiting for the lease. It touches only
// the standby attributes, so it never interferes with the holder's writes.
func (s *Store) MarkStandby(ctx context.Context, job, owner string) error {
	_, err := s.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                &s.Table,
		Key:                      statetable.Key(job),
		UpdateExpression:         aws.String("SET #sb = :owner, #sbat = :now"),
		ExpressionAttributeNames: map[string]string{"#sb": attrStandby, "#sbat": attrStandbySeen},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":owner": statetable.Str(owner),
			":now":   statetable.Stamp(s.Clock.Now()),
		},
	})
	if err != nil {
		return fmt.Errorf("mark standby %s: %w", job, err)
	}
	return nil
}

// SetCheckpoint overwrites the checkpoint of a job whose lease is held by l
// (typically taken with ForceTake or Acquire by an operator). A nil seq resets
// to the beginning of the feed. It records l's generation as the replay
// epoch: what the poller queues again from there carries it in its FIFO
// deduplication ids, so SQS does not drop it as a repeat of what was queued
// before, within its five-minute window.
func (s *Store) SetCheckpoint(ctx context.Context, l *Lease, seq json.RawMessage) error {
	now := s.Clock.Now()
	names := map[string]string{"#cp": attrCheckpoint, "#cpat": attrCheckpointAt, "#re": attrReplayEpoch}
	vals := map[string]types.AttributeValue{":nowiso": statetable.Stamp(now), ":re": statetable.Num(l.Generation)}
	sets, tail := "#cpat = :nowiso, #re = :re", "REMOVE #cp"
	if seq != nil {
		// As Checkpoint writes it, with the epoch.
		names["#pending"], names["#cps"] = attrPending, attrCheckpoints
		vals[":seq"], vals[":p"], vals[":one"] = statetable.Str(string(seq)), statetable.Num(-1), statetable.Num(1)
		sets, tail = "#cp = :seq, #cpat = :nowiso, #pending = :p, #re = :re", "ADD #cps :one"
	}
	if err := s.write(ctx, l, now, sets, tail, names, vals); err != nil {
		return fmt.Errorf("set checkpoint %s: %w", l.JobID, err)
	}
	l.Checkpoint = seq
	return nil
}

func decode(item map[string]types.AttributeValue) *State {
	st := &State{Pending: -1}
	if len(item) == 0 {
		return st
	}
	st.Exists = true
	str := func(k string) string { return statetable.String(item, k) }
	n := func(k string) int64 { return statetable.Int(item, k) }
	t := func(k string) time.Time { return statetable.Time(item, k) }
	st.Owner = str(attrOwner)
	st.Host = str(attrHost)
	st.Generation = n(attrGeneration)
	st.ExpiresAt = time.UnixMilli(n(attrExpiresMS))
	st.AcquiredAt = t(attrAcquiredAt)
	st.HeartbeatAt = t(attrHeartbeatAt)
	if v, ok := item[attrReleased].(*types.AttributeValueMemberBOOL); ok {
		st.Released = v.Value
	}
	if cp := str(attrCheckpoint); cp != "" {
		st.Checkpoint = json.RawMessage(cp)
	}
	st.CheckpointAt = t(attrCheckpointAt)
	if _, ok := item[attrPending]; ok {
		st.Pending = n(attrPending)
	}
	st.Failovers = n(attrFailovers)
	st.Handoffs = n(attrHandoffs)
	st.Checkpoints = n(attrCheckpoints)
	st.TakeoverKind = Takeover(str(attrTakeoverKind))
	st.Role = str(attrRole)
	st.Standby = str(attrStandby)
	st.StandbySeenAt = t(attrStandbySeen)
	st.LargestBatch = n(attrLargest)
	st.SourceAuthFailedAt = t(attrAuthFailedAt)
	st.ReplayEpoch = n(attrReplayEpoch)
	if hv, ok := item[attrHolderVersion].(*types.AttributeValueMemberM); ok && st.Owner != "" &&
		statetable.String(hv.Value, "owner") == st.Owner {
		st.HolderVersion = statetable.String(hv.Value, "version")
	}
	if _, ok := item[attrReleaseAt]; ok {
		st.ReleaseAt = time.UnixMilli(n(attrReleaseAt))
	}
	return st
}
