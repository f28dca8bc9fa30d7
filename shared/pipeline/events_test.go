package pipeline_test

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// eventsDir holds the sample events; demoConfig is the configuration they
// are written for.
const (
	eventsDir  = "../../events"
	demoConfig = "../../localstack/jobs.json"
)

// sqsSamples are the SQS batches in eventsDir with what each must show.
var sqsSamples = []struct {
	file  string
	check func(t *testing.T, cfg *config.File, ev events.SQSEvent)
}{
	{"sqs-standard.json", checkStandard},
	{"sqs-fifo.json", checkFIFO},
	{"sqs-redriven.json", checkRedriven},
	{"sqs-claim-check.json", checkClaimCheck},
}

// TestSampleEventFiles requires every file in eventsDir to be one of the
// samples tested here.
func TestSampleEventFiles(t *testing.T) {
	t.Parallel()
	known := map[string]bool{"README.md": true, "schedule.json": true}
	for _, s := range sqsSamples {
		known[s.file] = true
	}
	entries, err := os.ReadDir(eventsDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !known[e.Name()] {
			t.Errorf("events/%s is not covered by a test", e.Name())
		}
		delete(known, e.Name())
	}
	for name := range known {
		t.Errorf("events/%s is missing", name)
	}
}

func TestScheduleEvent(t *testing.T) {
	t.Parallel()
	raw := readEvent(t, "schedule.json")
	var ev pipeline.ScheduleEvent
	strictDecode(t, raw, &ev)
	roundTrip(t, raw, &ev)
	cfg := loadDemo(t)
	if cfg.Job(ev.Job) == nil {
		t.Errorf("schedule event names job %q, which %s does not have", ev.Job, demoConfig)
	}
}

func TestSQSEvents(t *testing.T) {
	t.Parallel()
	cfg := loadDemo(t)
	for _, s := range sqsSamples {
		t.Run(s.file, func(t *testing.T) {
			t.Parallel()
			raw := readEvent(t, s.file)
			var ev events.SQSEvent
			strictDecode(t, raw, &ev)
			roundTrip(t, raw, &ev)
			if len(ev.Records) == 0 {
				t.Fatal("no records")
			}
			for i, r := range ev.Records {
				checkRecord(t, fmt.Sprintf("record %d", i), cfg, r)
			}
			s.check(t, cfg, ev)
		})
	}
}

// checkRecord checks what every SQS record has: the fields Lambda sets, the
// digests SQS computes, and a valid envelope for the output of its queue.
func checkRecord(t *testing.T, where string, cfg *config.File, r events.SQSMessage) {
	t.Helper()
	if r.MessageId == "" || r.ReceiptHandle == "" || r.EventSource != "aws:sqs" {
		t.Errorf("%s: messageId %q receiptHandle %q eventSource %q", where, r.MessageId, r.ReceiptHandle, r.EventSource)
	}
	arn := strings.Split(r.EventSourceARN, ":")
	if len(arn) != 6 || arn[0] != "arn" || arn[2] != "sqs" || arn[3] != r.AWSRegion {
		t.Errorf("%s: eventSourceARN %q, awsRegion %q", where, r.EventSourceARN, r.AWSRegion)
		return
	}
	if sum := md5.Sum([]byte(r.Body)); hex.EncodeToString(sum[:]) != r.Md5OfBody {
		t.Errorf("%s: md5OfBody %s is not the digest of the body", where, r.Md5OfBody)
	}
	if got, want := r.Md5OfMessageAttributes, attributesMD5(r.MessageAttributes); got != want {
		t.Errorf("%s: md5OfMessageAttributes = %q, want %q", where, got, want)
	}
	for _, k := range []string{"ApproximateReceiveCount", "SentTimestamp", "SenderId", "ApproximateFirstReceiveTimestamp"} {
		if r.Attributes[k] == "" {
			t.Errorf("%s: attribute %s missing", where, k)
		}
	}
	route, ok := cfg.RouteByQueueName(arn[5])
	if !ok {
		t.Errorf("%s: queue %s is not a work queue of %s", where, arn[5], demoConfig)
		return
	}
	env, err := change.Decode([]byte(r.Body))
	if err != nil {
		t.Errorf("%s: body: %v", where, err)
		return
	}
	if env.Job != route.Job.ID || env.Output != route.Output.ID {
		t.Errorf("%s: envelope for %s/%s on the queue of %s/%s", where, env.Job, env.Output, route.Job.ID, route.Output.ID)
	}
	if route.Output.FIFO() != strings.HasSuffix(arn[5], ".fifo") || (r.Attributes["MessageGroupId"] != "") != route.Output.FIFO() {
		t.Errorf("%s: FIFO attributes %v on queue %s", where, r.Attributes, arn[5])
	}
}

