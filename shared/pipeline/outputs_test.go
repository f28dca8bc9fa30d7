package pipeline

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver/httpsink"
	"github.com/changes-worker/changes-worker/shared/deliver/pgsink"
	"github.com/changes-worker/changes-worker/shared/deliver/s3sink"
	"github.com/changes-worker/changes-worker/shared/secret"
)

// TestOutputImplementations: an output's type selects its sink and state
// reader; an HTTP output has a sink and no state.
func TestOutputImplementations(t *testing.T) {
	t.Parallel()
	// The pool connects lazily: no database is needed to open it.
	const dsn = "postgres://u:p@127.0.0.1:1/db?sslmode=disable"
	d := &Deps{
		Secrets: &secret.Resolver{Lookup: func(name string) (string, bool) { return dsn, name == "PG_DSN" }},
		S3:      s3.New(s3.Options{Region: "us-east-1"}),
	}
	t.Cleanup(d.Close)
	tests := []struct {
		name      string
		out       *config.Output
		wantSink  string
		wantState string // "" for no state
		wantErr   string
	}{
		{
			name:      "postgres",
			out:       &config.Output{ID: "pg", Type: config.OutputPostgres, Postgres: &config.PostgresOutput{DSN: config.SecretRef{Env: "PG_DSN"}, Table: "t", MaxConns: 1}},
			wantSink:  fmt.Sprintf("%T", &pgsink.Sink{}),
			wantState: fmt.Sprintf("%T", &pgsink.State{}),
		},
		{
			name:      "s3",
			out:       &config.Output{ID: "archive", Type: config.OutputS3, S3: &config.S3Output{Bucket: "b", Prefix: "p/"}},
			wantSink:  fmt.Sprintf("%T", &s3sink.Sink{}),
			wantState: fmt.Sprintf("%T", &s3sink.State{}),
		},
		{
			name:     "http",
			out:      &config.Output{ID: "rest", Type: config.OutputHTTP, HTTP: &config.HTTPOutput{URL: "http://127.0.0.1:1/{doc_id}", Method: "PUT", Timeout: config.Duration(time.Second)}},
			wantSink: fmt.Sprintf("%T", &httpsink.Sink{}),
		},
		{
			name:    "no settings",
			out:     &config.Output{ID: "x", Type: config.OutputS3},
			wantErr: "output x has no settings",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sink, err := d.Sink(t.Context(), config.Route{Output: tt.out})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("Sink error = %v, want %q", err, tt.wantErr)
				}
				if _, err := d.State(t.Context(), tt.out); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("State error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Sink: %v", err)
			}
			if got := fmt.Sprintf("%T", sink); got != tt.wantSink {
				t.Errorf("Sink is a %s, want %s", got, tt.wantSink)
			}
			st, err := d.State(t.Context(), tt.out)
			if tt.wantState == "" {
				var ns *NoStateError
				if !errors.As(err, &ns) || ns.Type != tt.out.Type || ns.Reason == "" || st != nil {
					t.Errorf("State = %v, %v; want a NoStateError for type %s", st, err, tt.out.Type)
				}
				return
			}
			if err != nil {
				t.Fatalf("State: %v", err)
			}
			if got := fmt.Sprintf("%T", st); got != tt.wantState {
				t.Errorf("State is a %s, want %s", got, tt.wantState)
			}
		})
	}
}
