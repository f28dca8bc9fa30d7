package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

// TestCommandsNameTheirAWS: a command that talks to AWS first says on
// stderr, in one line, which endpoint it talks to and which setting named
// it, the per-service endpoints that differ and the region (the account
// only on AWS itself: see TestAccountOf); a command that does not talk to
// AWS says nothing of the kind.
func TestCommandsNameTheirAWS(t *testing.T) {
	ctx, s := parallelStack(t, outPG)
	out, errOut, err := s.cli(ctx, "", "status")
	if err != nil {
		t.Fatalf("status: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	first, _, _ := strings.Cut(errOut, "\n")
	want := []string{"changesctl: AWS endpoint " + os.Getenv("AWS_ENDPOINT_URL") + " (AWS_ENDPOINT_URL)",
		", region " + os.Getenv("AWS_REGION")}
	for _, k := range []string{"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_DYNAMODB"} {
		if v := os.Getenv(k); v != "" && v != os.Getenv("AWS_ENDPOINT_URL") {
			want = append(want, " "+v+" ("+k+")")
		}
	}
	for _, w := range want {
		if !strings.Contains(first, w) {
			t.Errorf("status: the first line on stderr %q lacks %q", first, w)
		}
	}
	if strings.Contains(first, "account") {
		t.Errorf("status: the first line on stderr %q names an account of the emulator", first)
	}
	if strings.Contains(out, "AWS endpoint") {
		t.Errorf("status printed the endpoint on stdout:\n%s", out)
	}

	_, errOut, err = s.cli(ctx, "", "schema")
	if err != nil {
		t.Fatalf("schema: %v", err)
	}
	if strings.Contains(errOut, "AWS endpoint") {
		t.Errorf("schema, which does not talk to AWS, printed %q", errOut)
	}
}

// TestAWSNotice: the notice for the settings a user may have, resolved as
// the SDK resolves them (not parallel: it sets the process environment,
// which the SDK reads).
func TestAWSNotice(t *testing.T) {
	dir := t.TempDir()
	sharedConfig := filepath.Join(dir, "config")
	if err := os.WriteFile(sharedConfig, []byte("[profile local]\nregion = eu-central-1\nendpoint_url = http://127.0.0.1:4566\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		env     map[string]string
		account string // what accountOf returned
		want    string
	}{
		{
			name: "env.sh",
			env: map[string]string{"AWS_ENDPOINT_URL": "http://127.0.0.1:4566", "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:4567",
				"AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:8000", "AWS_REGION": "us-east-1"},
			want: "changesctl: AWS endpoint http://127.0.0.1:4566 (AWS_ENDPOINT_URL), DynamoDB http://127.0.0.1:8000 (AWS_ENDPOINT_URL_DYNAMODB), " +
				"S3 http://127.0.0.1:4567 (AWS_ENDPOINT_URL_S3), region us-east-1",
		},
		{
			name: "a service's setting empty: the general endpoint",
			env:  map[string]string{"AWS_ENDPOINT_URL": "http://127.0.0.1:4566", "AWS_ENDPOINT_URL_S3": "", "AWS_REGION": "us-east-1"},
			want: "changesctl: AWS endpoint http://127.0.0.1:4566 (AWS_ENDPOINT_URL), region us-east-1",
		},
		{
			name:    "AWS itself",
			env:     map[string]string{"AWS_REGION": "eu-west-1"},
			account: "account 123456789012",
			want:    "changesctl: AWS endpoint: AWS itself (no AWS_ENDPOINT_URL), region eu-west-1, account 123456789012",
		},
		{
			name: "AWS itself but SQS",
			env:  map[string]string{"AWS_ENDPOINT_URL_SQS": "http://127.0.0.1:9324", "AWS_DEFAULT_REGION": "eu-west-1"},
			want: "changesctl: AWS endpoint: AWS itself (no AWS_ENDPOINT_URL), SQS http://127.0.0.1:9324 (AWS_ENDPOINT_URL_SQS), region eu-west-1",
		},
		{
			name: "a profile's endpoint_url",
			env:  map[string]string{"AWS_CONFIG_FILE": sharedConfig, "AWS_PROFILE": "local"},
			want: "changesctl: AWS endpoint http://127.0.0.1:4566 (profile local of the shared config), region eu-central-1",
		},
		{
			name: "no region",
			env:  map[string]string{"AWS_ENDPOINT_URL": "http://127.0.0.1:4566"},
			want: "changesctl: AWS endpoint http://127.0.0.1:4566 (AWS_ENDPOINT_URL), no region",
		},
		{
			name: "user information and query are not shown",
			env:  map[string]string{"AWS_ENDPOINT_URL": "https://proxy-user:s3cr3t@proxy.example:8443/aws?token=s3cr3t", "AWS_REGION": "us-east-1"},
			want: "changesctl: AWS endpoint https://…@proxy.example:8443/aws (AWS_ENDPOINT_URL), region us-east-1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearAWSEnv(t)
			t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "none"))
			t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "none"))
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			cfg, err := awsconfig.LoadDefaultConfig(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if got := awsNotice(cfg, os.LookupEnv, tt.account); got != tt.want {
				t.Errorf("notice\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

// clearAWSEnv unsets every AWS_ variable for the rest of the test.
func clearAWSEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "AWS_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

// fakeSTS answers GetCallerIdentity with account, or err.
type fakeSTS struct {
	account  *string
	err      error
	deadline time.Duration // how far off the call's deadline was
}

func (f *fakeSTS) GetCallerIdentity(ctx context.Context, _ *sts.GetCallerIdentityInput, _ ...func(*sts.Options)) (*sts.GetCallerIdentityOutput, error) {
	if d, ok := ctx.Deadline(); ok {
		f.deadline = time.Until(d)
	}
	return &sts.GetCallerIdentityOutput{Account: f.account}, f.err
}

// TestAccount: the account STS names, or why it is unknown; the call has
// accountTimeout at most.
func TestAccount(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		sts  *fakeSTS
		want string
	}{
		{name: "named", sts: &fakeSTS{account: aws.String("123456789012")}, want: "account 123456789012"},
		{name: "refused", sts: &fakeSTS{err: errors.New("api error InvalidClientTokenId: The security token included in the request is invalid")},
			want: "account unknown (api error InvalidClientTokenId: The security token included in the request is invalid)"},
		{name: "none named", sts: &fakeSTS{}, want: "account unknown (STS named none)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := account(t.Context(), tt.sts); got != tt.want {
				t.Errorf("account = %q, want %q", got, tt.want)
			}
			if tt.sts.deadline <= 0 || tt.sts.deadline > accountTimeout {
				t.Errorf("the call had %v left, want at most %v", tt.sts.deadline, accountTimeout)
			}
		})
	}
}

// TestAccountOf: STS is asked only when its calls go to AWS itself.
func TestAccountOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  aws.Config
		want string
	}{
		{name: "AWS itself", cfg: aws.Config{Region: "eu-west-1"}, want: "account 123456789012"},
		{name: "an endpoint setting", cfg: aws.Config{Region: "us-east-1", BaseEndpoint: aws.String("http://127.0.0.1:4566")}, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := &fakeSTS{account: aws.String("123456789012")}
			if got := accountOf(t.Context(), tt.cfg, id); got != tt.want {
				t.Errorf("accountOf = %q, want %q", got, tt.want)
			}
			if asked := id.deadline != 0; asked != (tt.want != "") {
				t.Errorf("STS asked: %t, want %t", asked, tt.want != "")
			}
		})
	}
}
