package poll_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/metrics"
)

// TestLagOfATrickle: a feed that answers every long poll with the one change
// made meanwhile, and never says how many are pending (Sync Gateway,
// PouchDB), leaves the poller at its end after every answer: an answer
// shorter than the limit holds everything the source had. LagSeconds stays
// within one read, however long the trickle lasts.
func TestLagOfATrickle(t *testing.T) {
	t.Parallel()
	r := newRig(func(call int, _ string) (*feed.Batch, error) {
		return &feed.Batch{Rows: rows(call, call), LastSeq: json.RawMessage(strconv.Itoa(call)), Pending: -1}, nil
	})
	r.feed.perRead = 100 * time.Millisecond
	var out bytes.Buffer
	r.poller.Metrics = metrics.New(&out, map[string]string{"Job": "orders"})
	if _, err := r.run(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	var lags []float64
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]json.RawMessage
		if json.Unmarshal(sc.Bytes(), &rec) != nil || rec[metrics.LagSeconds] == nil {
			continue
		}
		var one float64
		var many []float64
		if json.Unmarshal(rec[metrics.LagSeconds], &one) == nil {
			many = []float64{one}
		} else if err := json.Unmarshal(rec[metrics.LagSeconds], &many); err != nil {
			t.Fatalf("LagSeconds %s: %v", rec[metrics.LagSeconds], err)
		}
		lags = append(lags, many...)
	}
	if len(lags) < 100 {
		t.Fatalf("%d LagSeconds values over a 30s trickle, want one per batch", len(lags))
	}
	worst := 0.0
	for _, l := range lags {
		worst = max(worst, l)
	}
	if worst > 1 {
		t.Errorf("LagSeconds reached %.1fs on a trickle read change by change, want at most 1s (one read)", worst)
	}
}
