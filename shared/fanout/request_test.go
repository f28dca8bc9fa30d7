package fanout

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// A request body is JSON whose strings decode to the entries' strings, each
// byte of invalid UTF-8 replaced by U+FFFD, as the SDK's serializer sends
// them.
func FuzzBatchBody(f *testing.F) {
	for _, s := range []string{"", `{"a":"b\\"c"}`, "tab\there", "\x00\x1f\x7f", "bad \xff\xfe utf-8", "ünï \u2028", `\u0000`} {
		f.Add(s, "group")
	}
	f.Fuzz(func(t *testing.T, body, group string) {
		in := &sqs.SendMessageBatchInput{QueueUrl: aws.String("http://q/1/" + group), Entries: []sqstypes.SendMessageBatchRequestEntry{
			{Id: aws.String("0"), MessageBody: &body},
			{Id: aws.String("1"), MessageBody: &group, MessageGroupId: &group, MessageDeduplicationId: &body},
		}}
		var got struct {
			QueueURL string `json:"QueueUrl"`
			Entries  []struct {
				ID                     string `json:"Id"`
				MessageBody            string
				MessageGroupID         *string `json:"MessageGroupId"`
				MessageDeduplicationID *string `json:"MessageDeduplicationId"`
			}
		}
		b := batchBody(in)
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("body %q: %v", b, err)
		}
		body, group = replaceInvalid(body), replaceInvalid(group)
		if got.QueueURL != "http://q/1/"+group || len(got.Entries) != 2 {
			t.Fatalf("body %q decodes to %+v", b, got)
		}
		e0, e1 := got.Entries[0], got.Entries[1]
		if e0.ID != "0" || e0.MessageBody != body || e0.MessageGroupID != nil || e0.MessageDeduplicationID != nil {
			t.Errorf("entry 0 = %+v, want body %q", e0, body)
		}
		if e1.ID != "1" || e1.MessageBody != group || aws.ToString(e1.MessageGroupID) != group || aws.ToString(e1.MessageDeduplicationID) != body {
			t.Errorf("entry 1 = %+v, want body and group %q, deduplication id %q", e1, group, body)
		}
	})
}

// replaceInvalid replaces each byte of invalid UTF-8 in s by U+FFFD.
func replaceInvalid(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}
