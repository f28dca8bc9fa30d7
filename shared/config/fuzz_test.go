package config

import (
	"bytes"
	"encoding/json"
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
		f.Add([]byte(`{"stack":{"prefix":"p"},"jobs":[{"id":"a","source":{"type":"sync_gateway","url":"http://h/db","auth":{"type":"bearer","token":{"secret":` + q(id) + `}}},
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
