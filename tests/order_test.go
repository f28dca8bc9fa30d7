package tests

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/deliver/httpsink"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/localrun"
)

// blindReceiver is an HTTP output that applies every request as it comes:
// the last request for a document wins, whatever its version, as many real
// endpoints do. It holds doc id → the revision of its last PUT (a DELETE
// removes the document). While refusing is set it answers every request
// with it (503, or 429 with Retry-After) and stores nothing. Safe for
// concurrent use.
type blindReceiver struct {
	mu      sync.Mutex
	docs    map[string]string
	refuse  func(w http.ResponseWriter) // nil: accept
	refused atomic.Int64
	applied atomic.Int64
}

func newBlindReceiver() *blindReceiver { return &blindReceiver{docs: map[string]string{}} }

func (b *blindReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, err := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), "/docs/"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.refuse != nil {
		b.refused.Add(1)
		b.refuse(w)
		return
	}
	b.applied.Add(1)
	if r.Method == http.MethodDelete {
		delete(b.docs, id)
	} else {
		b.docs[id] = r.Header.Get(httpsink.HeaderRev)
	}
	w.WriteHeader(http.StatusNoContent)
}

// set makes the receiver answer every request with refuse (nil: accept).
func (b *blindReceiver) set(refuse func(w http.ResponseWriter)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refuse = refuse
}

func (b *blindReceiver) state() map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.docs)
}

func unavailable(w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) }

// tooManyRequests answers 429 with a Retry-After of secs.
func tooManyRequests(secs int) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		w.WriteHeader(http.StatusTooManyRequests)
	}
}

// runBlindHold runs the stack's pipeline (one FIFO HTTP output, "rest",
// whose receiver is recv) until the receiver holds the first documents,
// makes the receiver refuse every request with refuse for length while 40
// documents keep changing (each about every 10 s, one write every 250 ms,
// so that their held changes are at every receive count), accepts again,
// and checks that the receiver ends holding exactly the source's newest
// revision of every document, with the work queue drained and nothing
// dead-lettered.
func runBlindHold(t *testing.T, s *testStack, recv *blindReceiver, refuse func(http.ResponseWriter), length time.Duration) {
	t.Helper()
	ctx := t.Context()
	rt, stop := s.RunInBackground(t, localrun.Options{Tick: 2 * time.Second, ProbeEvery: 2 * time.Second})
	defer stop()
	revs := map[string]string{}
	put := func(i int) {
		id := fmt.Sprintf("doc-%02d", i%40)
		body := map[string]any{"type": "order", "n": i}
		if rev := revs[id]; rev != "" {
			body["_rev"] = rev
		}
		rev, err := s.PutDoc(ctx, id, body)
		if err != nil {
			t.Fatal(err)
		}
		revs[id] = rev
	}
	for i := range 40 {
		put(i)
	}
	if !waitConverged(t, s, recv.state, 2*time.Minute) {
		t.FailNow()
	}
	recv.set(refuse)
	start := time.Now()
	writes := 0
	for ; time.Since(start) < length; writes++ {
		put(40 + writes)
		time.Sleep(250 * time.Millisecond)
	}
	recv.set(nil)
	back := time.Now()
	q, err := s.Queues(ctx, "orders", "rest")
	if err != nil {
		t.Fatal(err)
	}
	converged := waitConverged(t, s, recv.state, 3*time.Minute)
	took := time.Since(back)
	if converged {
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
			d, err := dlq.QueueDepth(ctx, s.Deps.SQS, q.WorkURL)
			if err == nil && d.Total() == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("work queue not empty a minute after the receiver equals the source: %+v", d)
				break
			}
		}
	}
	if n := len(receiveAll(t, s, "rest")); n != 0 {
		t.Errorf("DLQ holds %d messages, want none", n)
	}
	st := rt.Summary().Outputs["orders/rest"]
	if st.DeadLettered != 0 {
		t.Errorf("writer stats %+v: want nothing dead-lettered", st)
	}
	outcome := fmt.Sprintf("the receiver equalled the source %s after it accepted again", took.Round(100*time.Millisecond))
	if !converged {
		outcome = "the receiver did not equal the source"
	}
	t.Logf("refused %d requests for %s while %d document writes were made; %s (%d requests applied in all); writer stats %+v",
		recv.refused.Load(), length.Round(time.Second), writes, outcome, recv.applied.Load(), st)
}

// newBlindStack returns a test stack whose HTTP output "rest" (per_document, the
// default) is recv.
func newBlindStack(t *testing.T, recv *blindReceiver) *testStack {
	t.Helper()
	return newStack(t, stackOptions{
		outputs: []string{"rest"}, maxReceive: 3, rest: shortOutageRetry,
		wrapRest: func(http.Handler) http.Handler { return recv },
	})
}

// An HTTP output that answers 503 for minutes while documents are updated
// several times each, at different moments: once it is back, a receiver
// that applies every request as it comes holds exactly the newest revision
// of every document, and nothing is dead-lettered. Each document's changes
// reached it in feed order, however long they were held.
func TestHTTPOutageKeepsOrderAtABlindReceiver(t *testing.T) {
	parallel(t)
	recv := newBlindReceiver()
	runBlindHold(t, newBlindStack(t, recv), recv, unavailable, outageLength(t))
}

// The same for an output that asks to slow down for minutes (429 with a
// Retry-After of 3 s at every request): order is kept and nothing is
// dead-lettered.
func TestHTTPLongBackpressureKeepsOrderAtABlindReceiver(t *testing.T) {
	parallel(t)
	recv := newBlindReceiver()
	runBlindHold(t, newBlindStack(t, recv), recv, tooManyRequests(3), outageLength(t))
}
