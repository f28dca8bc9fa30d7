package dlq

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/config"
)

// S3 is the part of the S3 client the archive calls.
type S3 interface {
	PutObject(ctx context.Context, in *s3.PutObjectInput, optFns ...func(*s3.Options)) (*s3.PutObjectOutput, error)
	GetObject(ctx context.Context, in *s3.GetObjectInput, optFns ...func(*s3.Options)) (*s3.GetObjectOutput, error)
	DeleteObject(ctx context.Context, in *s3.DeleteObjectInput, optFns ...func(*s3.Options)) (*s3.DeleteObjectOutput, error)
	ListObjectsV2(ctx context.Context, in *s3.ListObjectsV2Input, optFns ...func(*s3.Options)) (*s3.ListObjectsV2Output, error)
}

// ArchivePrefix is where the DLQ messages of output of job are archived in
// the stack bucket: dlq-archive/<stack prefix>/<job>/<output>/. Stack
// prefixes and ids contain no '/', so no archive's prefix starts another's.
func ArchivePrefix(stack, job, output string) string {
	return config.ArchivePrefix + stack + "/" + job + "/" + output + "/"
}

// Archive is where the DLQ messages of one (job, output) are kept once they
// have waited long enough in the DLQ that SQS would soon drop them: one
// object per message, under ArchivePrefix, which stays until a redrive
// (or a purge) deletes it. Its methods are safe for concurrent use.
type Archive struct {
	S3 S3
	// Bucket is the stack bucket, Stack the stack prefix, Job and Output
	// the route: what the archive's prefix and the claim checks its
	// messages name are made of.
	Bucket, Stack string
	Job, Output   string
}

// NewArchive returns the archive of output o of job j in the stack bucket.
func NewArchive(c S3, f *config.File, j *config.Job, o *config.Output) *Archive {
	return &Archive{S3: c, Bucket: f.Stack.Bucket, Stack: f.Stack.Prefix, Job: j.ID, Output: o.ID}
}

// Prefix is the archive's key prefix.
func (a *Archive) Prefix() string { return ArchivePrefix(a.Stack, a.Job, a.Output) }

// Location is the archive as an s3:// URL.
func (a *Archive) Location() string { return "s3://" + a.Bucket + "/" + a.Prefix() }

// Record is one archived DLQ message: the object's JSON. It holds what a
// redrive sends back (the body and the message attributes, with the failure
// record), what orders it (the time it was queued, the FIFO sequence
// number and group) and, for an envelope whose body travels as a claim
// check, that claim check's content, which expires from the bucket long
// before an archived message may be redriven.
type Record struct {
	MessageID      string               `json:"message_id"`
	DLQ            string               `json:"dlq"`
	SentAt         time.Time            `json:"sent_at"`
	SequenceNumber string               `json:"sequence_number,omitempty"`
	GroupID        string               `json:"group_id,omitempty"`
	Receives       int                  `json:"dlq_receives"`
	ArchivedAt     time.Time            `json:"archived_at"`
	Attributes     map[string]Attribute `json:"attributes,omitempty"`
	// Body is the message body as queued: the envelope JSON, document
	// body included.
	Body string `json:"body"`
	// ClaimCheck is the object the envelope's doc_ref points at (the
	// document body), as read when the message was archived;
	// ClaimCheckError says why it could not be read (the reference was
	// refused, or the object was gone).
	ClaimCheck      []byte `json:"claim_check,omitempty"`
	ClaimCheckError string `json:"claim_check_error,omitempty"`
}

// Attribute is one message attribute of a Record.
type Attribute struct {
	DataType    string `json:"data_type"`
	StringValue string `json:"string_value,omitempty"`
	BinaryValue []byte `json:"binary_value,omitempty"`
}

// Archived says where and when a message was archived.
type Archived struct {
	Key string    `json:"key"`
	At  time.Time `json:"at"`
}

// Key is the object key of the archived message m: its place in the DLQ's
// order, then its DLQ message id, so that archiving a message twice writes
// one object, and a listing gives the messages in the order the DLQ held
// them. The order is the FIFO sequence number (40 digits) and the time it
// was queued (13 digits of Unix milliseconds), or that time alone on a
// standard DLQ.
func (a *Archive) Key(m *Message) string {
	sent := fmt.Sprintf("%013d", max(m.SentAt.UnixMilli(), 0))
	if seq := m.sequence; seq != "" && len(seq) <= 40 && strings.Trim(seq, "0123456789") == "" {
		return a.Prefix() + strings.Repeat("0", 40-len(seq)) + seq + "-" + sent + "-" + m.ID + ".json"
	}
	return a.Prefix() + sent + "-" + m.ID + ".json"
}

// ArchivedKey is what the key of an archived message tells without reading
// it.
type ArchivedKey struct {
	Key       string
	MessageID string
	SentAt    time.Time
}

