package main

// poller-large-docs: one page of large documents through the poller, in
// its own process, with the default feed settings: memoryLargeDocs
// documents of about memoryLargeBytes each (at the default feed.limit of
// 500 the first page would hold 200 MB of bodies). Every document must be
// queued (the queue is read back: one message per document, claim checks
// for the bodies over the message size), and the figure to watch is the
// poller's peak resident set size against the poller function's default
// memory (stack.poller_memory_mb).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

const (
	memoryLargeDocs  = 500
	memoryLargeBytes = 400 * 1024
	pollerMemoryMB   = config.DefaultPollerMemoryMB
)

func init() {
	register("poller-large-docs", pollerLargeDocs)
}

func pollerLargeDocs(ctx context.Context, r *results) error {
	run, err := corePollerOnly(ctx, "pl", 500, loadLargeDocs, memoryLargeDocs, memoryLargeBytes)
	if err != nil {
		return err
	}
	defer coreClose(ctx, run.st)
	loaded, took, m := run.loaded, run.took, run.mem
	ids, claims, err := queuedDocs(ctx, run.st)
	if err != nil {
		return err
	}
	r.add("docs", memoryLargeDocs, fmt.Sprintf("~%d KB bodies (%.0f MiB), feed.limit 500, include_docs, default page_bytes and max_answer_bytes, loaded in %s",
		memoryLargeBytes/1024, float64(memoryLargeDocs*memoryLargeBytes)/(1<<20), loaded.Round(time.Second)))
	r.add("queued distinct docs", len(ids), fmt.Sprintf("read back from the queue; %d with a claim check", claims))
	r.add("every doc queued", len(ids) == memoryLargeDocs, "")
	r.add("poller run s", took.Seconds(), "changesctl run --no-writer --until-idle, start to exit")
	r.add("peak RSS MiB", m.maxRSS, fmt.Sprintf("VmHWM of the changesctl process, read every 10 ms; goal ≤ %d", pollerMemoryMB))
	r.add("within poller memory", m.maxRSS <= pollerMemoryMB, "")
	r.add("Go heap peak MiB", m.heapPeak, fmt.Sprintf("largest heap at a GC's start or end, %d GCs", m.gcs))
	r.add("Go live heap max MiB", m.liveMax, "largest live heap a GC left")
	if len(ids) != memoryLargeDocs {
		return fmt.Errorf("queued %d distinct documents, want %d", len(ids), memoryLargeDocs)
	}
	return nil
}

// loadLargeDocs writes n documents of about size bytes into the source
// database db, 20 per _bulk_docs.
func loadLargeDocs(ctx context.Context, db string, n, size int) error {
	pad := strings.Repeat("0123456789abcdef", size/16)
	for start := 0; start < n; start += 20 {
		var docs []map[string]any
		for i := start; i < min(start+20, n); i++ {
			docs = append(docs, map[string]any{"_id": fmt.Sprintf("large-%04d", i), "n": i, "pad": pad})
		}
		body, err := json.Marshal(map[string]any{"docs": docs})
		if err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, db+"/_bulk_docs", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := coreSourceClient.Do(req)
		if err != nil {
			return fmt.Errorf("load large documents: %w", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("load large documents: status %d", resp.StatusCode)
		}
	}
	return nil
}

// queuedDocs receives every message of the stack's queue (leaving them
// invisible) and returns the distinct document ids and the claim checks.
func queuedDocs(ctx context.Context, st *stack.Stack) (map[string]bool, int, error) {
	q, err := st.Queues(ctx, "bench", "pg")
	if err != nil {
		return nil, 0, err
	}
	url := q.WorkURL
	ids := map[string]bool{}
	claims, empty := 0, 0
	for empty < 3 {
		out, err := st.Deps.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &url, MaxNumberOfMessages: 10, VisibilityTimeout: 600, WaitTimeSeconds: 1})
		if err != nil {
			return nil, 0, fmt.Errorf("receive: %w", err)
		}
		if len(out.Messages) == 0 {
			empty++
			continue
		}
		empty = 0
		for _, m := range out.Messages {
			var e struct {
				DocID  string          `json:"doc_id"`
				DocRef json.RawMessage `json:"doc_ref"`
			}
			if m.Body == nil || json.Unmarshal([]byte(*m.Body), &e) != nil {
				return nil, 0, fmt.Errorf("message that is not an envelope")
			}
			ids[e.DocID] = true
			if len(e.DocRef) > 0 {
				claims++
			}
		}
	}
	return ids, claims, nil
}
