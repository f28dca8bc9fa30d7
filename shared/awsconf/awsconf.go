// Package awsconf loads the AWS SDK configuration the same way everywhere: the
// SDK's default chain, so the standard AWS_ENDPOINT_URL selects a local
// emulator and nothing in the code branches on the endpoint.
package awsconf

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Load returns the default SDK configuration.
func Load(ctx context.Context) (aws.Config, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return aws.Config{}, fmt.Errorf("load aws config: %w", err)
	}
	return cfg, nil
}

// S3Options applies S3_USE_PATH_STYLE: emulators reached by IP address need
// path-style bucket addressing, which AWS also still serves.
func S3Options(o *s3.Options) {
	if v, _ := strconv.ParseBool(os.Getenv("S3_USE_PATH_STYLE")); v {
		o.UsePathStyle = true
	}
}
