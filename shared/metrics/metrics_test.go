package metrics

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestFlushWritesEMF(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	r := New(&buf, map[string]string{"Job": "orders"})
	r.now = func() time.Time { return time.UnixMilli(1700000000000) }
	r.Add(ChangesRead, 5, Count)
	r.Add(ChangesRead, 7, Count)
	r.AddHighRes(Role, 1, None)
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("record is not JSON: %v\n%s", err, buf.Bytes())
	}
	want := map[string]any{
		"Job":         "orders",
		"ChangesRead": []any{5.0, 7.0},
		"Role":        1.0,
		"_aws": map[string]any{
			"Timestamp": 1700000000000.0,
			"CloudWatchMetrics": []any{map[string]any{
				"Namespace":  "ChangesWorker",
				"Dimensions": []any{[]any{"Job"}},
				"Metrics": []any{
					map[string]any{"Name": "ChangesRead", "Unit": "Count"},
					map[string]any{"Name": "Role", "Unit": "None", "StorageResolution": 1.0},
				},
			}},
		},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("EMF record (-want +got):\n%s", d)
	}
	buf.Reset()
	if err := r.Flush(); err != nil || buf.Len() != 0 {
		t.Errorf("second flush wrote %q (err %v), want nothing", buf.String(), err)
	}
}
