package awsconf

import (
	"context"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"strconv"

	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// sdkCRC32 is the ID of the DynamoDB client's own check of X-Amz-Crc32.
const sdkCRC32 = "DynamoDB:ResponseChecksumValidation"

// checkCRC32 replaces the DynamoDB client's check of an answer's CRC32 with
// one that checks only the answers that carry X-Amz-Crc32. The SDK's check
// compares an answer without the header with 0: every error answer of
// DynamoDB Local (a lost conditional write, such as a standby's lease
// acquire) then fails it, and the SDK logs "failed to close HTTP response
// body ... response did not match expected checksum, 0, ..." although the
// answer was read whole. Clients of other services have no such check and
// are left alone.
func checkCRC32(stack *middleware.Stack) error {
	if _, ok := stack.Deserialize.Get(sdkCRC32); !ok {
		return nil
	}
	if _, err := stack.Deserialize.Swap(sdkCRC32, responseCRC32{}); err != nil {
		return fmt.Errorf("replace dynamodb checksum check: %w", err)
	}
	return nil
}

// responseCRC32 checks the CRC32 of an answer's body against its
// X-Amz-Crc32 header, when it has one, as the body is closed: a mismatch is
// the Close error, which the SDK logs.
type responseCRC32 struct{}

func (responseCRC32) ID() string { return "ResponseCRC32" }

func (responseCRC32) HandleDeserialize(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (
	middleware.DeserializeOutput, middleware.Metadata, error,
) {
	out, md, err := next.HandleDeserialize(ctx, in)
	if err != nil {
		return out, md, err
	}
	resp, ok := out.RawResponse.(*smithyhttp.Response)
	if !ok || resp.Body == nil {
		return out, md, nil
	}
	v := resp.Header.Get("X-Amz-Crc32")
	if v == "" {
		return out, md, nil
	}
	want, perr := strconv.ParseUint(v, 10, 32)
	if perr != nil {
		return out, md, &smithy.DeserializationError{Err: fmt.Errorf("read X-Amz-Crc32 %q: %w", v, perr)}
	}
	h := crc32.NewIEEE()
	resp.Body = &crcBody{r: io.TeeReader(resp.Body, h), c: resp.Body, h: h, want: uint32(want)}
	return out, md, nil
}

// crcBody is a body whose Close reports a CRC32 other than want.
type crcBody struct {
	r    io.Reader
	c    io.Closer
	h    hash.Hash32
	want uint32
}

func (b *crcBody) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *crcBody) Close() error {
	err := b.c.Close()
	if got := b.h.Sum32(); got != b.want {
		return fmt.Errorf("response did not match expected checksum: X-Amz-Crc32 %d, body %d", b.want, got)
	}
	return err
}
