package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// sampleEvent is the path of a file in events/.
func sampleEvent(name string) string { return filepath.Join("..", "..", "events", name) }

// invokeWriter runs `changesctl invoke writer` and decodes the batch response.
func (s *testStack) invokeWriter(event string, args ...string) events.SQSEventResponse {
	s.t.Helper()
	out := s.mustCLI(s.t.Context(), append([]string{"invoke", "writer", "--event", event}, args...)...)
	var resp events.SQSEventResponse
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&resp); err != nil {
		s.t.Fatalf("invoke writer printed %q: %v", out, err)
	}
	return resp
}

// TestInvokeWriterSamples feeds every sample SQS event to the real writer
// through `changesctl invoke writer`, pointed at the test stack's outputs,
// and checks what reached PostgreSQL.
func TestInvokeWriterSamples(t *testing.T) {
	s := newTestStack(t, outPG, outPGFIFO)

	// Standard queue: two live documents and a deletion.
	if resp := s.invokeWriter(sampleEvent("sqs-standard.json"), "--job", "orders", "--output", outPG); len(resp.BatchItemFailures) != 0 {
		t.Fatalf("standard batch: failures %v", resp.BatchItemFailures)
	}
	for doc, want := range map[string]struct {
		rev     string
		counter int64
	}{
		"order-000042": {"1-5e0b8a3f0c1d4e2a9b7c6d5e4f3a2b1c", 1204},
		"order/000013": {"2-8c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f", 1205},
		"order-000021": {"", 1206}, // deleted: a version, no data row
	} {
		rev, v := s.pgRev(outPG, doc)
		if rev != want.rev || v.Generation != 3 || v.Counter != want.counter {
			t.Errorf("%s: rev %q version %s, want %q 3.%d", doc, rev, v, want.rev, want.counter)
		}
	}

	// FIFO queue: the later change of a group wins.
	if resp := s.invokeWriter(sampleEvent("sqs-fifo.json"), "--job", "orders", "--output", outPGFIFO); len(resp.BatchItemFailures) != 0 {
		t.Fatalf("fifo batch: failures %v", resp.BatchItemFailures)
	}
	if rev, v := s.pgRev(outPGFIFO, "order-000042"); rev != "2-b2c3d4e5f60718293a4b5c6d7e8f90a1" || v.Counter != 1209 {
		t.Errorf("fifo order-000042: rev %q version %s, want the second change (3.1209)", rev, v)
	}
	if rev, _ := s.pgRev(outPGFIFO, "commande-000017-été-注文"); rev != "3-c3d4e5f60718293a4b5c6d7e8f90a1b2" {
		t.Errorf("fifo commande-000017-été-注文: rev %q", rev)
	}

	// Redriven from the DLQ: delivered like any other change.
	if resp := s.invokeWriter(sampleEvent("sqs-redriven.json"), "--job", "orders", "--output", outPG); len(resp.BatchItemFailures) != 0 {
		t.Fatalf("redriven batch: failures %v", resp.BatchItemFailures)
	}
	for doc, want := range map[string]string{"order-000108": "4-d4e5f60718293a4b5c6d7e8f90a1b2c3", "order-000109": "1-e5f60718293a4b5c6d7e8f90a1b2c3d4"} {
		if rev, _ := s.pgRev(outPG, doc); rev != want {
			t.Errorf("redriven %s: rev %q, want %q", doc, rev, want)
		}
	}

	// Claim check: the body comes from the object the pointer names.
	raw, err := os.ReadFile(sampleEvent("sqs-claim-check.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ev events.SQSEvent
	if err := json.Unmarshal(raw, &ev); err != nil {
		t.Fatal(err)
	}
	env, err := change.Decode([]byte(ev.Records[0].Body))
	if err != nil {
		t.Fatal(err)
	}
	// The object has exactly the size the envelope declares, and is where
	// the test configuration's poller would have put it: invoke points the
	// sample's reference at the configuration's stack bucket.
	head, tail := `{"_id":"order-000500","_rev":"`+env.Rev+`","type":"order","notes":"`, `"}`
	wantNotes := int(env.DocRef.Size) - len(head) - len(tail)
	putObject(t, s, s.Config.Stack.Bucket, claimcheck.Key(s.Config.Stack.Prefix, "orders", env.Version), head+strings.Repeat("x", wantNotes)+tail)
	if resp := s.invokeWriter(sampleEvent("sqs-claim-check.json"), "--job", "orders", "--output", outPG); len(resp.BatchItemFailures) != 0 {
		t.Fatalf("claim-check batch: failures %v", resp.BatchItemFailures)
	}
	var notes int
	pool := testenv.Postgres(t)
	data, _ := s.pgTables(outPG)
	if err := pool.QueryRow(t.Context(), `SELECT length(body->>'notes') FROM `+data+` WHERE doc_id = $1`, "order-000500").Scan(&notes); err != nil || notes != wantNotes {
		t.Errorf("claim-checked order-000500: notes of %d characters (%v), want the body from S3 (%d)", notes, err, wantNotes)
	}
	if d := s.depth(s.queues(outPG).DLQURL); d != 0 {
		t.Errorf("pg DLQ holds %d messages after the samples, want 0", d)
	}
}

// TestInvokeWriterMissingClaimCheck points a claim check at an object that
// does not exist: a permanent failure, moved to the DLQ, not retried.
func TestInvokeWriterMissingClaimCheck(t *testing.T) {
	s := newTestStack(t, outPG)
	raw, err := os.ReadFile(sampleEvent("sqs-claim-check.json"))
	if err != nil {
		t.Fatal(err)
	}
	missing := claimcheck.Prefix(s.Config.Stack.Prefix, "orders") + "3/missing-" + s.Name + ".json"
	raw = bytes.Replace(raw, []byte(`claim-check/orders/changes-worker/3/1210.json`), []byte(missing), 1)
	event := tempFile(t, "event.json", raw)
	if resp := s.invokeWriter(event, "--job", "orders"); len(resp.BatchItemFailures) != 0 {
		t.Errorf("failures %v: a permanent failure goes to the DLQ, not back to the queue", resp.BatchItemFailures)
	}
	if d := s.depth(s.queues(outPG).DLQURL); d != 1 {
		t.Fatalf("DLQ holds %d messages, want the one with the missing claim check", d)
	}
	out := s.mustCLI(t.Context(), "dlq", "list", "--json")
	if !strings.Contains(out, "claim_check_missing") {
		t.Errorf("dlq list does not name the reason claim_check_missing:\n%s", out)
	}
}

func TestInvokeErrors(t *testing.T) {
	s := newTestStack(t, outPG)
	badField := tempFile(t, "bad.json", []byte(`{"job": "orders", "jobs": ["x"]}`))
	// A command line that cannot be right exits 64, a failed invocation 1.
	tests := []struct {
		name   string
		args   []string
		status int
		want   string
	}{
		{"no function", []string{"invoke"}, exitUsage, "name the function"},
		{"no event", []string{"invoke", "writer"}, exitUsage, "--event is required"},
		{"unknown field", []string{"invoke", "poller", "--event", badField}, exitFailed, `unknown field "jobs"`},
		{"queue of another configuration", []string{"invoke", "writer", "--event", sampleEvent("sqs-standard.json")}, exitFailed, `queue "changes-worker-orders-pg", which is no work queue of this configuration`},
		{"poller of an unknown job", []string{"invoke", "poller", "--event", sampleEvent("schedule.json"), "--job", "nosuch", "--function-timeout", "5s"}, exitFailed, `no job "nosuch"`},
		{"schedule event given to the writer", []string{"invoke", "writer", "--event", sampleEvent("schedule.json")}, exitFailed, `unknown field "job"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, err := s.cli(t.Context(), "", tt.args...)
			if exitCode(err) != tt.status || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("exit %d, error %v; want exit %d and an error containing %q\nstdout: %s\nstderr: %s", exitCode(err), err, tt.status, tt.want, stdout, stderr)
			}
			if stdout != "" {
				t.Errorf("printed a response on failure: %s", stdout)
			}
		})
	}
	if d := s.depth(s.queues(outPG).DLQURL); d != 0 {
		t.Errorf("refused invocations sent %d messages to the DLQ", d)
	}
}

// TestInvokePoller runs the poller once on the sample schedule event: it
// takes the lease, reads the source and queues every change.
func TestInvokePoller(t *testing.T) {
	s := newTestStack(t, outPG)
	for _, id := range []string{"a", "b", "c"} {
		s.putDoc(id, map[string]any{"n": id}, "")
	}
	out := s.mustCLI(t.Context(), "invoke", "poller", "--event", sampleEvent("schedule.json"), "--function-timeout", "6s")
	var res struct {
		Role       string
		Generation int64
		Read       int
		Enqueued   int
		CaughtUp   bool
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("invoke poller printed %q: %v", out, err)
	}
	if res.Role != "active" || res.Generation < 1 || res.Read != 3 || res.Enqueued != 3 || !res.CaughtUp {
		t.Errorf("poller result %+v, want active, 3 read and queued, caught up", res)
	}
	if d := s.depth(s.queues(outPG).WorkURL); d != 3 {
		t.Errorf("work queue holds %d messages, want 3", d)
	}
}

func putObject(t *testing.T, s *testStack, bucket, key, body string) {
	t.Helper()
	ctx := t.Context()
	_, err := s.Deps.S3.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &bucket})
	var owned *s3types.BucketAlreadyOwnedByYou
	var exists *s3types.BucketAlreadyExists
	if err != nil && !errors.As(err, &owned) && !errors.As(err, &exists) {
		t.Fatalf("create bucket %s: %v", bucket, err)
	}
	if _, err := s.Deps.S3.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader(body), ContentType: aws.String("application/json")}); err != nil {
		t.Fatalf("put %s/%s: %v", bucket, key, err)
	}
}
