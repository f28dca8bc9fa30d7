package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver/pgsink"
	"github.com/changes-worker/changes-worker/shared/deliver/s3sink"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/verify"
)

// TestVerifyFindsAndRepairsDrift runs a pipeline to PostgreSQL and S3 until
// idle, checks that verify finds both outputs in sync, tampers with them
// (a deleted row, a stale row, a row the source never had; a deleted
// object, a stale object, an object the source never had), checks that
// verify reports exactly those, repairs them, lets the writer drain, and
// checks that verify is clean again and that a later source change still
// wins over the repair.
func TestVerifyFindsAndRepairsDrift(t *testing.T) {
	ctx, s := parallelStack(t, outPG, outS3)
	revs := map[string]string{}
	for i := range 12 {
		id := fmt.Sprintf("doc-%02d", i)
		revs[id] = s.putDoc(id, map[string]any{"n": i}, "")
	}
	revs["doc-01"] = s.putDoc("doc-01", map[string]any{"n": 1, "v": 2}, revs["doc-01"])
	s.deleteDoc("doc-11", revs["doc-11"])
	delete(revs, "doc-11")
	s.run(false)

	s.verifyInSync(ctx, t.Fatalf, "before tampering", []string{"pg", "s3"}, "the source has 11 live documents, the output holds 11")

	// Tamper with PostgreSQL behind the sink's back.
	pool := testenv.Postgres(t)
	data, versions := s.pgTables(outPG)
	for _, stmt := range []string{
		`DELETE FROM ` + data + ` WHERE doc_id = 'doc-03'`,
		`UPDATE ` + data + ` SET rev = '1-stale', body = '{"stale":true}' WHERE doc_id = 'doc-05'`,
		`UPDATE ` + versions + ` SET rev = '1-stale', generation = 1, counter = 1 WHERE doc_id = 'doc-05'`,
		`INSERT INTO ` + data + ` (doc_id, rev, seq, body) VALUES ('ghost', '1-g', '1', '{}')`,
		`INSERT INTO ` + versions + ` (doc_id, generation, counter, rev, deleted, seq) VALUES ('ghost', 1, 1, '1-g', false, '1')`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("tamper: %s: %v", stmt, err)
		}
	}
	// And with S3.
	out, sink := s.s3Output(1)
	if _, err := s.Deps.S3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &out.Bucket, Key: aws.String(sink.Key("doc-04"))}); err != nil {
		t.Fatal(err)
	}
	for id, rev := range map[string]string{"doc-06": "1-stale", "ghost-s3": "1-g"} {
		_, err := s.Deps.S3.PutObject(ctx, &s3.PutObjectInput{
			Bucket: &out.Bucket, Key: aws.String(sink.Key(id)), Body: bytes.NewReader([]byte(`{"_id":"` + id + `"}`)),
			Metadata: map[string]string{s3sink.MetaRev: rev, s3sink.MetaVersion: "1.1"},
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	want := map[string][]string{
		"pg": {"missing 1", `"doc-03" source ` + revs["doc-03"], "stale 1", `"doc-05" source ` + revs["doc-05"] + ", output 1-stale", "unexpected 1", `"ghost" output 1-g`},
		"s3": {"missing 1", `"doc-04" source ` + revs["doc-04"], "stale 1", `"doc-06" source ` + revs["doc-06"] + ", output 1-stale", "unexpected 1", `"ghost-s3" output 1-g`},
	}
	st, err := s.Leases.Get(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	gen := st.Generation
	for _, o := range []string{"pg", "s3"} {
		got, _, err := s.cli(ctx, "", "verify", "--output", o)
		if exitCode(err) != 2 {
			t.Fatalf("verify %s after tampering: exit %d (%v), want 2\n%s", o, exitCode(err), err, got)
		}
		for _, w := range want[o] {
			if !strings.Contains(squeeze(got), w) {
				t.Errorf("verify %s does not report %q:\n%s", o, w, got)
			}
		}
		res := s.verifyJSON(o)
		if c := res.Report.Counts; c[verify.Missing] != 1 || c[verify.Stale] != 1 || c[verify.Unexpected] != 1 || res.Report.SourceDocs != 11 {
			t.Errorf("verify %s --json: %+v", o, res.Report)
		}

		// Repair, asked and confirmed on stdin.
		got, errOut, err := s.cli(ctx, "y\n", "verify", "--output", o, "--repair")
		if exitCode(err) != 2 || !strings.Contains(got, "repair: enqueued 2 documents and 1 tombstones") {
			t.Fatalf("verify %s --repair: exit %d (%v)\n%s\n%s", o, exitCode(err), err, got, errOut)
		}
		gen++ // each repair takes the lease once
		if !strings.Contains(got, fmt.Sprintf("at generation %d", gen)) {
			t.Errorf("verify %s --repair did not repair at generation %d:\n%s", o, gen, got)
		}
	}
	s.run(true)
	s.verifyInSync(ctx, t.Errorf, "after the repair", []string{"pg", "s3"})
	if rev, v := s.pgRev(outPG, "doc-05"); rev != revs["doc-05"] || v.Generation != gen-1 {
		t.Errorf("doc-05 after the repair: %s at %s, want %s at generation %d", rev, v, revs["doc-05"], gen-1)
	}
	if rev, _ := s.pgRev(outPG, "ghost"); rev != "" {
		t.Errorf("ghost still has a data row at %s after the repair", rev)
	}

	// A change after the repair outranks it: the next poller's generation
	// is higher than the repair's.
	revs["doc-05"] = s.putDoc("doc-05", map[string]any{"n": 5, "v": 3}, revs["doc-05"])
	s.run(false)
	if rev, v := s.pgRev(outPG, "doc-05"); rev != revs["doc-05"] || v.Generation <= gen {
		t.Errorf("doc-05 after a later change: %s at %s, want %s at a generation above %d", rev, v, revs["doc-05"], gen)
	}
	for _, o := range []string{"pg", "s3"} {
		if got, _, err := s.cli(ctx, "", "verify", "--output", o); err != nil {
			t.Errorf("verify %s after a later change: %v\n%s", o, err, got)
		}
	}
}

// verifyJSON runs verify --json on an output (drift exits 2: the status is
// not checked) and decodes what it printed.
func (s *testStack) verifyJSON(output string) verify.Result {
	s.t.Helper()
	var res verify.Result
	out, _, _ := s.cli(s.t.Context(), "", "verify", "--output", output, "--json")
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		s.t.Fatalf("verify --json: %v\n%s", err, out)
	}
	return res
}

// TestVerifyHTTPUnsupported: an HTTP output has no state to read.
func TestVerifyHTTPUnsupported(t *testing.T) {
	ctx, s := parallelStack(t, outPG, outHTTP)
	_, errOut, err := s.cli(ctx, "", "verify", "--output", "rest")
	if exitCode(err) != exitUnsupported || !strings.Contains(errOut, "verify is not supported for http outputs") {
		t.Errorf("verify of an http output: exit %d (%v), stderr:\n%s", exitCode(err), err, errOut)
	}
}

// TestVerifyListsWhatAllDocsSkips: pouchdb-server's _all_docs leaves out
// ids such as "注文-1"; verify lists the source through _changes, as the
// pipeline reads it, so a document whose output copy was deleted behind the
// sink's back is reported under such an id, and a repair brings it back.
func TestVerifyListsWhatAllDocsSkips(t *testing.T) {
	ctx, s := parallelStack(t, outPG, outS3)
	revs := map[string]string{}
	for _, id := range []string{"plain", "注文-1", "注文-2"} {
		revs[id] = s.putDoc(id, map[string]any{"id": id}, "")
	}
	s.run(false)
	if rev, _ := s.pgRev(outPG, "注文-1"); rev != revs["注文-1"] {
		t.Fatalf("the pipeline delivered 注文-1 at %q, want %s", rev, revs["注文-1"])
	}
	s.verifyInSync(ctx, t.Fatalf, "before tampering", []string{"pg", "s3"}, "the source has 3 live documents, the output holds 3")

	// Delete the copies of 注文-1 behind the sinks' backs: the data row with
	// its versions row, and the object.
	pool := testenv.Postgres(t)
	dataTable, versionsTable, err := pgsink.Tables(*s.Config.Jobs[0].Outputs[0].Postgres, outPG)
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{dataTable.Sanitize(), versionsTable.Sanitize()} {
		if _, err := pool.Exec(ctx, `DELETE FROM `+table+` WHERE doc_id = $1`, "注文-1"); err != nil {
			t.Fatal(err)
		}
	}
	out, sink := s.s3Output(1)
	if _, err := s.Deps.S3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &out.Bucket, Key: aws.String(sink.Key("注文-1"))}); err != nil {
		t.Fatal(err)
	}

	for _, o := range []string{"pg", "s3"} {
		got, errOut, err := s.cli(ctx, "", "verify", "--output", o)
		if exitCode(err) != 2 || !strings.Contains(squeeze(got), `missing 1 "注文-1" source `+revs["注文-1"]) {
			t.Fatalf("verify %s after deleting 注文-1: exit %d (%v), want 2 and 注文-1 missing\n%s\n%s", o, exitCode(err), err, got, errOut)
		}
		got, errOut, err = s.cli(ctx, "", "verify", "--output", o, "--repair", "--yes")
		if exitCode(err) != 2 || !strings.Contains(got, "repair: enqueued 1 documents and 0 tombstones") {
			t.Fatalf("verify %s --repair: exit %d (%v)\n%s\n%s", o, exitCode(err), err, got, errOut)
		}
	}
	s.run(true)
	s.verifyInSync(ctx, t.Errorf, "after the repair", []string{"pg", "s3"})
	if rev, _ := s.pgRev(outPG, "注文-1"); rev != revs["注文-1"] {
		t.Errorf("注文-1 after the repair: %q, want %s", rev, revs["注文-1"])
	}
}

