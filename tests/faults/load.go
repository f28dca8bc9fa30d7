package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/changes-worker/changes-worker/shared/clock"
)

// LoadOptions bound a background writer.
type LoadOptions struct {
	// Rate is the document writes per second. Default 40.
	Rate int
	// Max stops the writer after this many writes. Default 10,000.
	Max int
	// For stops the writer after this long. Default 5 minutes.
	For time.Duration
	// Seed makes the sequence of writes reproducible.
	Seed uint64
}

// Load writes documents to the source in the background: new documents,
// updates and deletes of the ones it wrote, in small bulk requests ten times
// a second.
type Load struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	written int
	err     error
}

// StartLoad starts a background writer; Stop ends it.
func (s *Stack) StartLoad(ctx context.Context, o LoadOptions) *Load {
	if o.Rate == 0 {
		o.Rate = 40
	}
	if o.Max == 0 {
		o.Max = 10000
	}
	if o.For == 0 {
		o.For = 5 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, o.For)
	l := &Load{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		l.run(ctx, s, o)
	}()
	return l
}

func (l *Load) run(ctx context.Context, s *Stack, o LoadOptions) {
	rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0x5bd1e995))
	revs := map[string]string{}
	var live []string
	next := 0
	per := max(1, o.Rate/10)
	clock.Every(ctx, 100*time.Millisecond, func() bool {
		l.mu.Lock()
		left := o.Max - l.written
		l.mu.Unlock()
		if left <= 0 {
			return false
		}
		var docs []map[string]any
		picked := map[string]bool{}
		for range min(per, left) {
			r := rng.Float64()
			switch {
			case len(live) > 10 && r < 0.3:
				id := live[rng.IntN(len(live))]
				if picked[id] {
					continue
				}
				picked[id] = true
				docs = append(docs, map[string]any{"_id": id, "_rev": revs[id], "type": "order", "n": rng.IntN(1000)})
			case len(live) > 10 && r < 0.4:
				i := rng.IntN(len(live))
				id := live[i]
				if picked[id] {
					continue
				}
				picked[id] = true
				docs = append(docs, map[string]any{"_id": id, "_rev": revs[id], "_deleted": true})
				live[i] = live[len(live)-1]
				live = live[:len(live)-1]
			default:
				id := fmt.Sprintf("load-%06d", next)
				next++
				picked[id] = true
				docs = append(docs, map[string]any{"_id": id, "type": "order", "n": rng.IntN(1000)})
				live = append(live, id)
			}
		}
		if len(docs) == 0 {
			return true
		}
		n, err := s.bulk(ctx, docs, revs)
		l.mu.Lock()
		l.written += n
		if err != nil && ctx.Err() == nil && l.err == nil {
			l.err = err
		}
		l.mu.Unlock()
		return true
	})
}

// bulk writes docs and records their new revisions; it returns how many
// the source accepted.
func (s *Stack) bulk(ctx context.Context, docs []map[string]any, revs map[string]string) (int, error) {
	body, err := json.Marshal(map[string]any{"docs": docs})
	if err != nil {
		return 0, fmt.Errorf("encode bulk docs: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.SourceURL+"/_bulk_docs", bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("bulk docs: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("bulk docs: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return 0, fmt.Errorf("bulk docs: status %d: %.200s", resp.StatusCode, b)
	}
	var res []struct{ ID, Rev, Error string }
	if err := json.Unmarshal(b, &res); err != nil {
		return 0, fmt.Errorf("bulk docs: decode answer: %w", err)
	}
	n := 0
	for _, r := range res {
		if r.Error == "" {
			revs[r.ID] = r.Rev
			n++
		}
	}
	return n, nil
}

// Stop ends the writer and returns how many writes the source accepted and
// the first error, if any.
func (l *Load) Stop() (int, error) {
	l.cancel()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.written, l.err
}
