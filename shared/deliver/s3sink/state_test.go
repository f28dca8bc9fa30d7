package s3sink

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/delivertest"
)

// stateOf returns the state reader of the output s writes.
func stateOf(t *testing.T, client StateAPI, s *Sink) *State {
	t.Helper()
	st, err := NewState(client, config.S3Output{Bucket: s.bucket, Prefix: s.prefix, KeyTemplate: s.tmpl})
	if err != nil {
		t.Fatalf("NewState: %v", err)
	}
	return st
}

func TestStateConformance(t *testing.T) {
	t.Parallel()
	delivertest.RunState(t, delivertest.StateHarness{
		Digests: true,
		New: func(t *testing.T) (deliver.Sink, delivertest.StateReader) {
			s, client := newSink(t)
			st := stateOf(t, client, s)
			st.Parallelism = 2 // fewer workers than documents
			return s, st
		},
	})
}

// TestStateReadsTheLayout covers what only S3 has: a deletion whose object is
// still there, objects the template cannot have produced, the digest as the
// body's MD5, the body itself.
func TestStateReadsTheLayout(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, client := newSink(t)
	st := stateOf(t, client, s)
	if err := s.Apply(ctx, []*change.Envelope{live("a", "1-a", v(1, 1)), live("b", "1-b", v(1, 2))}); err[0] != nil || err[1] != nil {
		t.Fatalf("apply: %v", err)
	}
	// A writer stopped between writing b's marker and deleting its object.
	tomb := deleted("b", "2-b", v(1, 3))
	if _, err := s.put(ctx, s.TombstoneKey("b"), object{}, tomb, markerBody(tomb)); err != nil {
		t.Fatalf("write marker: %v", err)
	}
	// Objects under the prefix the sink never wrote.
	for _, key := range []string{testPrefix + "notes.txt", testPrefix + "sub/a.json", testPrefix + "%zz.json"} {
		if _, err := client.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key), Body: strings.NewReader("{}")}); err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
	}

	bodyA := live("a", "1-a", v(1, 1)).Doc
	sum := md5.Sum(bodyA)
	want := map[string]deliver.Stored{
		"a": {ID: "a", Version: v(1, 1), Rev: "1-a", Held: true, Digest: hex.EncodeToString(sum[:])},
		"b": {ID: "b", Version: v(1, 3), Rev: "1-b", Deleted: true},
	}
	got := delivertest.ScanAll(t, st)
	if got["b"].Digest == "" {
		t.Errorf("b: no digest although its object is there")
	}
	if b, ok := got["b"]; ok {
		b.Digest = ""
		got["b"] = b
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Scan (-want +got):\n%s", diff)
	}

	body, ok, err := st.Body(ctx, "a")
	if err != nil || !ok || !bytes.Equal(body, bodyA) {
		t.Errorf("Body(a) = %s, %t, %v; want %s", body, ok, err, bodyA)
	}
	if body, ok, err := st.Body(ctx, "never"); err != nil || ok {
		t.Errorf("Body(never) = %s, %t, %v; want nothing", body, ok, err)
	}
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil || doc["_rev"] != "1-a" {
		t.Errorf("Body(a) decodes to %v, %v", doc, err)
	}
}

// TestKeysToDocIDs: docID inverts Key and refuses keys Key cannot produce.
func TestKeysToDocIDs(t *testing.T) {
	t.Parallel()
	st, err := NewState(noState{}, config.S3Output{Bucket: "b", Prefix: "p/", KeyTemplate: "docs/{doc_id}.json"})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"plain", "with/slash", "dots.and..more", "ünïcode", "100%", "a b+c"} {
		got, ok := st.docID(st.Key(id))
		if !ok || got != id {
			t.Errorf("docID(Key(%q)) = %q, %t", id, got, ok)
		}
	}
	for _, key := range []string{"p/_tombstones/docs/x.json", "p/docs/x.txt", "q/docs/x.json", "p/claim-check/j/1/2.json", "p/docs/a/b.json"} {
		if id, ok := st.docID(key); ok {
			t.Errorf("docID(%q) = %q, want no document", key, id)
		}
	}
}

func TestNewState(t *testing.T) {
	t.Parallel()
	if _, err := NewState(nil, config.S3Output{Bucket: "b"}); err == nil || !strings.Contains(err.Error(), "client is nil") {
		t.Errorf("NewState without a client: error %v", err)
	}
	_, err := NewState(noState{}, config.S3Output{Prefix: "/p//", KeyTemplate: "x.json"})
	for _, w := range []string{"bucket is empty", "{doc_id}", "'/'"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("NewState error = %v, want every problem, also one mentioning %q", err, w)
		}
	}
}

// noState is a StateAPI for tests that make no call.
type noState struct{ StateAPI }
