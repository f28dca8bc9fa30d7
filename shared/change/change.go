// Package change defines the message that travels from the poller to the
// writers: a versioned JSON envelope around one document change, and the
// observation version that orders changes of a job.
package change

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// EnvelopeVersion is the schema version written in every envelope.
const EnvelopeVersion = 1

// Version is the position of a change in the order the job's single reader
// observed the feed: the poller's lease generation, then a counter the poller
// increments for every change it sends. A change with a higher version was
// observed later and so reflects newer source state; sinks apply a change only
// if its version is higher than the one they hold.
type Version struct {
	Generation int64 `json:"generation"`
	Counter    int64 `json:"counter"`
}

// Compare returns -1, 0 or +1 as v is older than, equal to or newer than w.
func (v Version) Compare(w Version) int {
	switch {
	case v.Generation < w.Generation:
		return -1
	case v.Generation > w.Generation:
		return 1
	case v.Counter < w.Counter:
		return -1
	case v.Counter > w.Counter:
		return 1
	}
	return 0
}

// String returns "generation.counter".
func (v Version) String() string { return fmt.Sprintf("%d.%d", v.Generation, v.Counter) }

// Envelope is one document change for one output.
type Envelope struct {
	V      int    `json:"v"`
	Job    string `json:"job"`
	Output string `json:"output"`
	DocID  string `json:"doc_id"`
	Rev    string `json:"rev"`
	// Seq is the source's sequence of this change, exactly as the source sent it.
	Seq     json.RawMessage `json:"seq"`
	Deleted bool            `json:"deleted,omitempty"`
	// Removed is set when Sync Gateway reports the document left the reader's channels.
	Removed bool `json:"removed,omitempty"`
	Version
	EnqueuedAt time.Time `json:"enqueued_at"`
	// Doc is the document body; absent for tombstones or when DocRef is set.
	Doc json.RawMessage `json:"doc,omitempty"`
	// DocRef points at the body in S3 when the envelope would not fit a message.
	DocRef *ObjectRef `json:"doc_ref,omitempty"`
}

// ObjectRef locates an S3 object (the claim check of a large body).
type ObjectRef struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	Size   int64  `json:"size"`
}

// Tombstone reports whether the change removes the document from outputs.
func (e *Envelope) Tombstone() bool { return e.Deleted || e.Removed }

// SeqText returns the seq as compact JSON text, or as sent when it is not
// valid JSON: the form outputs show it in (headers, object metadata).
func (e *Envelope) SeqText() string {
	var b bytes.Buffer
	if err := json.Compact(&b, e.Seq); err != nil {
		return string(e.Seq)
	}
	return b.String()
}

// ErrInvalid marks an envelope that cannot be decoded or is incomplete. It is
// permanent: retrying the same bytes can never succeed.
var ErrInvalid = errors.New("invalid envelope")

// Decode parses and checks a message body.
func Decode(body []byte) (*Envelope, error) {
	var e Envelope
	if err := json.Unmarshal(body, &e); err != nil {
		return nil, fmt.Errorf("%w: decode: %v", ErrInvalid, err)
	}
	if err := e.Check(); err != nil {
		return nil, err
	}
	return &e, nil
}

// Check reports what an envelope lacks.
func (e *Envelope) Check() error {
	var missing []error
	if e.V != EnvelopeVersion {
		missing = append(missing, fmt.Errorf("v is %d, want %d", e.V, EnvelopeVersion))
	}
	if e.Job == "" {
		missing = append(missing, errors.New("job is empty"))
	}
	if e.Output == "" {
		missing = append(missing, errors.New("output is empty"))
	}
	if e.DocID == "" {
		missing = append(missing, errors.New("doc_id is empty"))
	}
	if e.Generation < 1 || e.Counter < 1 {
		missing = append(missing, fmt.Errorf("version %s must have generation and counter >= 1", e.Version))
	}
	if len(e.Seq) == 0 {
		missing = append(missing, errors.New("seq is empty"))
	}
	if !e.Tombstone() && len(e.Doc) == 0 && e.DocRef == nil {
		missing = append(missing, errors.New("doc and doc_ref are both empty on a live document"))
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalid, errors.Join(missing...))
	}
	return nil
}
