package config

import (
	"strings"
	"testing"
)

// TestCleartextCredentials: credentials bound for an http:// URL whose host
// is not a loopback address are refused unless the configuration allows
// them by name; the error names the field and what would travel in clear.
func TestCleartextCredentials(t *testing.T) {
	t.Parallel()
	source := func(url, extra string) string {
		return `{"jobs":[{"id":"a","source":{"type":"sync_gateway","url":"` + url + `",
			"auth":{"type":"basic","username":"u","password":{"env":"SG_PASSWORD"}}` + extra + `},
			"outputs":[{"id":"s","type":"s3","s3":{}}]}]}`
	}
	tests := []struct {
		name string
		in   string
		want []string // error substrings; none: valid
	}{
		{name: "source auth over http", in: source("http://sgw.example.com:4984/db", ""),
			want: []string{"jobs[a].source.url: http:// would send source.auth in clear to sgw.example.com", "allow_cleartext_credentials"}},
		{name: "source auth over http, allowed", in: source("http://sgw.example.com:4984/db", `,"allow_cleartext_credentials":true`)},
		{name: "source auth over https", in: source("https://sgw.example.com:4984/db", "")},
		{name: "source auth to 127.0.0.1", in: source("http://127.0.0.1:4984/db", "")},
		{name: "source auth to localhost", in: source("http://LocalHost:4984/db", "")},
		{name: "source auth to ::1", in: source("http://[::1]:4984/db", "")},
		{name: "source auth to a name that starts like localhost", in: source("http://localhost.example.com:4984/db", ""),
			want: []string{"jobs[a].source.url: http:// would send source.auth in clear"}},
		{name: "output auth over http", in: httpJob(`{"url":"http://out.example.com/{doc_id}","auth":{"type":"bearer","token":{"env":"T"}}}`),
			want: []string{"jobs[a].outputs[h].http.url: http:// would send http.auth in clear to out.example.com"}},
		{name: "output secret header over http", in: httpJob(`{"url":"http://out.example.com/{doc_id}","headers":{"X-Api-Key":{"env":"K"},"X-Source":"demo"}}`),
			want: []string{"jobs[a].outputs[h].http.url: http:// would send http.headers[X-Api-Key] in clear"}},
		{name: "output url_secret over http", in: httpJob(`{"url":"http://out.example.com/{secret}/{doc_id}","url_secret":{"env":"HOOK"}}`),
			want: []string{"jobs[a].outputs[h].http.url: http:// would send http.url_secret in clear"}},
		{name: "output, all three, allowed", in: httpJob(`{"url":"http://out.example.com/{secret}/{doc_id}","url_secret":{"env":"HOOK"},
			"auth":{"type":"bearer","token":{"env":"T"}},"headers":{"X-Api-Key":{"env":"K"}},"allow_cleartext_credentials":true}`)},
		{name: "output without credentials over http", in: httpJob(`{"url":"http://out.example.com/{doc_id}","headers":{"X-Source":"demo"}}`)},
		{name: "output with credentials to 127.0.0.1", in: httpJob(`{"url":"http://127.0.0.1:8099/{doc_id}","auth":{"type":"bearer","token":{"env":"T"}}}`)},
		{name: "output over https", in: httpJob(`{"url":"https://out.example.com/{doc_id}","auth":{"type":"bearer","token":{"env":"T"}}}`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tt.in))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			wantErrorWith(t, err, "Parse accepted it", tt.want...)
			if err != nil && strings.Contains(err.Error(), "SG_PASSWORD") {
				t.Errorf("error names the secret's reference: %v", err)
			}
		})
	}
}

// TestPostgresTLS: postgres.tls names one PEM bundle, by path or inline.
func TestPostgresTLS(t *testing.T) {
	t.Parallel()
	const pem = `-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n`
	job := func(tls string) string {
		return `{"jobs":[{"id":"a","source":{"type":"couchdb","url":"https://h/db"},
			"outputs":[{"id":"pg","type":"postgres","postgres":{"dsn":{"env":"PG_DSN"},"tls":` + tls + `}}]}]}`
	}
	tests := []struct {
		name string
		tls  string
		want string // an error substring; "" for valid
	}{
		{name: "ca_pem", tls: `{"ca_pem":"` + pem + `"}`},
		{name: "ca_file", tls: `{"ca_file":"/etc/ssl/rds.pem"}`},
		{name: "neither", tls: `{}`, want: "jobs[a].outputs[pg].postgres.tls: give ca_file (a PEM bundle's path) or ca_pem (the bundle)"},
		{name: "both", tls: `{"ca_file":"/x","ca_pem":"` + pem + `"}`, want: "jobs[a].outputs[pg].postgres.tls: give ca_file or ca_pem, not both"},
		{name: "not PEM", tls: `{"ca_pem":"MIIB"}`, want: "jobs[a].outputs[pg].postgres.tls.ca_pem: holds no PEM certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, err := Parse([]byte(job(tt.tls)))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if f.Jobs[0].Outputs[0].Postgres.TLS == nil {
					t.Error("postgres.tls was dropped")
				}
				return
			}
			wantErrorWith(t, err, "Parse accepted it", tt.want)
		})
	}
}
