package feed

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/changes-worker/changes-worker/shared/config"
)

func TestTransient(t *testing.T) {
	t.Parallel()
	status := func(code int) error { return &StatusError{Op: "changes", Status: code, Reason: "x"} }
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{name: "nil", err: nil, want: false},
		{name: "500", err: status(500), want: true},
		{name: "502", err: status(502), want: true},
		{name: "503 wrapped", err: fmt.Errorf("poll: %w", status(503)), want: true},
		{name: "408", err: status(408), want: true},
		{name: "429", err: status(429), want: true},
		{name: "301", err: status(301), want: false},
		{name: "400", err: status(400), want: false},
		{name: "401", err: status(401), want: false},
		{name: "403", err: status(403), want: false},
		{name: "404", err: status(404), want: false},
		{name: "409", err: status(409), want: false},
		{name: "malformed", err: malformed("changes", "unexpected end of JSON input"), want: true},
		{name: "connection refused", err: &transportError{op: "changes", err: &net.OpError{Op: "dial", Net: "tcp",
			Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}, want: true},
		{name: "bare net error", err: &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, want: true},
		{name: "deadline", err: fmt.Errorf("fetch docs: %w", context.DeadlineExceeded), want: true},
		{name: "cancelled", err: &transportError{op: "changes", err: context.Canceled}, want: false},
		{name: "unclassified", err: errors.New("since is not a JSON value"), want: false},
		{name: "unknown authority", err: &transportError{op: "changes", err: &tls.CertificateVerificationError{
			Err: x509.UnknownAuthorityError{}}}, want: false},
		{name: "wrong host name", err: &transportError{op: "changes", err: x509.HostnameError{Host: "sg"}}, want: false},
		{name: "expired", err: &transportError{op: "changes", err: x509.CertificateInvalidError{Reason: x509.Expired}}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Transient(tt.err); got != tt.want {
				t.Errorf("Transient(%v) = %t, want %t", tt.err, got, tt.want)
			}
		})
	}
}

func TestStatusError(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 500)
	tests := []struct {
		name       string
		status     int
		body       string
		wantErr    string
		isNotFound bool
	}{
		{name: "error and reason", status: 404, body: `{"error":"not_found","reason":"deleted"}`,
			wantErr: "get: source answered 404 not_found: deleted", isNotFound: true},
		{name: "error only", status: 409, body: `{"error":"conflict"}`, wantErr: "get: source answered 409 conflict"},
		{name: "reason not a string", status: 400, body: `{"error":"bad_request","reason":{"x":1}}`,
			wantErr: "get: source answered 400 bad_request"},
		{name: "not json", status: 500, body: `<h1>oops</h1>`, wantErr: "get: source answered 500 internal server error"},
		{name: "control characters", status: 500, body: `{"error":"x","reason":"a\nb\u0000c"}`,
			wantErr: "get: source answered 500 x: a b c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := newStatusError("get", tt.status, []byte(tt.body))
			if got := err.Error(); got != tt.wantErr {
				t.Errorf("Error() = %q, want %q", got, tt.wantErr)
			}
			if got := errors.Is(fmt.Errorf("wrapped: %w", err), ErrNotFound); got != tt.isNotFound {
				t.Errorf("errors.Is(ErrNotFound) = %t, want %t", got, tt.isNotFound)
			}
		})
	}
	t.Run("long reason is truncated", func(t *testing.T) {
		t.Parallel()
		err := newStatusError("get", 500, []byte(`{"error":"x","reason":"`+long+`"}`))
		if n := utf8.RuneCountInString(err.Reason); n > maxReason+1 || !utf8.ValidString(err.Reason) {
			t.Errorf("Reason has %d runes (valid UTF-8: %t), want at most %d", n, utf8.ValidString(err.Reason), maxReason+1)
		}
	})
}

// Every request reports its operation, status and time, a refused one
// (401) and one with no answer (status 0) included.
func TestOnRequest(t *testing.T) {
	t.Parallel()
	f := newFakeSource(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(10 * time.Millisecond)
		reply(http.StatusUnauthorized, `{"error":"unauthorized"}`)(w, r)
	})
	type seen struct {
		op     string
		status int
		d      time.Duration
	}
	var mu sync.Mutex
	var got []seen
	c := mustNew(t, Options{SourceType: config.SourceCouchDB, URL: f.db(), Username: "u", Password: "wrong",
		OnRequest: func(op string, status int, d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, seen{op, status, d})
		}})
	if _, err := c.Changes(t.Context(), nil, 0); err == nil {
		t.Fatal("Changes succeeded against a 401")
	}
	f.srv.Close()
	if _, err := c.Changes(t.Context(), nil, 0); err == nil {
		t.Fatal("Changes succeeded against a closed server")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0].op != "changes" || got[0].status != 401 || got[0].d < 10*time.Millisecond || got[1].status != 0 {
		t.Fatalf("requests seen %+v, want a 401 of at least 10ms then one without an answer", got)
	}
}
