// Package quarantine records, per job, what the poller met in the source's
// feed and could not deliver: a row that names no document, which the
// poller skips once it has read it the same way often enough, a page it
// cannot read as sent, which it keeps retrying, and an attachment whose
// copy cannot be made (see Attachment), which the poller delivers without
// it. Entries live in the stack's state table beside the job's item
// (keyed "quarantine/<job>/<position>"; job ids cannot contain '/', so these
// keys never meet a job item), where `changesctl status` lists them and
// alarms count them.
package quarantine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/statetable"
)

// Kind says what an entry is about.
type Kind string

const (
	// Row is a feed row that names no document (no usable id, or not an
	// object). Its entry says the poller skipped it.
	Row Kind = "row"
	// Page is a page the poller cannot read from a position: nothing whole
	// in it before it breaks, or an answer over a limit. The poller does
	// not move past it; the entry says it is blocked there.
	Page Kind = "page"
	// Attachment is an attachment whose copy cannot be made: content that
	// does not match its entry, an entry that cannot be copied, an object
	// S3 refuses, a transfer that kept failing (or a document whose
	// _attachments is not an object). The document was delivered with the
	// entry marked "s3_skipped" and the reason.
	Attachment Kind = "attachment"
)

// Entry is one quarantined row or blocked page.
type Entry struct {
	Job  string
	Kind Kind
	// Seq is the row's seq (nil when it had none), or the position the
	// page is read from (nil: the beginning), or for an attachment the seq
	// of its document's row.
	Seq json.RawMessage
	// After is the position a row without seq followed.
	After json.RawMessage
	// Reason says what is wrong.
	Reason string
	// Raw is the row as the source sent it (at most RawMax bytes); for a
	// page, the start of the answer when known; for an attachment, its
	// _attachments member as the source sent it ({"<name>": {...}}).
	Raw []byte
	// Attempts is how many times it was read and failed the same way.
	Attempts  int64
	FirstSeen time.Time
	LastSeen  time.Time
}

// RawMax bounds Entry.Raw.
const RawMax = 4 << 10

// Item attributes; the key is statetable.KeyAttr.
const (
	attrKind      = "q_kind"
	attrSeq       = "q_seq"
	attrAfter     = "q_after"
	attrReason    = "q_reason"
	attrRaw       = "q_raw"
	attrAttempts  = "q_attempts"
	attrFirstSeen = "q_first_seen"
	attrLastSeen  = "q_last_seen"
	attrExpires   = "expires_at"
)

// keyMax bounds the position part of a key; longer ones are hashed.
const keyMax = 512

// Prefix is the key prefix of a job's entries.
func Prefix(job string) string { return "quarantine/" + job + "/" }

// Key is the entry's item key: the row's seq as JSON text, or for a row
// without one "after <position> <digest of the row>", or for a page
// "page <position>", or for an attachment "attachment <seq> <digest of
// Raw>". The same row, page or attachment met again has the same key.
func (e *Entry) Key() string {
	var pos string
	switch {
	case e.Kind == Page:
		pos = "page " + text(e.Seq)
	case e.Kind == Attachment:
		sum := sha256.Sum256(e.Raw)
		pos = "attachment " + text(e.Seq) + " " + hex.EncodeToString(sum[:8])
	case e.Seq != nil:
		pos = text(e.Seq)
	default:
		sum := sha256.Sum256(e.Raw)
		pos = "after " + text(e.After) + " " + hex.EncodeToString(sum[:8])
	}
	if len(pos) > keyMax {
		sum := sha256.Sum256([]byte(pos))
		pos = "sha256:" + hex.EncodeToString(sum[:])
	}
	return Prefix(e.Job) + pos
}

// text is a position as compact JSON ("beginning" for none).
func text(seq json.RawMessage) string {
	if len(bytes.TrimSpace(seq)) == 0 {
		return "beginning"
	}
	var b bytes.Buffer
	if err := json.Compact(&b, seq); err != nil {
		return string(seq)
	}
	return b.String()
}