// TestVerifyComparesContent runs a pipeline to PostgreSQL in document and
// mapping mode and to S3, changes the content of one document in each
// output behind its sink's back while keeping its revision, and checks that
// verify reports exactly that document as differing (and only with content
// comparison on), that a repair rewrites it, and that verify is then clean.
func TestVerifyComparesContent(t *testing.T) {
	ctx, s := parallelStack(t, outPG, outPGMap, outS3)
	revs := map[string]string{}
	for i := range 6 {
		id := fmt.Sprintf("doc-%02d", i)
		revs[id] = s.putDoc(id, map[string]any{"n": i, "total": "12.50", "items": []any{map[string]any{"sku": "a"}, map[string]any{"sku": "b"}}}, "")
	}
	s.run(false)
	s.verifyInSync(ctx, t.Fatalf, "before tampering", []string{"pg", "pgmap", "s3"}, "content compared for 6 documents")

	// One document per output gets other content at the same revision.
	pool := testenv.Postgres(t)
	data, _, err := pgsink.Tables(*s.Config.Jobs[0].Outputs[0].Postgres, outPG)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`UPDATE ` + data.Sanitize() + ` SET body = jsonb_set(body, '{n}', '99') WHERE doc_id = 'doc-01'`,
		`UPDATE ` + pgx.Identifier{s.mapTable + "_items"}.Sanitize() + ` SET sku = 'z' WHERE doc_id = 'doc-02' AND idx = 1`,
	} {
		if tag, err := pool.Exec(ctx, stmt); err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("tamper: %s: %v (%d rows)", stmt, err, tag.RowsAffected())
		}
	}
	out, sink := s.s3Output(2)
	key := aws.String(sink.Key("doc-03"))
	head, err := s.Deps.S3.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &out.Bucket, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Deps.S3.PutObject(ctx, &s3.PutObjectInput{Bucket: &out.Bucket, Key: key, Metadata: head.Metadata,
		Body: strings.NewReader(`{"_id":"doc-03","_rev":"` + revs["doc-03"] + `","n":3,"total":"13.50"}`)})
	if err != nil {
		t.Fatal(err)
	}

	tampered := map[string]string{
		"pg":    `"doc-01" rev ` + revs["doc-01"] + ` (the stored body differs from the source's)`,
		"pgmap": `"doc-02" rev ` + revs["doc-02"] + " (table " + s.mapTable + "_items: 1 stored rows the mapping does not produce, 1 mapped rows not stored)",
		"s3":    `"doc-03" rev ` + revs["doc-03"] + ` (the stored object differs from the source's body)`,
	}
	for _, o := range []string{"pg", "pgmap", "s3"} {
		got, errOut, err := s.cli(ctx, "", "verify", "--output", o)
		if exitCode(err) != 2 || !strings.Contains(squeeze(got), "content differs 1 "+tampered[o]) {
			t.Errorf("verify %s after tampering: exit %d (%v), want 2 and %s\n%s\n%s", o, exitCode(err), err, tampered[o], got, errOut)
		}
		if got, _, err := s.cli(ctx, "", "verify", "--output", o, "--content=false"); err != nil || !strings.Contains(got, "in sync") {
			t.Errorf("verify %s --content=false: %v, want in sync (revisions only)\n%s", o, err, got)
		}
		res := s.verifyJSON(o)
		if c := res.Report.Counts; c[verify.Content] != 1 || len(c) != 1 || res.Report.ContentChecked != 6 {
			t.Errorf("verify %s --json: %+v", o, res.Report)
		}
		got, errOut, err = s.cli(ctx, "", "verify", "--output", o, "--repair", "--yes")
		if exitCode(err) != 2 || !strings.Contains(got, "repair: enqueued 1 documents and 0 tombstones") {
			t.Fatalf("verify %s --repair: exit %d (%v)\n%s\n%s", o, exitCode(err), err, got, errOut)
		}
	}
	s.run(true)
	s.verifyInSync(ctx, t.Errorf, "after the repair", []string{"pg", "pgmap", "s3"})
	var n int
	if err := pool.QueryRow(ctx, `SELECT (body->>'n')::int FROM `+data.Sanitize()+` WHERE doc_id = 'doc-01'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("doc-01 after the repair: n = %d (%v), want 1", n, err)
	}
}

// verifyInSync runs verify on each of outputs and reports through fail (the
// test's Fatalf or Errorf) an output for which it fails, does not say "in
// sync", or leaves out one of wants.
func (s *testStack) verifyInSync(ctx context.Context, fail func(format string, args ...any), when string, outputs []string, wants ...string) {
	s.t.Helper()
	for _, o := range outputs {
		out, errOut, err := s.cli(ctx, "", "verify", "--output", o)
		ok := err == nil && strings.Contains(out, "in sync")
		for _, w := range wants {
			ok = ok && strings.Contains(out, w)
		}
		if !ok {
			fail("verify %s %s: exit %d (%v), want in sync and %q\n%s\n%s", o, when, exitCode(err), err, wants, out, errOut)
		}
	}
}

// s3Output returns the S3 setting of the job's i-th output and a sink on it,
// to reach the output's objects behind the pipeline's back.
func (s *testStack) s3Output(i int) (*config.S3Output, *s3sink.Sink) {
	s.t.Helper()
	out := s.Config.Jobs[0].Outputs[i].S3
	sink, err := s3sink.New(s.Deps.S3, *out)
	if err != nil {
		s.t.Fatal(err)
	}
	return out, sink
}

// TestVerifyRemoteNeedsItsFunction: verify --remote invokes the job's verify
// function of the deployed stack. Where no stack deployed it (bootstrapped
// resources, as here, or a stack of a release without it) the command says
// which function it looked for and how to go on; an HTTP output is refused
// before anything is invoked, as verify refuses it locally.
func TestVerifyRemoteNeedsItsFunction(t *testing.T) {
	ctx, s := parallelStack(t, outPG, outHTTP)
	fn := s.Config.Stack.Prefix + "-orders-verify"
	_, errOut, err := s.cli(ctx, "", "verify", "--output", "pg", "--remote")
	if exitCode(err) != 1 || err == nil || !strings.Contains(err.Error(), "no function "+fn) || !strings.Contains(err.Error(), "without --remote") {
		t.Errorf("verify --remote without the function: exit %d (%v), want 1 naming %s and the local mode\n%s", exitCode(err), err, fn, errOut)
	}
	_, errOut, err = s.cli(ctx, "", "verify", "--output", "rest", "--remote")
	if exitCode(err) != exitUnsupported || !strings.Contains(errOut, "verify is not supported for http outputs") {
		t.Errorf("verify --remote of an http output: exit %d (%v), stderr:\n%s", exitCode(err), err, errOut)
	}
}
