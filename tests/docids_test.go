package tests

import (
	"context"
	"crypto/md5"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/docid"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/statetable/quarantine"
	"github.com/changes-worker/changes-worker/tests/faults"
)

// TestDocIDsKeptOut: with stack.doc_ids hash or off, the ids of documents
// that fail (an HTTP output refusing one, an S3 output whose key would be
// too long for another, an attachment entry the poller cannot copy for a
// third) appear nowhere in the pipeline's log, the DLQ messages' failure
// attributes or the quarantine, though each failure is logged, dead-lettered
// or recorded; under hash the DLQ attribute holds the id's hash.
func TestDocIDsKeptOut(t *testing.T) {
	parallel(t)
	const (
		refused = "pii-alice@example.com"
		att     = "pii-bob@example.com"
	)
	long := "pii-long-" + strings.Repeat("q", 1100) // beyond S3's 1,024-byte keys
	secrets := []string{"alice@example.com", "bob@example.com", "pii-long-qqqq"}
	for _, mode := range []string{config.DocIDsHash, config.DocIDsOff} {
		t.Run(mode, func(t *testing.T) {
			refuse := func(h http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if strings.Contains(r.URL.Path, "alice") {
						http.Error(w, "refused by the test", http.StatusBadRequest)
						return
					}
					h.ServeHTTP(w, r)
				})
			}
			ctx, s := parallelStack(t, stackOptions{outputs: []string{"rest", "archive"}, docIDs: mode, wrapRest: refuse,
				attachments: &config.Attachments{Enabled: true}})
			ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			for _, id := range []string{refused, long, "plain-1", "plain-2"} {
				if _, err := s.PutDoc(ctx, id, map[string]any{"n": 1}); err != nil {
					t.Fatal(err)
				}
			}
			marker := []byte("an attachment whose digest the source garbles")
			sum := md5.Sum(marker)
			digest := base64.StdEncoding.EncodeToString(sum[:])
			putAttached(ctx, t, s, att, map[string][]byte{"m.bin": marker})
			proxy, err := faults.NewSourceProxy(s.SourceURL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(proxy.Close)
			proxy.Rewrite(`"md5-`+digest+`"`, `"md5-not base64!"`)
			s.Config.Job("orders").Source.URL = proxy.URL()

			s.runUntilIdle(ctx, localrun.Options{})

			var texts []string
			dead := map[string][]dlq.Message{}
			for _, out := range []string{"rest", "archive"} {
				q, err := s.Queues(ctx, "orders", out)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := dlq.Scan(ctx, s.Deps.SQS, q.DLQURL, dlq.ScanOptions{}, func(m dlq.Message) bool {
					dead[out] = append(dead[out], m)
					texts = append(texts, m.Failure.DocID, m.Failure.Error)
					return true
				}); err != nil {
					t.Fatal(err)
				}
			}
			// The HTTP output refuses one id and cannot store the long one
			// (the reference receiver names a file after it); S3 cannot
			// take the long one as a key.
			if len(dead["rest"]) != 2 || len(dead["archive"]) != 1 {
				t.Fatalf("dlq: rest %d, archive %d messages; want 2 and 1", len(dead["rest"]), len(dead["archive"]))
			}
			if mode == config.DocIDsHash {
				want := map[string]bool{docid.Hash(refused): true, docid.Hash(long): true}
				for _, m := range dead["rest"] {
					if !want[m.Failure.DocID] {
						t.Errorf("rest dlq doc_id attribute %q, want the hash of %q or of the long id", m.Failure.DocID, refused)
					}
				}
			}
			qs, err := quarantine.List(ctx, s.Deps.DynamoDB, s.Config.TableName(), "orders")
			if err != nil {
				t.Fatal(err)
			}
			if len(qs) == 0 {
				t.Fatal("the attachment with a garbled digest was not recorded in the quarantine")
			}
			for _, e := range qs {
				texts = append(texts, e.Reason, string(e.Raw))
			}
			log := s.Logs().String()
			for _, want := range []string{"moved to dlq", "attachment not copied"} {
				if !strings.Contains(log, want) {
					t.Errorf("the log has no %q line", want)
				}
			}
			texts = append(texts, log)
			for _, text := range texts {
				for _, secret := range secrets {
					if i := strings.Index(text, secret); i >= 0 {
						t.Errorf("%q found under doc_ids %s: …%s…", secret, mode, text[max(0, i-80):min(len(text), i+80)])
					}
				}
			}
		})
	}
}
