// Package awsconf loads the AWS SDK configuration the same way everywhere: the
// SDK's default chain, so the standard AWS_ENDPOINT_URL selects a local
// emulator and nothing in the code branches on the endpoint.
package awsconf

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/middleware"
)

// MaxIdleConnsPerHost is how many idle connections the clients keep per
// endpoint. The SDK keeps 10; the poller has up to send_concurrency (128 by
// default) SQS requests in flight and the local writer loops more, and a
// connection closed after every burst costs a TLS handshake on the next.
const MaxIdleConnsPerHost = 128

// Load returns the default SDK configuration, with an HTTP client that keeps
// MaxIdleConnsPerHost idle connections per endpoint, the SDK's own log lines
// sent to log (see Logger), DynamoDB answers checked against their CRC32
// only when they carry one (see checkCRC32), and every request recorded
// when EnvCalls names a file.
func Load(ctx context.Context, log *slog.Logger) (aws.Config, error) {
	hc := awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
		t.MaxIdleConns = 4 * MaxIdleConnsPerHost
		t.MaxIdleConnsPerHost = MaxIdleConnsPerHost
	})
	cfg, err := config.LoadDefaultConfig(ctx, config.WithHTTPClient(hc), config.WithLogger(Logger(log)),
		config.WithAPIOptions([]func(*middleware.Stack) error{checkCRC32}))
	if err != nil {
		return aws.Config{}, fmt.Errorf("load aws config: %w", err)
	}
	recordCalls(&cfg)
	return cfg, nil
}

// S3Options applies S3_USE_PATH_STYLE: emulators reached by IP address need
// path-style bucket addressing, which AWS also still serves.
func S3Options(o *s3.Options) {
	if v, _ := strconv.ParseBool(os.Getenv("S3_USE_PATH_STYLE")); v {
		o.UsePathStyle = true
	}
}
