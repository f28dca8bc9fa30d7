package pipeline

import (
	"strings"
	"testing"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/secret"
)

// TestPoolRefusesPlaintextFallback: a PostgreSQL connection string whose
// connections may silently go without TLS (no sslmode, prefer, allow) is
// refused, naming sslmode and never showing the string; one that says what
// it wants (disable, require, verify-full) opens.
func TestPoolRefusesPlaintextFallback(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	tests := []struct {
		name   string
		dsn    string
		refuse bool
	}{
		{name: "no sslmode", dsn: "postgres://u:pw-456@127.0.0.1:1/db", refuse: true},
		{name: "prefer", dsn: "postgres://u:pw-456@127.0.0.1:1/db?sslmode=prefer", refuse: true},
		{name: "allow", dsn: "postgres://u:pw-456@127.0.0.1:1/db?sslmode=allow", refuse: true},
		{name: "keywords without sslmode", dsn: "host=127.0.0.1 port=1 user=u password=pw-456 dbname=db", refuse: true},
		{name: "two hosts, prefer", dsn: "postgres://u:pw-456@127.0.0.1:1,127.0.0.1:2/db", refuse: true},
		{name: "disable", dsn: "postgres://u:pw-456@127.0.0.1:1/db?sslmode=disable"},
		{name: "require", dsn: "postgres://u:pw-456@127.0.0.1:1/db?sslmode=require"},
		{name: "verify-full", dsn: "host=127.0.0.1 port=1 user=u password=pw-456 dbname=db sslmode=verify-full"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &Deps{Secrets: &secret.Resolver{Lookup: func(string) (string, bool) { return tt.dsn, true }}}
			defer d.Close()
			_, err := d.Pool(t.Context(), &config.PostgresOutput{DSN: config.SecretRef{Env: "PG_DSN"}, MaxConns: 1})
			switch {
			case tt.refuse && err == nil:
				t.Fatal("Pool opened a pool whose connections may go without TLS")
			case tt.refuse && !strings.Contains(err.Error(), "sslmode"):
				t.Errorf("Pool error = %v, want one naming sslmode", err)
			case !tt.refuse && err != nil:
				t.Fatalf("Pool: %v", err)
			}
			if err != nil && strings.Contains(err.Error(), "pw-456") {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}
}
