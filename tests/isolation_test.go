package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/localrun"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
	"github.com/changes-worker/changes-worker/shared/testenv/testbucket"
	"github.com/changes-worker/changes-worker/shared/verify"
)

// TestJobsKeepTheirOwnS3Keys: two jobs whose sources hold the same document
// ids, each with an S3 output that names neither bucket nor prefix, write
// their objects under prefixes of their own in the stack bucket; each
// output verifies clean against its own source.
func TestJobsKeepTheirOwnS3Keys(t *testing.T) {
	parallel(t)
	ctx := t.Context()
	hc := &http.Client{Timeout: time.Minute}
	other := testenv.CouchBaseURL() + "/" + testenv.UniqueName("isolation-beta")
	if err := sample.CreateDB(ctx, hc, other); err != nil {
		t.Fatalf("create source database (start the local services with `make up`): %v", err)
	}
	t.Cleanup(func() {
		if err := sample.DeleteDB(context.Background(), hc, other); err != nil {
			t.Logf("delete %s: %v", other, err)
		}
	})
	job := func(id, url string) *config.Job {
		return &config.Job{ID: id, Source: config.Source{Type: config.SourceCouchDB, URL: url},
			Feed: config.Feed{Limit: 100, Timeout: config.Duration(2 * time.Second)}, Lease: config.Lease{TTL: config.Duration(6 * time.Second)},
			Outputs: []*config.Output{{ID: "archive", Type: config.OutputS3, MaxReceiveCount: 3, S3: &config.S3Output{}}}}
	}
	s := stack.ForTest(t, stack.Options{Config: &config.File{
		Stack: config.Stack{PollerTimeout: config.Duration(15 * time.Second), WriterTimeout: config.Duration(10 * time.Second)},
		Jobs:  []*config.Job{job("alpha", ""), job("beta", other)},
	}})

	// The same ids in both sources, with other bodies and, for some, other
	// revisions: in a shared key one job's object would replace or keep out
	// the other's.
	put := func(db, id string, body map[string]any) string {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, db+"/"+id, strings.NewReader(string(b)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var res struct {
			Rev string `json:"rev"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("put %s/%s: status %d, %v", db, id, resp.StatusCode, err)
		}
		return res.Rev
	}
	for i := range 20 {
		id := fmt.Sprintf("order-%d", i)
		put(s.SourceURL, id, map[string]any{"job": "alpha", "n": i})
		rev := put(other, id, map[string]any{"job": "beta", "n": i})
		if i%3 == 0 {
			put(other, id, map[string]any{"_rev": rev, "job": "beta", "n": i, "again": true})
		}
	}
	sum, err := s.RunUntilIdle(ctx, localrun.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for k, st := range sum.Outputs {
		if st.DeadLettered != 0 {
			t.Errorf("%s: %d dead-lettered", k, st.DeadLettered)
		}
	}

	for _, id := range []string{"alpha", "beta"} {
		j, o, err := s.Output(id, "archive")
		if err != nil {
			t.Fatal(err)
		}
		if want := id + "/archive/"; o.S3.Prefix != want || o.S3.Bucket != s.Config.Stack.Bucket {
			t.Errorf("job %s: s3 output in s3://%s/%s, want the stack bucket and prefix %s", id, o.S3.Bucket, o.S3.Prefix, want)
		}
		src, err := s.Deps.Feed(ctx, j)
		if err != nil {
			t.Fatal(err)
		}
		out, err := s.Deps.State(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := verify.Compare(ctx, src, out, verify.Options{PageSize: 100, Content: true, Recheck: true})
		if err != nil {
			t.Fatalf("verify %s: %v", id, err)
		}
		if !rep.Clean() {
			t.Errorf("verify %s/archive: %d documents differ, e.g. %v", id, len(rep.Drift), rep.Drift[:min(3, len(rep.Drift))])
		}
		body, ok, err := s.Body(ctx, id, "archive", "order-1")
		if err != nil || !ok || !strings.Contains(string(body), `"job":"`+id+`"`) {
			t.Errorf("job %s's order-1: %s (held %t, %v), want its own source's body", id, body, ok, err)
		}
	}
	keys, err := s.Deps.S3.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(s.Config.Stack.Bucket)})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys.Contents {
		if key := aws.ToString(k.Key); !strings.HasPrefix(key, "alpha/archive/") && !strings.HasPrefix(key, "beta/archive/") {
			t.Errorf("object %s is outside both outputs' prefixes", key)
		}
	}
}

// TestDeploymentsSharingABucketKeepTheirClaimChecks: two deployments (two
// stack prefixes) share stack.bucket and both have a job "orders" whose
// bodies travel as claim checks. The first one's poller queues its changes,
// the second one runs whole, then the first one's writer delivers: each
// output holds its own source's bodies.
func TestDeploymentsSharingABucketKeepTheirClaimChecks(t *testing.T) {
	parallel(t)
	ctx := t.Context()
	bucket := testbucket.Create(t, s3.NewFromConfig(testenv.AWS(t), awsconf.S3Options))
	deployment := func(name string) *stack.Stack {
		return stack.ForTest(t, stack.Options{Name: t.Name() + "-" + name, Config: &config.File{
			Stack: config.Stack{Bucket: bucket, MaxMessageBytes: 1024,
				PollerTimeout: config.Duration(15 * time.Second), WriterTimeout: config.Duration(10 * time.Second)},
			Jobs: []*config.Job{{ID: "orders", Feed: config.Feed{Limit: 100, Timeout: config.Duration(2 * time.Second)},
				Lease:   config.Lease{TTL: config.Duration(6 * time.Second)},
				Outputs: []*config.Output{{ID: "pg", Type: config.OutputPostgres, MaxReceiveCount: 3, Postgres: &config.PostgresOutput{CreateTables: true}}}}},
		}})
	}
	blue, green := deployment("blue"), deployment("green")
	const docs = 12
	pad := strings.Repeat("x", 2000) // past max_message_bytes: a claim check
	for _, d := range []struct {
		s    *stack.Stack
		name string
	}{{blue, "blue"}, {green, "green"}} {
		for i := range docs {
			if _, err := d.s.PutDoc(ctx, fmt.Sprintf("order-%d", i), map[string]any{"deployment": d.name, "pad": pad}); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Blue's poller alone, until its changes are queued.
	q, err := blue.Queues(ctx, "orders", "pg")
	if err != nil {
		t.Fatal(err)
	}
	_, stop := blue.RunInBackground(t, localrun.Options{NoWriter: true, Tick: time.Second})
	deadline := time.Now().Add(time.Minute)
	for {
		d, err := dlq.QueueDepth(ctx, blue.Deps.SQS, q.WorkURL)
		if err != nil {
			t.Fatal(err)
		}
		if d.Total() >= docs {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("blue's poller queued %d changes in a minute, want %d", d.Total(), docs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	stop()
	// Green whole, then blue's writer.
	for _, s := range []*stack.Stack{green, blue} {
		sum, err := s.RunUntilIdle(ctx, localrun.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for k, st := range sum.Outputs {
			if st.DeadLettered != 0 {
				t.Errorf("%s %s: %d dead-lettered", s.Name, k, st.DeadLettered)
			}
		}
	}

	for _, d := range []struct {
		s    *stack.Stack
		name string
	}{{blue, "blue"}, {green, "green"}} {
		j, o, err := d.s.Output("orders", "pg")
		if err != nil {
			t.Fatal(err)
		}
		src, err := d.s.Deps.Feed(ctx, j)
		if err != nil {
			t.Fatal(err)
		}
		out, err := d.s.Deps.State(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := verify.Compare(ctx, src, out, verify.Options{PageSize: 100, Content: true, Recheck: true})
		if err != nil {
			t.Fatalf("verify %s: %v", d.name, err)
		}
		if !rep.Clean() {
			t.Errorf("verify %s: %d documents differ, e.g. %v", d.name, len(rep.Drift), rep.Drift[:min(3, len(rep.Drift))])
		}
		body, ok, err := d.s.Body(ctx, "orders", "pg", "order-1")
		if err != nil || !ok || !strings.Contains(string(body), `"deployment": "`+d.name+`"`) && !strings.Contains(string(body), `"deployment":"`+d.name+`"`) {
			t.Errorf("%s's order-1 begins %.60s (held %t, %v), want its own source's body", d.name, body, ok, err)
		}
	}
}
