package fanout

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/changes-worker/changes-worker/shared/change"
)

// requestOptions are the options of one SendMessageBatch call of the SDK's
// client (other clients ignore them):
//
//   - the request's JSON body is the one batchBody writes, in one
//     allocation of about its size. The SDK's own serializer, given message
//     bodies that are themselves JSON, grows its buffer several times and
//     copies it once more, for most of the memory a request allocates. The
//     client still sets the headers, signs, sends, retries and reads the
//     answer, of which only the failed entries are decoded.
//   - the MD5 digests of the message bodies in the answer are not checked.
//     They tell whether SQS received the bodies that were sent, which the
//     request's SigV4 signature already makes SQS check: the signature
//     covers the SHA-256 of the whole body, so SQS refuses a request
//     changed on the way. The writer then reads each body as an envelope,
//     which a corrupted body fails.
func requestOptions(in *sqs.SendMessageBatchInput) func(*sqs.Options) {
	return func(o *sqs.Options) {
		o.DisableMessageChecksumValidation = true
		if o.Protocol == nil || !plainEntries(in.Entries) {
			return
		}
		o.Protocol = &presetBody{ClientProtocol: o.Protocol, queueURL: in.QueueUrl, body: batchBody(in)}
	}
}

// plainEntries reports whether entries set only the fields batchBody
// writes: an id, a body and, on a FIFO queue, the group and the
// deduplication id.
func plainEntries(entries []sqstypes.SendMessageBatchRequestEntry) bool {
	for _, e := range entries {
		if e.Id == nil || e.MessageBody == nil || e.DelaySeconds != 0 || e.MessageAttributes != nil || e.MessageSystemAttributes != nil {
			return false
		}
	}
	return true
}

// presetBody is the client's protocol with the body of a SendMessageBatch
// request written beforehand. The protocol serializes the request without
// entries, which sets its method, path and headers, and its body is then
// replaced.
type presetBody struct {
	smithyhttp.ClientProtocol
	queueURL *string
	body     []byte
}

func (p *presetBody) SerializeRequest(ctx context.Context, schema *smithy.OperationSchema, in smithy.Serializable, req *smithyhttp.Request) error {
	if _, ok := in.(*sqs.SendMessageBatchInput); !ok {
		return p.ClientProtocol.SerializeRequest(ctx, schema, in, req)
	}
	if err := p.ClientProtocol.SerializeRequest(ctx, schema, &sqs.SendMessageBatchInput{QueueUrl: p.queueURL}, req); err != nil {
		return err
	}
	sreq, err := req.SetStream(bytes.NewReader(p.body))
	if err != nil {
		return fmt.Errorf("set request body: %w", err)
	}
	*req = *sreq
	return nil
}

// DeserializeResponse reads, of an answer that accepted the request, the
// entries that failed: the sender reads nothing else (the successful
// entries' ids and digests would be many small allocations). Other answers
// are the protocol's to read.
func (p *presetBody) DeserializeResponse(ctx context.Context, schema *smithy.OperationSchema, types *smithy.TypeRegistry, resp *smithyhttp.Response, out smithy.Deserializable) error {
	o, ok := out.(*sqs.SendMessageBatchOutput)
	if !ok || resp.StatusCode < 200 || resp.StatusCode >= 300 {
		return p.ClientProtocol.DeserializeResponse(ctx, schema, types, resp, out)
	}
	buf := answers.Get().(*bytes.Buffer)
	defer answers.Put(buf)
	buf.Reset()
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return &smithy.DeserializationError{Err: fmt.Errorf("read answer: %w", err)}
	}
	if buf.Len() == 0 {
		return nil
	}
	var a struct {
		Failed []struct {
			ID          *string `json:"Id"`
			Code        *string
			Message     *string
			SenderFault bool
		}
	}
	if err := json.Unmarshal(buf.Bytes(), &a); err != nil {
		return &smithy.DeserializationError{Err: fmt.Errorf("decode answer: %w", err)}
	}
	o.Failed = make([]sqstypes.BatchResultErrorEntry, len(a.Failed))
	for i, f := range a.Failed {
		o.Failed[i] = sqstypes.BatchResultErrorEntry{Id: f.ID, Code: f.Code, Message: f.Message, SenderFault: f.SenderFault}
	}
	return nil
}

// answers holds the buffers answers are read into.
var answers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// batchBody writes the JSON body of a SendMessageBatch request of in,
// whose entries are plainEntries.
func batchBody(in *sqs.SendMessageBatchInput) []byte {
	size := 32
	if in.QueueUrl != nil {
		size += len(*in.QueueUrl)
	}
	for _, e := range in.Entries {
		// An envelope's quotes are escaped: about one byte in eight.
		size += 48 + len(*e.Id) + len(*e.MessageBody)*9/8
		if e.MessageGroupId != nil {
			size += 20 + len(*e.MessageGroupId)
		}
		if e.MessageDeduplicationId != nil {
			size += 28 + len(*e.MessageDeduplicationId)
		}
	}
	b := make([]byte, 0, size)
	b = append(b, '{')
	if in.QueueUrl != nil {
		b = append(b, `"QueueUrl":`...)
		b = change.AppendJSONString(b, *in.QueueUrl)
		b = append(b, ',')
	}
	b = append(b, `"Entries":[`...)
	for i, e := range in.Entries {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"Id":`...)
		b = change.AppendJSONString(b, *e.Id)
		b = append(b, `,"MessageBody":`...)
		b = change.AppendJSONString(b, *e.MessageBody)
		if e.MessageGroupId != nil {
			b = append(b, `,"MessageGroupId":`...)
			b = change.AppendJSONString(b, *e.MessageGroupId)
		}
		if e.MessageDeduplicationId != nil {
			b = append(b, `,"MessageDeduplicationId":`...)
			b = change.AppendJSONString(b, *e.MessageDeduplicationId)
		}
		b = append(b, '}')
	}
	return append(b, "]}"...)
}