// parseKey reads an archived message's key; false for a key Key does not
// make.
func (a *Archive) parseKey(key string) (ArchivedKey, bool) {
	name, ok := strings.CutPrefix(key, a.Prefix())
	if !ok {
		return ArchivedKey{}, false
	}
	name, ok = strings.CutSuffix(name, ".json")
	if !ok {
		return ArchivedKey{}, false
	}
	parts := strings.SplitN(name, "-", 2)
	if len(parts) == 2 && len(parts[0]) == 40 {
		parts = strings.SplitN(parts[1], "-", 2)
	}
	if len(parts) != 2 || len(parts[0]) != 13 || parts[1] == "" {
		return ArchivedKey{}, false
	}
	ms, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil {
		return ArchivedKey{}, false
	}
	return ArchivedKey{Key: key, MessageID: parts[1], SentAt: time.UnixMilli(ms).UTC()}, true
}

// Keys calls fn for each archived message, in key order (the DLQ's order),
// until fn returns false. Objects under the prefix whose keys Key does not
// make are skipped.
func (a *Archive) Keys(ctx context.Context, fn func(ArchivedKey) bool) error {
	p := s3.NewListObjectsV2Paginator(a.S3, &s3.ListObjectsV2Input{Bucket: &a.Bucket, Prefix: aws.String(a.Prefix())})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list dlq archive %s: %w", a.Location(), err)
		}
		for _, o := range page.Contents {
			k, ok := a.parseKey(aws.ToString(o.Key))
			if ok && !fn(k) {
				return nil
			}
		}
	}
	return nil
}

// Stats are how many messages the archive holds and when the one queued
// first was queued (zero when it holds none).
type Stats struct {
	Count  int
	Oldest time.Time
}

// Stats lists the archive.
func (a *Archive) Stats(ctx context.Context) (Stats, error) {
	var s Stats
	err := a.Keys(ctx, func(k ArchivedKey) bool {
		s.Count++
		if s.Oldest.IsZero() || k.SentAt.Before(s.Oldest) {
			s.Oldest = k.SentAt
		}
		return true
	})
	return s, err
}

// Put archives m, at Key(m), and returns the key. Putting a message twice
// writes the same object again.
func (a *Archive) Put(ctx context.Context, m *Message, dlqName string, now time.Time) (string, error) {
	rec := Record{
		MessageID: m.ID, DLQ: dlqName, SentAt: m.SentAt, SequenceNumber: m.sequence, GroupID: m.GroupID,
		Receives: m.Receives, ArchivedAt: now.UTC(), Body: m.body,
	}
	if len(m.attributes) > 0 {
		rec.Attributes = make(map[string]Attribute, len(m.attributes))
		for k, v := range m.attributes {
			rec.Attributes[k] = Attribute{DataType: aws.ToString(v.DataType), StringValue: aws.ToString(v.StringValue), BinaryValue: v.BinaryValue}
		}
	}
	if m.Envelope != nil && m.Envelope.DocRef != nil {
		doc, err := claimcheck.Fetch(ctx, a.S3, m.Envelope.DocRef, a.Bucket, a.Stack, a.Job)
		switch {
		case err == nil:
			rec.ClaimCheck = doc
		case permanentClaimCheck(err):
			rec.ClaimCheckError = err.Error()
		default:
			return "", fmt.Errorf("archive dlq message %s: %w", m.ID, err)
		}
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return "", fmt.Errorf("archive dlq message %s: %w", m.ID, err)
	}
	key := a.Key(m)
	_, err = a.S3.PutObject(ctx, &s3.PutObjectInput{
		Bucket: &a.Bucket, Key: &key, Body: bytes.NewReader(b), ContentLength: aws.Int64(int64(len(b))),
		ContentType: aws.String("application/json"),
	})
	if err != nil {
		return "", fmt.Errorf("archive dlq message %s to s3://%s/%s: %w", m.ID, a.Bucket, key, err)
	}
	return key, nil
}

