package s3sink

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/delivertest"
)

// countingGets is a state client that counts the bodies GetObject returns.
type countingGets struct {
	StateAPI
	mu     sync.Mutex
	bodies int
}

func (c *countingGets) GetObject(ctx context.Context, in *s3.GetObjectInput, optFns ...func(*s3.Options)) (*s3.GetObjectOutput, error) {
	out, err := c.StateAPI.GetObject(ctx, in, optFns...)
	if err == nil {
		c.mu.Lock()
		c.bodies++
		c.mu.Unlock()
	}
	return out, err
}

// TestCompareContent tampers with objects the sink wrote and compares them
// with the source bodies, against the AWS emulator.
func TestCompareContent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, client := newSink(t)
	counted := &countingGets{StateAPI: client}
	st, err := NewState(counted, config.S3Output{Bucket: s.bucket, Prefix: s.prefix, KeyTemplate: s.tmpl})
	if err != nil {
		t.Fatal(err)
	}
	body := func(id string) json.RawMessage {
		return json.RawMessage(`{"_id":"` + id + `","_rev":"1-` + id + `","total":12.50,"items":[{"sku":"x"}]}`)
	}
	var changes []*change.Envelope
	for i, id := range []string{"same", "respaced", "tampered", "gone", "not-json"} {
		c := live(id, "1-"+id, v(1, int64(i+1)))
		c.Doc = body(id)
		changes = append(changes, c)
	}
	for i, err := range s.Apply(ctx, changes) {
		if err != nil {
			t.Fatalf("apply %s: %v", changes[i].DocID, err)
		}
	}
	put := func(id, content string) {
		t.Helper()
		_, err := client.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.Key(id)), Body: strings.NewReader(content)})
		if err != nil {
			t.Fatalf("put %s: %v", id, err)
		}
	}
	// The same JSON value in other bytes (as another request of the source
	// may send it) is the same content.
	put("respaced", `{ "items": [ {"sku": "x"} ], "total": 12.5, "_rev": "1-respaced", "_id": "respaced" }`)
	put("tampered", `{"_id":"tampered","_rev":"1-tampered","total":13,"items":[{"sku":"x"}]}`)
	put("not-json", `{"_id":`)
	if _, err := client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.Key("gone"))}); err != nil {
		t.Fatal(err)
	}

	var docs []deliver.SourceDoc
	for _, c := range changes {
		docs = append(docs, deliver.SourceDoc{ID: c.DocID, Rev: c.Rev, Body: c.Doc})
	}
	delivertest.CheckContent(t, st, docs, map[string]string{
		"tampered": "the stored object differs from the source's body",
		"not-json": "the stored object differs from the source's body",
		"gone":     "no object",
	})
	// The object whose bytes are the source body's was not transferred:
	// S3 answered 304 to its MD5.
	if counted.bodies != 3 {
		t.Errorf("%d objects transferred, want 3 (respaced, tampered, not-json)", counted.bodies)
	}

	if _, err := st.CompareContent(ctx, []deliver.SourceDoc{{ID: "same", Rev: "1-same", Body: json.RawMessage(`{"_id":`)}}); err == nil {
		t.Errorf("CompareContent with a source body that is not JSON: no error")
	}
}

func TestSameJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		a, b string
		want bool
	}{
		{"identical", `{"a":1}`, `{"a":1}`, true},
		{"member order and spacing", `{"a":1,"b":[true,null]}`, ` { "b" : [ true , null ] , "a" : 1 } `, true},
		{"numbers by value", `[1.50, -0, 1e2, 0.001, 100]`, `[1.5, 0, 100, 1e-3, 1.00e2]`, true},
		{"escapes", `"\u00e9\/"`, `"é/"`, true},
		{"last duplicate member counts", `{"a":1,"a":2}`, `{"a":2}`, true},
		{"other number", `{"a":1}`, `{"a":1.0001}`, false},
		{"number and string", `{"a":1}`, `{"a":"1"}`, false},
		{"array order", `[1,2]`, `[2,1]`, false},
		{"extra member", `{"a":1}`, `{"a":1,"b":null}`, false},
		{"huge exponents", `1e99999999999999999999`, `1e99999999999999999999`, true},
		{"stored is not JSON", `{"a":`, `{"a":1}`, false},
		{"stored has trailing data", `{"a":1} x`, `{"a":1}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := sameJSON([]byte(tt.a), []byte(tt.b))
			if err != nil || got != tt.want {
				t.Errorf("sameJSON(%s, %s) = %t, %v; want %t", tt.a, tt.b, got, err, tt.want)
			}
		})
	}
}
