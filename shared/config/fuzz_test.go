package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// FuzzParse: Parse never panics; a configuration it accepts encodes and
// parses again to the same configuration, and each of its work queues
// routes back to its own (job, output).
func FuzzParse(f *testing.F) {
	sample, err := os.ReadFile("../../localstack/jobs.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sample)
	for _, id := range testenv.HostileIDs() {
		q := func(s string) string {
			b, _ := json.Marshal(s)
			return string(b)
		}
		f.Add([]byte(`{"stack":{"prefix":"p"},"jobs":[{"id":"a","source":{"type":"sync_gateway","url":"https://h/db","auth":{"type":"bearer","token":{"secret":` + q(id) + `}}},
			"feed":{"channels":[` + q(id) + `],"timeout":1.5},"outputs":[
			{"id":"s","type":"s3","s3":{"prefix":` + q(id+"/") + `,"key_template":` + q(id+"{doc_id}") + `}},
			{"id":"h","type":"http","http":{"url":` + q("https://x/"+id+"/{doc_id}?q="+id) + `,"headers":{"X-Source":` + q(id) + `,"X-Api-Key":{"env":` + q(id) + `}}}},
			{"id":"p","type":"postgres","postgres":{"dsn":{"env":"D"},"mapping":{"filter":{"path":` + q(id) + `,"equals":` + q(id) + `},
				"tables":[{"name":"t","columns":[{"name":"c","path":` + q(id) + `,"type":"text"}]}]}}}]}]}`))
	}
	for _, s := range []string{
		`{"jobs":[{"id":"orders-pg","source":{"type":"couchdb","url":"http://h/db"},"outputs":[{"id":"x","type":"s3","s3":{}}]},
			{"id":"orders","source":{"type":"couchdb","url":"http://h/db"},"outputs":[{"id":"pg-x","type":"s3","s3":{}}]}]}`,
		`{"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"feed":{"timeout":0},"outputs":[{"id":"s","type":"s3","s3":{}}]}]} // c`,
		`/* unterminated`, `{"jobs":[{"id":"a"}]} /* x */ "`, `{"jobs":null}`, `{"stack":{"poller_timeout":1e300}}`, `{"stack":{"poller_timeout":"-1s"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := Parse(b)
		if err != nil {
			return
		}
		enc, err := json.Marshal(cfg)
		if err != nil {
			t.Fatalf("encode parsed configuration: %v", err)
		}
		again, err := Parse(enc)
		if err != nil {
			t.Fatalf("parse re-encoded configuration: %v\n%s", err, enc)
		}
		enc2, err := json.Marshal(again)
		if err != nil {
			t.Fatalf("encode again: %v", err)
		}
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("round trip changed the configuration:\n%s\n%s", enc, enc2)
		}
		for _, j := range cfg.Jobs {
			for _, o := range j.Outputs {
				for _, name := range []string{cfg.QueueName(j, o)} {
					r, ok := cfg.RouteByQueueName(name)
					if !ok || r.Job != j || r.Output != o {
						t.Fatalf("queue %s routes to %v, want %s/%s", name, r, j.ID, o.ID)
					}
					if len(cfg.DLQName(j, o)) > maxQueueName || strings.Contains(name, "..") {
						t.Fatalf("queue name %s", name)
					}
				}
			}
		}
	})
}

// FuzzShownURL: ShownURL never shows what lies between "://" and a URL's
// last '@' (credentials, however written) nor anything from its first '?'
// or '#' on (a query may hold a key), and quotes only what starts with a
// scheme and "://"; an error of the URL check holds nothing else of it.
func FuzzShownURL(f *testing.F) {
	for _, u := range []string{
		"https://couch:5984/db", "http://admin:pw-456@couch:5984/db", "http:/admin:pw-456@couch:5984/db",
		"ftp://admin:pw/456@couch:5984/db", "ftp://admin:pw-4?56@couch:5984/db", "ftp://admin:pw-4#56@couch:5984/db",
		"ftp://u:p@h/x?k=v@w", "ftp://h/x?key=S3CR3T", "admin:pw@couch", "http:\\\\admin:pw@couch", "://a@b", "a+b.c-d://x@y/z", "",
	} {
		f.Add(u)
	}
	f.Fuzz(func(t *testing.T, u string) {
		shown, ok := ShownURL(u)
		scheme, rest, found := strings.Cut(u, "://")
		if !ok {
			if shown != "" {
				t.Fatalf("ShownURL(%q) = %q, not quotable, yet not empty", u, shown)
			}
		} else {
			if !found || !validScheme(scheme) || !strings.HasPrefix(shown, scheme+"://") {
				t.Fatalf("ShownURL(%q) = %q: quoted without a scheme and \"://\" first", u, shown)
			}
			// What is shown after the scheme: an optional "…" or "…@", then
			// a piece of rest that starts after its last '@' and ends at its
			// first '?' or '#'.
			end := len(rest)
			if i := strings.IndexAny(rest, "?#"); i >= 0 {
				end = i
			}
			body := shown[len(scheme)+len("://"):]
			body = strings.TrimPrefix(strings.TrimPrefix(body, "…@"), "…")
			if !strings.HasSuffix(rest[:end], body) {
				t.Fatalf("ShownURL(%q) = %q: %q is not what precedes its query or fragment", u, shown, body)
			}
			if start := end - len(body); start <= strings.LastIndexByte(rest, '@') && body != "" {
				t.Fatalf("ShownURL(%q) = %q: shows what precedes an '@'", u, shown)
			}
		}
		// The URL check's error holds the shown form at most.
		if err := checkURL(u); err != nil && strings.Contains(u, "@") {
			msg := err.Error()
			if ok {
				msg = strings.ReplaceAll(msg, fmt.Sprintf("%q", shown), "")
			}
			for _, w := range strings.FieldsFunc(u, func(r rune) bool { return strings.ContainsRune(":/?#@", r) }) {
				if len(w) >= 6 && strings.Contains(msg, w) && !strings.Contains(checkURLWords, w) {
					t.Fatalf("checkURL(%q) error shows %q: %v", u, w, err)
				}
			}
		}
	})
}

// checkURLWords is the fixed text of checkURL's errors.
const checkURLWords = `must start with http:// or https://, and must not contain credentials; use auth with a secret reference (the value is not shown: it does not start with a scheme and "://")`
