package faults

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// Proxy is a TCP proxy between one poller process and an AWS endpoint. It
// can add latency to every request, black-hole the traffic (connections stay
// open, nothing gets through in either direction) or cut it (every
// connection closed at once). Safe for concurrent use.
//
// Made by NewHTTPProxy, it reads the client's bytes as HTTP/1.1 requests:
// the latency is then added once per request, whatever its size, and
// requests are counted by AWS action (Requests). Connections are kept alive
// and served concurrently, one upstream connection per client connection.
type Proxy struct {
	target  string
	ln      net.Listener
	latency atomic.Int64 // time.Duration added before forwarding client bytes
	holed   atomic.Bool
	http    bool

	countMu sync.Mutex
	counts  map[string]int64 // requests by AWS action

	waiting atomic.Int64 // request bytes read and not yet forwarded
	drop    atomic.Int64 // responses still to drop

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	cut   bool
	held  chan struct{} // closed by Release; nil when not held
	wg    sync.WaitGroup
}

// AWSEndpoint is the host:port of the endpoint the stacks use for an AWS
// service ("DynamoDB", "SQS"), as the SDK's settings name it
// (testenv.Endpoint).
func AWSEndpoint(service string) (string, error) {
	e := testenv.Endpoint(service)
	u, err := url.Parse(e)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("the %s endpoint %q is not a URL with a host", service, e)
	}
	return u.Host, nil
}

// NewProxy listens on a free local port and forwards to target (host:port).
func NewProxy(target string) (*Proxy, error) { return newProxy(target, false) }

// NewHTTPProxy is NewProxy for HTTP/1.1 clients such as the AWS SDK: each
// request is delayed once by the latency and counted by its AWS action.
func NewHTTPProxy(target string) (*Proxy, error) { return newProxy(target, true) }

func newProxy(target string, httpMode bool) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	p := &Proxy{target: target, ln: ln, http: httpMode, conns: map[net.Conn]struct{}{}, counts: map[string]int64{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Requests returns how many requests passed through the proxy by AWS action
// ("SQS.SendMessageBatch", "DynamoDB.UpdateItem", "S3.PutObject", ...),
// since it started or the last ResetRequests. Only an HTTP proxy counts.
func (p *Proxy) Requests() map[string]int64 {
	p.countMu.Lock()
	defer p.countMu.Unlock()
	return maps.Clone(p.counts)
}

// ResetRequests sets every request count back to zero.
func (p *Proxy) ResetRequests() {
	p.countMu.Lock()
	defer p.countMu.Unlock()
	clear(p.counts)
}

// URL is the proxy's address as an endpoint URL.
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

// SetLatency delays every chunk of request bytes by d (about d per request).
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// Blackhole drops every byte from now on, in both directions, on existing
// and new connections, which stay open: calls hang until their timeout.
func (p *Proxy) Blackhole() { p.holed.Store(true) }

// Hold keeps every request from now on in the proxy, including one already
// read but not yet forwarded, until Release: a send in flight, delivered
// late.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(chan struct{})
	}
}

// Release forwards the requests Hold kept.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
}

// DropResponses makes the proxy swallow the next n responses: each
// request reaches the server, which acts on it, but its client sees the
// connection reset instead of the answer (a response lost on the network).
func (p *Proxy) DropResponses(n int) { p.drop.Store(int64(n)) }

// Waiting is the number of requests read from clients and not yet
// forwarded (in their latency, or held).
func (p *Proxy) Waiting() int { return int(p.waiting.Load()) }

func (p *Proxy) gate() {
	p.mu.Lock()
	h := p.held
	p.mu.Unlock()
	if h != nil {
		<-h
	}
}

// Cut closes every connection, and every new one as soon as it is
// accepted: calls fail at once. The listener stays open so that its port
// cannot be taken by another listener while the process still dials it.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

// Mend undoes Cut and Blackhole: new connections pass again.
func (p *Proxy) Mend() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
	p.holed.Store(false)
}

