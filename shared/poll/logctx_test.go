package poll_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/poll"
)

// ctxKey marks the context an invocation runs with.
type ctxKey struct{}

// ctxHandler records each record's message and whether it was logged with
// the invocation's context, which is where a Lambda function's logger
// finds the request id.
type ctxHandler struct {
	mu      *sync.Mutex
	without *[]string
	seen    *[]string
}

func (h ctxHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h ctxHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h ctxHandler) WithGroup(string) slog.Handler            { return h }

func (h ctxHandler) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.seen = append(*h.seen, r.Message)
	if ctx.Value(ctxKey{}) == nil {
		*h.without = append(*h.without, r.Message)
	}
	return nil
}

// TestRunLogsWithTheInvocationContext: every record an invocation logs
// carries the invocation's context (lambdacontext's logger takes the
// request id from it).
func TestRunLogsWithTheInvocationContext(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.feed.batch = thenIdle(r, batchOf(1, 30))
	var without, seen []string
	r.poller.Log = slog.New(ctxHandler{mu: &sync.Mutex{}, without: &without, seen: &seen})
	ctx, cancel := context.WithTimeout(context.WithValue(t.Context(), ctxKey{}, "invocation"), 30*time.Second)
	defer cancel()
	if _, err := r.poller.Run(ctx, poll.Invocation{Owner: "me", Host: "host", Deadline: r.w.Now().Add(2 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	if len(seen) == 0 {
		t.Fatal("the invocation logged nothing")
	}
	if len(without) > 0 {
		t.Errorf("records logged without the invocation's context: %q (of %q)", without, seen)
	}
}