func checkStandard(t *testing.T, _ *config.File, ev events.SQSEvent) {
	deleted := 0
	for _, r := range ev.Records {
		env := mustDecode(t, r)
		if env.Deleted {
			deleted++
		}
		if r.Attributes["ApproximateReceiveCount"] != "1" {
			t.Errorf("%s: first delivery expected, receive count %s", env.DocID, r.Attributes["ApproximateReceiveCount"])
		}
	}
	if deleted == 0 || deleted == len(ev.Records) {
		t.Errorf("want live documents and a deletion, got %d deletions in %d records", deleted, len(ev.Records))
	}
}

func checkFIFO(t *testing.T, _ *config.File, ev events.SQSEvent) {
	lastSeq := map[string]*big.Int{}
	groups := map[string]int{}
	for _, r := range ev.Records {
		env := mustDecode(t, r)
		a := r.Attributes
		if a["MessageGroupId"] != fanout.GroupID(env.DocID) {
			t.Errorf("%s: MessageGroupId %q, the poller sends %q", env.DocID, a["MessageGroupId"], fanout.GroupID(env.DocID))
		}
		if want := fanout.DeduplicationID(env.Job, env.Output, env.DocID, env.Seq, 0); a["MessageDeduplicationId"] != want {
			t.Errorf("%s: MessageDeduplicationId %q, the poller sends %q", env.DocID, a["MessageDeduplicationId"], want)
		}
		// A 128-bit number, in decimal.
		n, ok := new(big.Int).SetString(a["SequenceNumber"], 10)
		if !ok || n.Sign() <= 0 || n.BitLen() > 128 {
			t.Errorf("%s: SequenceNumber %q is not a 128-bit number", env.DocID, a["SequenceNumber"])
			continue
		}
		g := a["MessageGroupId"]
		if prev := lastSeq[g]; prev != nil && n.Cmp(prev) <= 0 {
			t.Errorf("group %s: SequenceNumber %s does not increase", g, n)
		}
		lastSeq[g] = n
		groups[g]++
	}
	if len(groups) < 2 || len(groups) == len(ev.Records) {
		t.Errorf("want several messages of one group and another group, got %v", groups)
	}
}

func checkRedriven(t *testing.T, _ *config.File, ev events.SQSEvent) {
	var byPolicy, byWriter int
	for _, r := range ev.Records {
		env := mustDecode(t, r)
		if src := r.Attributes["DeadLetterQueueSourceArn"]; src != "" {
			byPolicy++
			if src != r.EventSourceARN {
				t.Errorf("%s: DeadLetterQueueSourceArn %s is not the queue it came back to (%s)", env.DocID, src, r.EventSourceARN)
			}
			if n, _ := strconv.Atoi(r.Attributes["ApproximateReceiveCount"]); n < 2 {
				t.Errorf("%s: ApproximateReceiveCount %s, want more than 1", env.DocID, r.Attributes["ApproximateReceiveCount"])
			}
		}
		if a, ok := r.MessageAttributes["failure_attempts"]; ok {
			byWriter++
			for _, k := range []string{"failure_class", "failure_reason", "failure_error", "failure_first_at", "failure_last_at", "failure_output", "failure_job", "doc_id"} {
				if v := r.MessageAttributes[k]; v.StringValue == nil || v.DataType != "String" {
					t.Errorf("%s: message attribute %s = %+v", env.DocID, k, v)
				}
			}
			if a.DataType != "Number" {
				t.Errorf("%s: failure_attempts type %s", env.DocID, a.DataType)
			}
			if got := aws.ToString(r.MessageAttributes["doc_id"].StringValue); got != env.DocID {
				t.Errorf("doc_id attribute %q on the message of %s", got, env.DocID)
			}
		}
	}
	if byPolicy == 0 || byWriter == 0 {
		t.Errorf("want a message moved by the redrive policy and one moved by the writer: %d, %d", byPolicy, byWriter)
	}
}

func checkClaimCheck(t *testing.T, cfg *config.File, ev events.SQSEvent) {
	for _, r := range ev.Records {
		env := mustDecode(t, r)
		if env.DocRef == nil || len(env.Doc) != 0 {
			t.Fatalf("%s: doc_ref %+v with %d bytes of doc; want a pointer instead of the body", env.DocID, env.DocRef, len(env.Doc))
		}
		want := claimcheck.Key(cfg.Stack.Prefix, env.Job, env.Version)
		if env.DocRef.Key != want || env.DocRef.Bucket != cfg.Stack.Bucket {
			t.Errorf("doc_ref %s/%s, the poller writes %s/%s", env.DocRef.Bucket, env.DocRef.Key, cfg.Stack.Bucket, want)
		}
		if env.DocRef.Size <= int64(cfg.Stack.MaxMessageBytes) {
			t.Errorf("doc_ref size %d would have fitted a message (max %d)", env.DocRef.Size, cfg.Stack.MaxMessageBytes)
		}
	}
}