// DynamoDB is what Store calls.
type DynamoDB interface {
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
}

// Store writes entries. Safe for concurrent use.
type Store struct {
	DB    DynamoDB
	Table string
	// Retention sets expires_at (for a TTL on the table, if enabled).
	// Default 30 days.
	Retention time.Duration
	Clock     clock.Clock // zero: the system clock
}

// Record writes e: a new entry, or the same one seen again (attempts added,
// last seen moved; first seen kept). It is idempotent only in that a
// repeated call counts one more attempt.
func (s *Store) Record(ctx context.Context, e Entry) error {
	now := s.Clock.Now().UTC()
	retention := s.Retention
	if retention == 0 {
		retention = 30 * 24 * time.Hour
	}
	attempts := max(e.Attempts, 1)
	names := map[string]string{"#first": attrFirstSeen, "#last": attrLastSeen, "#exp": attrExpires, "#n": attrAttempts}
	vals := map[string]types.AttributeValue{
		":n":       statetable.Num(attempts),
		":now":     statetable.Stamp(now),
		":expires": statetable.Num(now.Add(retention).Unix()),
	}
	set := []string{"#first = if_not_exists(#first, :now)", "#last = :now", "#exp = :expires"}
	var remove []string
	field := func(name, attr string, v types.AttributeValue, empty bool) {
		names["#"+name] = attr
		if empty {
			remove = append(remove, "#"+name)
			return
		}
		vals[":"+name] = v
		set = append(set, "#"+name+" = :"+name)
	}
	raw := e.Raw[:min(len(e.Raw), RawMax)]
	field("kind", attrKind, &types.AttributeValueMemberS{Value: string(e.Kind)}, e.Kind == "")
	field("seq", attrSeq, &types.AttributeValueMemberS{Value: string(e.Seq)}, len(e.Seq) == 0)
	field("after", attrAfter, &types.AttributeValueMemberS{Value: string(e.After)}, len(e.After) == 0)
	field("reason", attrReason, &types.AttributeValueMemberS{Value: e.Reason}, e.Reason == "")
	field("raw", attrRaw, &types.AttributeValueMemberB{Value: raw}, len(raw) == 0)
	expr := "SET " + strings.Join(set, ", ") + " ADD #n :n"
	if len(remove) > 0 {
		expr += " REMOVE " + strings.Join(remove, ", ")
	}
	_, err := s.DB.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &s.Table,
		Key:                       statetable.Key(e.Key()),
		UpdateExpression:          &expr,
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: vals,
	})
	if err != nil {
		return fmt.Errorf("record quarantine entry %s: %w", e.Key(), err)
	}
	return nil
}

// List returns a job's entries, oldest first seen first. It scans the state
// table, which holds one item per job besides such entries, so it is cheap.
func List(ctx context.Context, db statetable.Scanner, table, job string) ([]Entry, error) {
	items, err := statetable.ScanPrefix(ctx, db, table, Prefix(job))
	if err != nil {
		return nil, fmt.Errorf("scan quarantine of %s: %w", job, err)
	}
	out := make([]Entry, 0, len(items))
	for _, item := range items {
		out = append(out, decode(job, item))
	}
	slices.SortFunc(out, func(a, b Entry) int { return a.FirstSeen.Compare(b.FirstSeen) })
	return out, nil
}

func decode(job string, item map[string]types.AttributeValue) Entry {
	s := func(k string) string { return statetable.String(item, k) }
	raw := func(k string) json.RawMessage {
		if v := s(k); v != "" {
			return json.RawMessage(v)
		}
		return nil
	}
	e := Entry{Job: job, Kind: Kind(s(attrKind)), Seq: raw(attrSeq), After: raw(attrAfter), Reason: s(attrReason)}
	if v, ok := item[attrRaw].(*types.AttributeValueMemberB); ok {
		e.Raw = v.Value
	}
	e.Attempts = statetable.Int(item, attrAttempts)
	e.FirstSeen = statetable.Time(item, attrFirstSeen)
	e.LastSeen = statetable.Time(item, attrLastSeen)
	return e
}
