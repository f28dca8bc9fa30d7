package metrics

import (
	"bytes"
	"encoding/json"
	"strings"
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

func TestSumAndRecordsOfAtMostHundredValues(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	r := New(&buf, map[string]string{"Job": "orders"})
	for i := range 250 {
		r.Add(SourceRequestTime, float64(i), Milliseconds)
		r.Sum(SourceRequests, 1, Count)
	}
	r.Sum(SourceAuthFailures, 2, Count)
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	var times, requests, failures float64
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	if len(lines) != 3 {
		t.Fatalf("%d records for 250 values, want 3", len(lines))
	}
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal(l, &rec); err != nil {
			t.Fatal(err)
		}
		if v, ok := rec[SourceRequestTime].([]any); ok {
			if len(v) > 100 {
				t.Errorf("record with %d values", len(v))
			}
			times += float64(len(v))
		}
		if v, ok := rec[SourceRequests].(float64); ok {
			requests += v
		}
		if v, ok := rec[SourceAuthFailures].(float64); ok {
			failures += v
		}
	}
	if times != 250 || requests != 250 || failures != 2 {
		t.Errorf("times %v requests %v failures %v, want 250 250 2", times, requests, failures)
	}
}

func TestDiscard(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		discard []string
		want    string // the metrics of the record, "" for none
	}{
		{name: "some", discard: []string{ChangesRead, LagSeconds}, want: "PollerErrors Role"},
		{name: "none", want: "ChangesRead PollerErrors Role"},
		{name: "all", discard: []string{ChangesRead, PollerErrors, Role}, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			r := New(&buf, map[string]string{"Job": "orders"})
			r.Add(ChangesRead, 5, Count)
			r.Add(PollerErrors, 1, Count)
			r.AddHighRes(Role, 1, None)
			r.Discard(tt.discard...)
			if err := r.Flush(); err != nil {
				t.Fatal(err)
			}
			var got []string
			if buf.Len() > 0 {
				var rec struct {
					AWS struct {
						CloudWatchMetrics []struct {
							Metrics []struct{ Name string }
						}
					} `json:"_aws"`
				}
				if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
					t.Fatalf("record is not JSON: %v", err)
				}
				for _, m := range rec.AWS.CloudWatchMetrics[0].Metrics {
					got = append(got, m.Name)
				}
			}
			if d := cmp.Diff(tt.want, strings.Join(got, " ")); d != "" {
				t.Errorf("metrics written (-want +got):\n%s", d)
			}
		})
	}
}
