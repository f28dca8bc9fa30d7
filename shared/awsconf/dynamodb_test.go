package awsconf_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/statetable"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

// TestStandbyAcquireLogsNothing: on DynamoDB Local, a standby's lease
// acquire loses its conditional write, whose error answer has no
// X-Amz-Crc32; the SDK logs nothing about it (it said "failed to close HTTP
// response body ... did not match expected checksum, 0, ..." once per
// standby invocation).
func TestStandbyAcquireLogsNothing(t *testing.T) {
	t.Parallel()
	testenv.AWS(t) // the local services answer
	var out stack.Capture
	cfg, err := awsconf.Load(t.Context(), slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	db := dynamodb.NewFromConfig(cfg)
	table := testenv.Name(t)
	if err := statetable.Create(t.Context(), db, table); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.DeleteTable(context.WithoutCancel(t.Context()), &dynamodb.DeleteTableInput{TableName: &table})
	})
	s := lease.New(db, table)
	if _, _, err := s.Acquire(t.Context(), "job", "active", "host-a", time.Minute); err != nil {
		t.Fatalf("active acquire: %v", err)
	}
	for range 3 {
		if _, _, err := s.Acquire(t.Context(), "job", "standby", "host-b", time.Minute); !errors.Is(err, lease.ErrLeaseHeld) {
			t.Fatalf("standby acquire = %v, want ErrLeaseHeld", err)
		}
	}
	if strings.Contains(out.String(), "checksum") {
		t.Errorf("the SDK logged %q", out.String())
	}
}