// TestSQSEventDigests sends every sample message to a real queue with its
// message attributes and compares the digests SQS reports with those in the
// files.
func TestSQSEventDigests(t *testing.T) {
	awsCfg := testenv.AWS(t)
	c := sqs.NewFromConfig(awsCfg)
	ctx := t.Context()
	name := testenv.Name(t)
	q, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: &name})
	if err != nil {
		t.Fatalf("create queue: %v", err)
	}
	t.Cleanup(func() { c.DeleteQueue(context.WithoutCancel(ctx), &sqs.DeleteQueueInput{QueueUrl: q.QueueUrl}) })
	for _, s := range sqsSamples {
		var ev events.SQSEvent
		strictDecode(t, readEvent(t, s.file), &ev)
		for i, r := range ev.Records {
			in := &sqs.SendMessageInput{QueueUrl: q.QueueUrl, MessageBody: aws.String(r.Body)}
			if len(r.MessageAttributes) > 0 {
				in.MessageAttributes = map[string]sqstypes.MessageAttributeValue{}
				for k, v := range r.MessageAttributes {
					in.MessageAttributes[k] = sqstypes.MessageAttributeValue{DataType: aws.String(v.DataType), StringValue: v.StringValue}
				}
			}
			out, err := c.SendMessage(ctx, in)
			if err != nil {
				t.Fatalf("%s record %d: send: %v", s.file, i, err)
			}
			if aws.ToString(out.MD5OfMessageBody) != r.Md5OfBody || aws.ToString(out.MD5OfMessageAttributes) != r.Md5OfMessageAttributes {
				t.Errorf("%s record %d: SQS digests body %s attributes %s; the file has %s, %s", s.file, i,
					aws.ToString(out.MD5OfMessageBody), aws.ToString(out.MD5OfMessageAttributes), r.Md5OfBody, r.Md5OfMessageAttributes)
			}
		}
	}
}

func readEvent(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(eventsDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func loadDemo(t *testing.T) *config.File {
	t.Helper()
	cfg, err := config.Load(demoConfig)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// strictDecode decodes raw into v, refusing unknown fields (a misspelt key
// would otherwise vanish silently).
func strictDecode(t *testing.T, raw []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode into %T: %v", v, err)
	}
}

// roundTrip encodes v (decoded from raw) and requires the same document
// back. Keys the file leaves out may come back with their zero value: the
// events types have fields AWS does not always send.
func roundTrip(t *testing.T, raw []byte, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var want, got any
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	dropAbsentZeros(got, want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip through %T changed the event:\n got %s\nwant %s", v, b, raw)
	}
}

func dropAbsentZeros(got, want any) {
	switch g := got.(type) {
	case map[string]any:
		w, _ := want.(map[string]any)
		for k, v := range g {
			if _, ok := w[k]; !ok && (v == nil || v == "" || v == float64(0) || v == false) {
				delete(g, k)
				continue
			}
			dropAbsentZeros(v, w[k])
		}
	case []any:
		w, _ := want.([]any)
		for i := range g {
			if i < len(w) {
				dropAbsentZeros(g[i], w[i])
			}
		}
	}
}

func mustDecode(t *testing.T, r events.SQSMessage) *change.Envelope {
	t.Helper()
	env, err := change.Decode([]byte(r.Body))
	if err != nil {
		t.Fatalf("message %s: %v", r.MessageId, err)
	}
	return env
}

// attributesMD5 is SQS's digest of message attributes ("" without any):
// for each attribute in name order, the name, the data type, a transport
// byte (1 string, 2 binary) and the value, each length-prefixed.
func attributesMD5(attrs map[string]events.SQSMessageAttribute) string {
	if len(attrs) == 0 {
		return ""
	}
	names := make([]string, 0, len(attrs))
	for k := range attrs {
		names = append(names, k)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	field := func(b []byte) {
		n := len(b)
		buf.Write([]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
		buf.Write(b)
	}
	for _, k := range names {
		a := attrs[k]
		field([]byte(k))
		field([]byte(a.DataType))
		if a.StringValue != nil {
			buf.WriteByte(1)
			field([]byte(*a.StringValue))
		} else {
			buf.WriteByte(2)
			field(a.BinaryValue)
		}
	}
	sum := md5.Sum(buf.Bytes())
	return hex.EncodeToString(sum[:])
}
