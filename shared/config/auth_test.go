package config

import (
	"strings"
	"testing"
)

func TestSessionAuth(t *testing.T) {
	t.Parallel()
	job := func(source, auth string) string {
		return `{"jobs":[{"id":"j","source":{"type":"` + source + `","url":"https://h:4984/db","auth":` + auth + `},
			"outputs":[{"id":"pg","type":"postgres","postgres":{"dsn":{"env":"X"}}}]}]}`
	}
	const session = `{"type":"session","username":"alice","password":{"env":"SG_PASSWORD"}}`
	tests := []struct {
		name string
		in   string
		want []string // error substrings; none means valid
	}{
		{name: "sync gateway", in: job("sync_gateway", session)},
		{name: "app services, password from secrets manager", in: job("app_services",
			`{"type":"session","username":"alice","password":{"secret":"sg/alice","json_key":"password"}}`)},
		{name: "couchdb", in: job("couchdb", session),
			want: []string{`jobs[j].source.auth.type: session is for sync_gateway and app_services sources (POST {db}/_session), not "couchdb": use basic`}},
		{name: "edge server", in: job("edge_server", session),
			want: []string{`jobs[j].source.auth.type: session is for sync_gateway and app_services sources (POST {db}/_session), not "edge_server"`}},
		{name: "no username nor password", in: job("sync_gateway", `{"type":"session"}`),
			want: []string{"jobs[j].source.auth.username: is required for session auth", "jobs[j].source.auth.password: is required for session auth"}},
		{name: "password not a reference", in: job("sync_gateway", `{"type":"session","username":"alice","password":{}}`),
			want: []string{"jobs[j].source.auth.password: give env"}},
		{name: "unknown type", in: job("sync_gateway", `{"type":"cookie","username":"alice"}`),
			want: []string{`jobs[j].source.auth.type: "cookie" is not basic, bearer or session`}},
		{name: "an http output", in: httpJob(`{"url":"http://out/x","auth":` + session + `}`),
			want: []string{"jobs[a].outputs[h].http.auth.type: session is for a Sync Gateway source, not an output: use basic or bearer"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, err := Parse([]byte(tt.in))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if got := f.Jobs[0].Source.Auth; got.Type != AuthSession || got.Username != "alice" || got.Password == nil {
					t.Errorf("auth %+v, want a session for alice with a password reference", got)
				}
				return
			}
			wantErrorWith(t, err, "Parse accepted it", tt.want...)
			if err != nil && strings.Contains(err.Error(), "SG_PASSWORD") {
				t.Errorf("error names the secret's reference where it need not: %v", err)
			}
		})
	}
}
