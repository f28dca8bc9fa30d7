package faults

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The HTTP proxy delays every request once, serves concurrent keep-alive
// connections, forwards bodies intact and counts requests by action.
func TestHTTPProxyLatencyAndCounts(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	p, err := NewHTTPProxy(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Long enough that a loaded machine's own delays stay well below the
	// difference between one latency and one per call.
	const latency = 150 * time.Millisecond
	p.SetLatency(latency)

	type call struct{ method, path, target, body string }
	calls := []call{
		{"POST", "/", "AmazonSQS.SendMessageBatch", strings.Repeat("m", 200_000)},
		{"POST", "/", "AmazonSQS.SendMessageBatch", "{}"},
		{"POST", "/", "AmazonSQS.ReceiveMessage", "{}"},
		{"POST", "/", "DynamoDB_20120810.UpdateItem", "{}"},
		{"PUT", "/bucket/claims/j/1/2.json", "", `{"a":1}`},
		{"GET", "/bucket/claims/j/1/2.json", "", ""},
		{"GET", "/bucket?list-type=2&prefix=x", "", ""},
		{"PUT", "/bucket", "", ""},
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	// Two rounds over the same kept-alive connections, all calls at once.
	for round := range 2 {
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, len(calls))
		for _, c := range calls {
			wg.Go(func() {
				req, _ := http.NewRequestWithContext(context.Background(), c.method, p.URL()+c.path, strings.NewReader(c.body))
				if c.target != "" {
					req.Header.Set("X-Amz-Target", c.target)
				}
				resp, err := hc.Do(req)
				if err != nil {
					errs <- err
					return
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				if string(b) != c.body {
					t.Errorf("%s %s: body of %d bytes came back as %d", c.method, c.path, len(c.body), len(b))
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, err)
		}
		if d := time.Since(start); d < latency || d > latency*time.Duration(len(calls))/2 {
			t.Errorf("round %d of %d concurrent calls took %s; want about one latency (%s), not one per call", round, len(calls), d, latency)
		}
	}
	want := map[string]int64{
		"SQS.SendMessageBatch": 4, "SQS.ReceiveMessage": 2, "DynamoDB.UpdateItem": 2,
		"S3.PutObject": 2, "S3.GetObject": 2, "S3.ListObjects": 2, "S3.PUTBucket": 2,
	}
	if d := cmp.Diff(want, p.Requests()); d != "" {
		t.Errorf("request counts (-want +got):\n%s", d)
	}
	p.ResetRequests()
	if got := p.Requests(); len(got) != 0 {
		t.Errorf("after reset: %v", got)
	}
}
