package writer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/changes-worker/changes-worker/shared/backpressure"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/httpsink"
	"github.com/changes-worker/changes-worker/shared/metrics"
)

// Requests to a real HTTP output are counted and timed, and a 401 or 403 is
// an output auth failure ("their credentials").
func TestOutputRequestMetrics(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/locked"):
			w.WriteHeader(http.StatusUnauthorized)
		case strings.HasSuffix(r.URL.Path, "/forbidden"):
			w.WriteHeader(http.StatusForbidden)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	t.Cleanup(srv.Close)
	f := testConfig(t, "none")
	sink, err := httpsink.New(config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}"}, httpsink.Credentials{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	h := newHandler(f, nil, &fakeSQS{})
	h.Sinks = func(context.Context, config.Route) (deliver.Sink, error) { return sink, nil }
	h.Metrics = &out
	ev := events.SQSEvent{Records: []events.SQSMessage{
		record(t, f, "m1", "ok", "1-a", 1, 1), record(t, f, "m2", "locked", "1-a", 2, 1), record(t, f, "m3", "forbidden", "1-a", 3, 1),
	}}
	if _, err := h.Handle(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(out.Bytes(), &rec); err != nil {
		t.Fatalf("EMF record: %v\n%s", err, out.String())
	}
	count := func(name string) int {
		switch v := rec[name].(type) {
		case float64:
			return int(v)
		case []any:
			n := 0
			for _, x := range v {
				n += int(x.(float64))
			}
			return n
		}
		return 0
	}
	if got := count(metrics.OutputRequests); got != 3 {
		t.Errorf("OutputRequests = %d, want 3", got)
	}
	if got := count(metrics.OutputAuthFailures); got != 2 {
		t.Errorf("OutputAuthFailures = %d, want 2", got)
	}
	if times, ok := rec[metrics.OutputRequestTime].([]any); !ok || len(times) != 3 {
		t.Errorf("OutputRequestTime = %v, want 3 values", rec[metrics.OutputRequestTime])
	}
	if got := count(metrics.BackpressureActive); got != 0 {
		t.Errorf("BackpressureActive = %d, want 0", got)
	}
}

func TestAuthFailure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		want bool
	}{
		{&deliver.Error{HTTPStatus: 401}, true},
		{&deliver.Error{HTTPStatus: 403}, true},
		{&deliver.Error{SQLState: "28P01"}, true},
		{&deliver.Error{SQLState: "28000"}, true},
		{&deliver.Error{HTTPStatus: 404}, false},
		{&deliver.Error{SQLState: "53300"}, false},
		{nil, false},
	}
	for _, tt := range tests {
		if got := deliver.AuthFailure(tt.err); got != tt.want {
			t.Errorf("AuthFailure(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// A held message waits at most backpressure.MaxPause however long the
// output's Retry-After asks: under ordering total the held change keeps the
// whole output's group waiting in flight for as long as its visibility.
func TestRetryAfterCappedForHeldMessage(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "999999999")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(srv.Close)
	f := testConfig(t, "total")
	sink, err := httpsink.New(config.HTTPOutput{URL: srv.URL + "/docs/{doc_id}"}, httpsink.Credentials{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	q := &fakeSQS{}
	h := newHandler(f, nil, q)
	h.Sinks = func(context.Context, config.Route) (deliver.Sink, error) { return sink, nil }
	for _, receives := range []int{1, 2} {
		rec := record(t, f, fmt.Sprintf("m%d", receives), "a", "1-a", 1, receives)
		rec.Attributes["MessageGroupId"] = "o"
		if _, err := h.Handle(t.Context(), events.SQSEvent{Records: []events.SQSMessage{rec}}); err != nil {
			t.Fatal(err)
		}
	}
	if len(q.visibility) != 2 {
		t.Fatalf("visibility changes %v, want one per receive", q.visibility)
	}
	for _, v := range q.visibility {
		if v > int32(backpressure.MaxPause/time.Second) {
			t.Errorf("held for %d s, want at most %s", v, backpressure.MaxPause)
		}
	}
}

// The deferral counter fits the room stack.max_message_bytes keeps for it
// below SQS's limit: its name, data type and largest value.
func TestDeferralCounterFitsItsRoom(t *testing.T) {
	t.Parallel()
	if got := len(AttrDeferrals) + len("Number") + len(fmt.Sprint(math.MinInt64)); got > config.HeldCounterBytes {
		t.Errorf("the deferral counter takes up to %d bytes, more than config.HeldCounterBytes (%d)", got, config.HeldCounterBytes)
	}
}
