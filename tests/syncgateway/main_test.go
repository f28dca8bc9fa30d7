// Package syncgateway tests the feed client and the whole pipeline against a
// real Couchbase Sync Gateway 3.1.0 (walrus store, legacy configuration),
// built by localstack/syncgateway.sh and started here on free loopback ports.
// Every test creates its own database and users.
package syncgateway

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// sg is the server shared by the tests of this package; tests that need
// another configuration (TLS) start their own.
var sg *testenv.SyncGateway

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var err error
	if sg, err = testenv.NewSyncGateway(ctx, testenv.SyncGatewayOptions{}); err != nil {
		fmt.Fprintf(os.Stderr, "start sync gateway: %v\n", err)
		return 1
	}
	defer sg.Close()
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "sync gateway log (last lines):\n%s\n", sg.LogTail(60))
	}
	return code
}
