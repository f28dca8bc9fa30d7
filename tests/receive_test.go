package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/provision"
)

// answerLoser passes every request through and, for the first ReceiveMessage
// of each queue that returns messages, throws the answer away and fails the
// call the way a keep-alive connection closed under it does. SQS has handed
// the messages out by then: they are hidden for the receive's visibility
// timeout. Safe for concurrent use.
type answerLoser struct {
	next aws.HTTPClient

	mu   sync.Mutex
	lost map[string]int // queue URL -> messages of the lost answer
}

func (l *answerLoser) Do(req *http.Request) (*http.Response, error) {
	if req.Header.Get("X-Amz-Target") != "AmazonSQS.ReceiveMessage" || req.Body == nil {
		return l.next.Do(req)
	}
	reqBody, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(reqBody))
	var in struct{ QueueUrl string }
	_ = json.Unmarshal(reqBody, &in)
	resp, err := l.next.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	var out struct{ Messages []json.RawMessage }
	_ = json.Unmarshal(body, &out)
	l.mu.Lock()
	_, done := l.lost[in.QueueUrl]
	if len(out.Messages) > 0 && !done {
		l.lost[in.QueueUrl] = len(out.Messages)
		l.mu.Unlock()
		return nil, fmt.Errorf("read response: %w", net.ErrClosed)
	}
	l.mu.Unlock()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

// A lost ReceiveMessage answer does not stall the local runtime for the
// queue's visibility timeout: the writer loop's receives hide a batch only
// for the invocation's deadline plus a margin, so the lost messages are
// delivered well before the queue's own timeout (VisibilityFactor × the
// writer timeout) would have let them come back. Both queue kinds: pg is a
// standard queue, rest a FIFO queue.
func TestLostReceiveAnswerDoesNotStall(t *testing.T) {
	loser := &answerLoser{lost: map[string]int{}}
	ctx, s := parallelStack(t, stackOptions{outputs: []string{"pg", "rest"}, httpClient: func(c aws.HTTPClient) aws.HTTPClient {
		loser.next = c
		return loser
	}})
	var envs []*change.Envelope
	want := map[string]string{}
	for i := range 20 {
		id := fmt.Sprintf("doc-%02d", i)
		rev := fmt.Sprintf("1-%02d", i)
		envs = append(envs, &change.Envelope{V: change.EnvelopeVersion, Job: "orders", DocID: id, Rev: rev,
			Seq: json.RawMessage(fmt.Sprint(i + 1)), Version: change.Version{Generation: 1, Counter: int64(i + 1)}, EnqueuedAt: time.Now(),
			Doc: json.RawMessage(fmt.Sprintf(`{"_id":%q,"_rev":%q}`, id, rev))})
		want[id] = rev
	}
	sendEnvelopes(t, s, envs)

	start := time.Now()
	s.runUntilIdle(ctx, localrun.Options{NoPoller: true})
	took := time.Since(start)

	loser.mu.Lock()
	lost := len(loser.lost)
	loser.mu.Unlock()
	if lost != 2 {
		t.Fatalf("lost the answers of %d queues, want 2 (the test lost nothing it could measure)", lost)
	}
	if d := cmp.Diff(want, s.pgState(ctx)); d != "" {
		t.Errorf("postgres (-want +got):\n%s", d)
	}
	if d := cmp.Diff(want, s.httpState()); d != "" {
		t.Errorf("http receiver (-want +got):\n%s", d)
	}
	writer := s.Config.Stack.WriterTimeout.D()
	queueVisibility := time.Duration(provision.VisibilityFactor) * writer
	// The receive's visibility is the writer timeout plus 10 s; allow as much
	// again for the rest of the run on a busy machine.
	if limit := 2 * (writer + 10*time.Second); took > limit {
		t.Errorf("drained in %s after a lost receive answer, want under %s (the queue's visibility timeout is %s)", took.Round(time.Second), limit, queueVisibility)
	}
	t.Logf("drained in %s after losing one receive answer per queue (writer timeout %s, queue visibility %s)", took.Round(time.Millisecond), writer, queueVisibility)
}
