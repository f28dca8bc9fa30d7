package pipeline

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/metrics"
)

func TestSourceMeter(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	rec := metrics.New(&out, map[string]string{"Job": "orders"})
	m := sourceMeter(rec)
	m("changes", 200, 20*time.Millisecond)
	m("bulk_get", 401, time.Millisecond)
	m("get", 403, time.Millisecond)
	m("changes", 0, time.Second)
	m("changes", 500, time.Millisecond)
	if err := rec.Flush(); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got[metrics.SourceRequests] != 5.0 || got[metrics.SourceAuthFailures] != 2.0 {
		t.Errorf("requests %v auth failures %v, want 5 and 2", got[metrics.SourceRequests], got[metrics.SourceAuthFailures])
	}
	if times, ok := got[metrics.SourceRequestTime].([]any); !ok || len(times) != 5 || times[0] != 20.0 {
		t.Errorf("request times %v", got[metrics.SourceRequestTime])
	}
}
