package main

// A stand-in for SQS, in memory: standard-queue semantics (at-least-once,
// visibility timeouts, receive counts) without durability or ordering, and
// every request answered after a set delay, the cloud latency. It answers
// as a distant SQS that is never the bottleneck, as SQS is not on AWS at
// these rates, so that a figure measured through it is the pipeline's own
// ceiling at that latency, apart from the emulator's. The delay is its own
// rather than a proxy's: on AWS the poller's CPU carries no proxy, and on
// this machine's two cores a proxy's copying would be counted against it.
//
// It speaks the SQS JSON protocol for what the pipeline calls on the way
// from poller to writer: GetQueueUrl (creating the queue on first use),
// GetQueueAttributes, SendMessageBatch, ReceiveMessage (long polls
// included), DeleteMessageBatch, ChangeMessageVisibility and PurgeQueue.
// Anything else (a move to a DLQ) is refused, which the writer reports.

import (
	"bufio"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// cloudSQS is the stand-in. Safe for concurrent use.
type cloudSQS struct {
	latency atomic.Int64 // nanoseconds added before every answer
	mu      sync.Mutex
	queues  map[string]*cloudQueue // by name
	ids     int64
}

type cloudQueue struct {
	msgs    []*cloudMessage // visible or in flight, in sending order
	arrived chan struct{}   // closed and replaced when messages arrive
}

type cloudMessage struct {
	id, body, receipt string
	sent              time.Time
	receives          int
	hiddenUntil       time.Time
	firstReceive      time.Time
}

func newCloudSQS() *cloudSQS { return &cloudSQS{queues: map[string]*cloudQueue{}} }

func (s *cloudSQS) queue(url string) *cloudQueue {
	name := url[strings.LastIndexByte(url, '/')+1:]
	q := s.queues[name]
	if q == nil {
		q = &cloudQueue{arrived: make(chan struct{})}
		s.queues[name] = q
	}
	return q
}

func md5Hex(s string) string {
	sum := md5.Sum([]byte(s)) // the SDK checks it
	return hex.EncodeToString(sum[:])
}

func (s *cloudSQS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")
	if d := time.Duration(s.latency.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
	}
	var in struct {
		QueueName, QueueURL string
		Entries             []struct {
			ID            string `json:"Id"`
			MessageBody   string
			ReceiptHandle string
		}
		MaxNumberOfMessages int
		WaitTimeSeconds     int
		VisibilityTimeout   *int
		ReceiptHandle       string
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		cloudSQSError(w, "InvalidRequest", err.Error())
		return
	}
	var out any
	switch op {
	case "GetQueueUrl":
		s.mu.Lock()
		s.queue(in.QueueName)
		s.mu.Unlock()
		out = map[string]string{"QueueUrl": "http://" + r.Host + "/000000000000/" + in.QueueName}
	case "GetQueueAttributes":
		out = map[string]any{"Attributes": s.attributes(in.QueueURL)}
	case "SendMessageBatch":
		out = s.send(in.QueueURL, in.Entries)
	case "ReceiveMessage":
		vis := 30
		if in.VisibilityTimeout != nil {
			vis = *in.VisibilityTimeout
		}
		out = map[string]any{"Messages": s.receive(r, in.QueueURL, max(1, in.MaxNumberOfMessages), time.Duration(in.WaitTimeSeconds)*time.Second, time.Duration(vis)*time.Second)}
	case "DeleteMessageBatch":
		handles := map[string]string{}
		for _, e := range in.Entries {
			handles[e.ReceiptHandle] = e.ID
		}
		out = map[string]any{"Successful": s.delete(in.QueueURL, handles), "Failed": []any{}}
	case "ChangeMessageVisibility":
		s.mu.Lock()
		for _, m := range s.queue(in.QueueURL).msgs {
			if m.receipt == in.ReceiptHandle && in.VisibilityTimeout != nil {
				m.hiddenUntil = time.Now().Add(time.Duration(*in.VisibilityTimeout) * time.Second)
			}
		}
		s.mu.Unlock()
		out = struct{}{}
	case "PurgeQueue":
		s.mu.Lock()
		s.queue(in.QueueURL).msgs = nil
		s.mu.Unlock()
		out = struct{}{}
	default:
		cloudSQSError(w, "UnsupportedOperation", op+" is not supported by the stand-in")
		return
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	_ = json.NewEncoder(w).Encode(out)
}

func cloudSQSError(w http.ResponseWriter, code, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.WriteHeader(http.StatusBadRequest)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazonaws.sqs#" + code, "message": msg})
}

func (s *cloudSQS) attributes(url string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue(url)
	now := time.Now()
	visible, hidden := 0, 0
	for _, m := range q.msgs {
		if m.hiddenUntil.After(now) {
			hidden++
		} else {
			visible++
		}
	}
	name := url[strings.LastIndexByte(url, '/')+1:]
	return map[string]string{
		"QueueArn":                              "arn:aws:sqs:us-east-1:000000000000:" + name,
		"ApproximateNumberOfMessages":           strconv.Itoa(visible),
		"ApproximateNumberOfMessagesNotVisible": strconv.Itoa(hidden),
		"ApproximateNumberOfMessagesDelayed":    "0",
	}
}

func (s *cloudSQS) send(url string, entries []struct {
	ID            string `json:"Id"`
	MessageBody   string
	ReceiptHandle string
}) map[string]any {
	type ok struct {
		ID        string `json:"Id"`
		MessageID string `json:"MessageId"`
		MD5       string `json:"MD5OfMessageBody"`
	}
	res := make([]ok, len(entries))
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue(url)
	now := time.Now()
	for i, e := range entries {
		s.ids++
		id := fmt.Sprintf("m-%d", s.ids)
		q.msgs = append(q.msgs, &cloudMessage{id: id, body: e.MessageBody, sent: now})
		res[i] = ok{ID: e.ID, MessageID: id, MD5: md5Hex(e.MessageBody)}
	}
	close(q.arrived)
	q.arrived = make(chan struct{})
	return map[string]any{"Successful": res, "Failed": []any{}}
}

// receive hands out up to n visible messages, waiting up to wait for some.
func (s *cloudSQS) receive(r *http.Request, url string, n int, wait, visibility time.Duration) []map[string]any {
	deadline := time.Now().Add(wait)
	for {
		s.mu.Lock()
		q := s.queue(url)
		now := time.Now()
		var got []map[string]any
		for _, m := range q.msgs {
			if len(got) == n {
				break
			}
			if m.hiddenUntil.After(now) {
				continue
			}
			s.ids++
			m.receives++
			m.receipt = fmt.Sprintf("r-%d", s.ids)
			m.hiddenUntil = now.Add(visibility)
			if m.firstReceive.IsZero() {
				m.firstReceive = now
			}
			got = append(got, map[string]any{
				"MessageId": m.id, "ReceiptHandle": m.receipt, "Body": m.body, "MD5OfBody": md5Hex(m.body),
				"Attributes": map[string]string{
					"ApproximateReceiveCount":          strconv.Itoa(m.receives),
					"SentTimestamp":                    strconv.FormatInt(m.sent.UnixMilli(), 10),
					"ApproximateFirstReceiveTimestamp": strconv.FormatInt(m.firstReceive.UnixMilli(), 10),
				},
			})
		}
		arrived := q.arrived
		s.mu.Unlock()
		left := time.Until(deadline)
		if len(got) > 0 || left <= 0 {
			return got
		}
		t := time.NewTimer(min(left, 100*time.Millisecond)) // also wakes for expiring visibility
		select {
		case <-r.Context().Done():
			t.Stop()
			return nil
		case <-arrived:
		case <-t.C:
		}
		t.Stop()
	}
}

func (s *cloudSQS) delete(url string, handles map[string]string) []map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue(url)
	var done []map[string]string
	kept := q.msgs[:0]
	for _, m := range q.msgs {
		if id, ok := handles[m.receipt]; ok && m.receipt != "" {
			done = append(done, map[string]string{"Id": id})
			delete(handles, m.receipt)
			continue
		}
		kept = append(kept, m)
	}
	clear(q.msgs[len(kept):])
	q.msgs = kept
	for _, id := range handles { // already gone: SQS accepts a repeated delete
		done = append(done, map[string]string{"Id": id})
	}
	return done
}

var standInFlag = flag.Bool("serve-stand-in-sqs", false,
	"serve the stand-in SQS (no added latency) and measure nothing: print its URL, serve until standard input closes")

// serveStandIn is the process -serve-stand-in-sqs runs: the stand-in on a
// port of its own, its URL the first line of standard output.
func serveStandIn() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: newCloudSQS(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	fmt.Printf("http://%s\n", ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return srv.Close()
}

// startStandIn runs the stand-in SQS in a process of its own (this program
// with -serve-stand-in-sqs), so that the CPU it spends answering is not
// counted in this process's, and returns its URL and how to stop it.
func startStandIn(ctx context.Context) (url string, stop func(), err error) {
	bin, err := os.Executable()
	if err != nil {
		return "", nil, fmt.Errorf("stand-in process: %w", err)
	}
	cmd := exec.CommandContext(ctx, bin, "-serve-stand-in-sqs")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, fmt.Errorf("stand-in process: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, fmt.Errorf("stand-in process: %w", err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("start stand-in process: %w", err)
	}
	stop = func() {
		stdin.Close()
		_ = cmd.Wait()
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("stand-in process: read its URL: %w", err)
	}
	return strings.TrimSpace(line), stop, nil
}