// Close cuts the proxy, closes its listener and waits for its goroutines.
func (p *Proxy) Close() {
	p.Release()
	p.Cut()
	p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

func (p *Proxy) handle(client net.Conn) {
	defer p.untrack(client)
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	done := make(chan struct{}, 2)
	go func() {
		if p.http {
			p.pipeRequests(up, client)
		} else {
			p.pipe(up, client, true)
		}
		done <- struct{}{}
	}()
	go func() {
		p.pipe(client, up, false)
		done <- struct{}{}
	}()
	<-done // either side ended: close both (deferred), which ends the other
}

func (p *Proxy) pipe(dst, src net.Conn, request bool) {
	buf := make([]byte, 64*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 && !request && p.drop.Load() > 0 && p.drop.Add(-1) >= 0 {
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // close with a reset
			}
			return
		}
		if n > 0 && !p.holed.Load() {
			if request {
				p.delay()
			}
			if p.holed.Load() {
				continue
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or closed: handle closes both sides
		}
	}
}

// delay holds a request for the latency, then for as long as the proxy
// holds requests, counted as waiting meanwhile.
func (p *Proxy) delay() {
	p.waiting.Add(1)
	defer p.waiting.Add(-1)
	if d := time.Duration(p.latency.Load()); d > 0 {
		time.Sleep(d)
	}
	p.gate()
}

// pipeRequests forwards the HTTP requests read from src to dst, each after
// the latency (and any hold), counting them by action.
func (p *Proxy) pipeRequests(dst, src net.Conn) {
	br := bufio.NewReaderSize(src, 64*1024)
	bw := bufio.NewWriterSize(dst, 64*1024)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return // EOF or closed: handle closes both sides
		}
		p.countMu.Lock()
		p.counts[Action(req)]++
		p.countMu.Unlock()
		p.delay()
		if p.holed.Load() {
			_, _ = io.Copy(io.Discard, req.Body)
			continue
		}
		if err := req.Write(bw); err != nil {
			return
		}
		if err := bw.Flush(); err != nil {
			return
		}
	}
}

// Action names the AWS operation of a request: the X-Amz-Target of the JSON
// protocols (SQS, DynamoDB) as "SQS.<op>" or "DynamoDB.<op>", the Action of
// the query protocol, or for S3 (path-style addressing) the operation its
// method and path make.
func Action(req *http.Request) string {
	if t := req.Header.Get("X-Amz-Target"); t != "" {
		svc, op, _ := strings.Cut(t, ".")
		switch {
		case svc == "AmazonSQS":
			svc = "SQS"
		case strings.HasPrefix(svc, "DynamoDB"):
			svc = "DynamoDB"
		}
		return svc + "." + op
	}
	if a := req.URL.Query().Get("Action"); a != "" {
		return "Query." + a
	}
	_, key, _ := strings.Cut(strings.TrimPrefix(req.URL.Path, "/"), "/")
	q := req.URL.Query()
	object := key != ""
	switch {
	case req.Method == http.MethodPut && object:
		return "S3.PutObject"
	case req.Method == http.MethodGet && object:
		return "S3.GetObject"
	case req.Method == http.MethodHead && object:
		return "S3.HeadObject"
	case req.Method == http.MethodDelete && object:
		return "S3.DeleteObject"
	case req.Method == http.MethodPost && q.Has("delete"):
		return "S3.DeleteObjects"
	case req.Method == http.MethodGet:
		return "S3.ListObjects"
	}
	return "S3." + req.Method + "Bucket"
}

// HoldInFlight holds the proxy at a moment when a request is passing
// through it (read, not yet forwarded), so the request is delivered only
// after Release. It gives up after timeout.
func (p *Proxy) HoldInFlight(ctx context.Context, timeout time.Duration) error {
	err := testenv.Poll(ctx, timeout, time.Millisecond, func(context.Context) (bool, error) {
		p.Hold()
		if p.Waiting() > 0 {
			return true, nil
		}
		p.Release()
		return false, nil
	})
	if errors.Is(err, testenv.ErrTimeout) {
		err = fmt.Errorf("no request passed through the proxy within %s", timeout)
	}
	return err
}
