package awsconf_test

import (
	"context"
	"hash/crc32"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/logging"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

// TestLogger: the SDK's lines become slog records at the matching level,
// with the request's context.
func TestLogger(t *testing.T) {
	t.Parallel()
	type key struct{}
	var out stack.Capture
	h := &ctxHandler{Handler: slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelWarn}), key: key{}}
	l := awsconf.Logger(slog.New(h))
	l.Logf(logging.Debug, "dropped %d", 1)
	l.(logging.ContextLogger).WithContext(context.WithValue(t.Context(), key{}, "req-1")).Logf(logging.Warn, "kept %d", 2)
	want := `{"level":"WARN","msg":"aws sdk","detail":"kept 2","request":"req-1"}` + "\n"
	if got := out.String(); !strings.HasSuffix(got, want) || strings.Contains(got, "dropped") {
		t.Errorf("log = %q, want only a record ending %q", got, want)
	}
	awsconf.Logger(nil).Logf(logging.Warn, "to nowhere")
}

// ctxHandler adds the context's value at key as "request", and drops the
// time.
type ctxHandler struct {
	slog.Handler
	key any
}

func (h *ctxHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Time = time.Time{}
	if v, ok := ctx.Value(h.key).(string); ok {
		r.AddAttrs(slog.String("request", v))
	}
	return h.Handler.Handle(ctx, r)
}

// TestDynamoDBResponseChecksum: the CRC32 of a DynamoDB answer is checked
// when the answer carries X-Amz-Crc32, and an answer without it (DynamoDB
// Local's and some other endpoints' error answers) is not compared with 0:
// the SDK said "failed to close HTTP response body ... response did not
// match expected checksum, 0, ..." for every such answer, such as the
// conditional write a standby's lease acquire loses.
func TestDynamoDBResponseChecksum(t *testing.T) {
	t.Parallel()
	const notFound = `{"__type":"com.amazonaws.dynamodb.v20120810#ResourceNotFoundException","Message":"Cannot do operations on a non-existent table"}`
	const item = `{"Item":{"k":{"S":"x"}}}`
	tests := []struct {
		name   string
		status int
		crc    string // X-Amz-Crc32: "" for none, "right" for the body's
		body   string
		warn   bool // the SDK reports a mismatch
	}{
		{name: "error without crc", status: 400, body: notFound},
		{name: "answer without crc", status: 200, body: item},
		{name: "answer with its crc", status: 200, crc: "right", body: item},
		{name: "answer with a wrong crc", status: 200, crc: "1", body: item, warn: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/x-amz-json-1.0")
				switch tt.crc {
				case "":
				case "right":
					w.Header().Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE([]byte(tt.body))), 10))
				default:
					w.Header().Set("X-Amz-Crc32", tt.crc)
				}
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
			}))
			t.Cleanup(srv.Close)
			var out stack.Capture
			cfg, err := awsconf.Load(t.Context(), slog.New(slog.NewJSONHandler(&out, nil)))
			if err != nil {
				t.Fatal(err)
			}
			cfg.Credentials = credentials.NewStaticCredentialsProvider("test", "test", "")
			cfg.RetryMaxAttempts = 1
			cfg.Region = "us-east-1"
			db := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(srv.URL) })
			_, _ = db.GetItem(t.Context(), &dynamodb.GetItemInput{TableName: aws.String("t"), Key: map[string]types.AttributeValue{"k": &types.AttributeValueMemberS{Value: "x"}}})
			got := strings.Contains(out.String(), "checksum")
			if got != tt.warn {
				t.Errorf("log %q: checksum warning %t, want %t", out.String(), got, tt.warn)
			}
			if tt.warn && !strings.Contains(out.String(), `"level":"WARN","msg":"aws sdk","detail":"failed to close HTTP response body`) {
				t.Errorf("log %q: want the SDK's warning as a structured WARN record", out.String())
			}
		})
	}
}