// permanentClaimCheck reports whether err says the claim check can never
// be read.
func permanentClaimCheck(err error) bool {
	for _, e := range []error{claimcheck.ErrRefused, claimcheck.ErrSize, claimcheck.ErrMissing, claimcheck.ErrDenied} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Read returns the archived message at key.
func (a *Archive) Read(ctx context.Context, key string) (Message, error) {
	out, err := a.S3.GetObject(ctx, &s3.GetObjectInput{Bucket: &a.Bucket, Key: &key})
	if err != nil {
		return Message{}, fmt.Errorf("read archived dlq message s3://%s/%s: %w", a.Bucket, key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		return Message{}, fmt.Errorf("read archived dlq message s3://%s/%s: %w", a.Bucket, key, err)
	}
	var rec Record
	if err := json.Unmarshal(b, &rec); err != nil {
		return Message{}, fmt.Errorf("decode archived dlq message s3://%s/%s: %w", a.Bucket, key, err)
	}
	return rec.message(key), nil
}

// message is the archived message as Decode makes a received one, marked
// archived.
func (r Record) message(key string) Message {
	attrs := make(map[string]sqstypes.MessageAttributeValue, len(r.Attributes))
	for k, v := range r.Attributes {
		av := sqstypes.MessageAttributeValue{DataType: aws.String(v.DataType), BinaryValue: v.BinaryValue}
		if v.StringValue != "" || v.BinaryValue == nil {
			av.StringValue = aws.String(v.StringValue)
		}
		attrs[k] = av
	}
	sys := map[string]string{string(sqstypes.MessageSystemAttributeNameSentTimestamp): strconv.FormatInt(r.SentAt.UnixMilli(), 10),
		string(sqstypes.MessageSystemAttributeNameApproximateReceiveCount): strconv.Itoa(r.Receives)}
	if r.GroupID != "" {
		sys[string(sqstypes.MessageSystemAttributeNameMessageGroupId)] = r.GroupID
	}
	if r.SequenceNumber != "" {
		sys[string(sqstypes.MessageSystemAttributeNameSequenceNumber)] = r.SequenceNumber
	}
	m := Decode(sqstypes.Message{MessageId: aws.String(r.MessageID), Body: aws.String(r.Body), Attributes: sys, MessageAttributes: attrs})
	m.Archived = &Archived{Key: key, At: r.ArchivedAt}
	m.claimCheck, m.ClaimCheckError = r.ClaimCheck, r.ClaimCheckError
	return m
}

// Delete removes the archived message at key; deleting one already gone
// succeeds.
func (a *Archive) Delete(ctx context.Context, key string) error {
	if _, err := a.S3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &a.Bucket, Key: &key}); err != nil {
		return fmt.Errorf("delete archived dlq message s3://%s/%s: %w", a.Bucket, key, err)
	}
	return nil
}

// Purge deletes every archived message and returns how many it deleted.
func (a *Archive) Purge(ctx context.Context) (int, error) {
	var keys []string
	if err := a.Keys(ctx, func(k ArchivedKey) bool {
		keys = append(keys, k.Key)
		return true
	}); err != nil {
		return 0, err
	}
	for i, k := range keys {
		if err := a.Delete(ctx, k); err != nil {
			return i, err
		}
	}
	return len(keys), nil
}

// ErrArchiveExpires is CheckKept's error when a lifecycle rule of the
// bucket deletes archived DLQ messages.
var ErrArchiveExpires = errors.New("archived dlq messages expire")

// CheckKept reads the lifecycle configuration of bucket and returns an
// error wrapping ErrArchiveExpires, naming each rule, when an enabled rule
// expires objects under the archive's prefix (dlq-archive/), whatever else
// narrows it: the archive keeps what waits for an operator. It changes
// nothing.
func CheckKept(ctx context.Context, client claimcheck.LifecycleGetter, bucket string) error {
	out, err := client.GetBucketLifecycleConfiguration(ctx, &s3.GetBucketLifecycleConfigurationInput{Bucket: &bucket})
	var apiErr smithy.APIError
	switch {
	case errors.As(err, &apiErr) && apiErr.ErrorCode() == "NoSuchLifecycleConfiguration":
		return nil
	case err != nil:
		return fmt.Errorf("get lifecycle configuration of bucket %s: %w", bucket, err)
	}
	var expiring []error
	for _, r := range out.Rules {
		if r.Status != s3types.ExpirationStatusEnabled || r.Expiration == nil {
			continue
		}
		prefix, _ := claimcheck.RuleScope(r)
		if !strings.HasPrefix(config.ArchivePrefix, prefix) && !strings.HasPrefix(prefix, config.ArchivePrefix) {
			continue
		}
		id := aws.ToString(r.ID)
		switch e := r.Expiration; {
		case e.Date != nil:
			expiring = append(expiring, fmt.Errorf("rule %q deletes archived DLQ messages (%s) on %s", id, config.ArchivePrefix, e.Date.Format("2006-01-02")))
		case aws.ToInt32(e.Days) > 0:
			expiring = append(expiring, fmt.Errorf("rule %q deletes archived DLQ messages (%s) after %d days", id, config.ArchivePrefix, aws.ToInt32(e.Days)))
		}
	}
	if len(expiring) > 0 {
		return fmt.Errorf("bucket %s: %w: %w", bucket, ErrArchiveExpires, errors.Join(expiring...))
	}
	return nil
}

// restoreClaimCheck writes m's claim check back where its envelope points,
// from the archive, so that the writer finds it though the bucket's expiry
// rule deleted it meanwhile. A message without one needs nothing.
func (a *Archive) restoreClaimCheck(ctx context.Context, m *Message) error {
	if m.Envelope == nil || m.Envelope.DocRef == nil || len(m.claimCheck) == 0 {
		return nil
	}
	ref := m.Envelope.DocRef
	if err := claimcheck.Check(ref, a.Bucket, a.Stack, a.Job); err != nil {
		return nil // the writer refuses it whatever the bucket holds
	}
	_, err := a.S3.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(ref.Bucket), Key: aws.String(ref.Key), Body: bytes.NewReader(m.claimCheck),
		ContentLength: aws.Int64(int64(len(m.claimCheck))), ContentType: aws.String("application/json"),
	})
	if err != nil {
		return fmt.Errorf("restore claim check s3://%s/%s of archived dlq message %s: %w", ref.Bucket, ref.Key, m.ID, err)
	}
	return nil
}
