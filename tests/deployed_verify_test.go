package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// checkRemoteVerify runs changesctl verify --remote on the deployed stack:
// the comparison and the repair run in the job's verify function, where the
// data is (its VPC on AWS), and changesctl prints the report verify prints
// when it runs where it can reach the data itself (on LocalStack, this
// machine), with the same exit status. A document's rows deleted from the
// PostgreSQL output behind the writer's back are found by the remote
// verify, the remote repair re-queues the document, the writer delivers
// it, and the next remote verify is clean.
func (d *deployedStack) checkRemoteVerify(ctx context.Context, t *testing.T) {
	d.waitExact(ctx, t, 3*time.Minute)
	ctl := changesctl(t)
	verify := func(stdin string, args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.CommandContext(ctx, ctl, append([]string{"verify", "--config", d.ConfigPath, "--job", "orders"}, args...)...)
		cmd.Env = testenv.Environ()
		cmd.Stdin = strings.NewReader(stdin)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			code = ee.ExitCode()
		case err != nil:
			t.Fatalf("changesctl verify %s: %v", strings.Join(args, " "), err)
		}
		return out.String(), errOut.String(), code
	}
	// same runs verify with args here and in the stack and checks that both
	// print the same report and exit with code, and returns what they
	// printed.
	same := func(when string, code int, args ...string) string {
		t.Helper()
		local, localErr, localCode := verify("", args...)
		remote, remoteErr, remoteCode := verify("", append(args, "--remote")...)
		if localCode != code || remoteCode != code {
			t.Fatalf("verify %s %s: exit %d here, %d in the stack; want %d\nhere:\n%s%s\nin the stack:\n%s%s",
				strings.Join(args, " "), when, localCode, remoteCode, code, local, localErr, remote, remoteErr)
		}
		if diff := cmp.Diff(local, remote); diff != "" {
			t.Fatalf("verify %s %s: the stack's report differs from the local one (-here +stack):\n%s\nstack's stderr:\n%s", strings.Join(args, " "), when, diff, remoteErr)
		}
		return remote
	}
	counts := regexp.MustCompile(`the source has (\d+) live documents, the output holds (\d+)`)
	for _, o := range []string{"pg", "archive"} {
		got := same("in sync", 0, "--output", o)
		m := counts.FindStringSubmatch(got)
		if !strings.Contains(got, "in sync") || m == nil || m[1] != m[2] || m[1] == "0" {
			t.Errorf("verify %s --remote in sync:\n%s", o, got)
		}
	}

	// Drift: a document's rows deleted from PostgreSQL behind the writer's back.
	source := d.sourceState(ctx)
	var victim string
	for id := range d.pgState(ctx) {
		if _, live := source[id]; live && (victim == "" || id < victim) {
			victim = id
		}
	}
	if victim == "" {
		t.Fatal("PostgreSQL holds no document that is live in the source")
	}
	data, versions, err := d.PostgresTables("orders", "pg")
	if err != nil {
		t.Fatal(err)
	}
	pool := testenv.Postgres(t)
	for _, table := range []pgx.Identifier{data, versions} {
		if _, err := pool.Exec(ctx, "DELETE FROM "+table.Sanitize()+" WHERE doc_id = $1", victim); err != nil {
			t.Fatal(err)
		}
	}
	rev := source[victim]
	got := same("after a row was deleted", 2, "--output", "pg")
	if !strings.Contains(squeezeSpace(got), fmt.Sprintf(`missing 1 %q source %s`, victim, rev)) {
		t.Errorf("verify pg --remote does not report %s missing:\n%s", victim, got)
	}
	t.Logf("verify --output pg --remote after a row was deleted:\n%s", got)
	same("after a row was deleted", 2, "--output", "pg", "--json", "--samples", "3")
	got, errOut, code := verify("", "--output", "pg", "--remote", "--repair", "--yes")
	t.Logf("verify --output pg --remote --repair --yes:\n%s%s", got, errOut)
	if code != 2 || !strings.Contains(got, "repair: enqueued 1 documents and 0 tombstones at generation") {
		t.Fatalf("verify pg --remote --repair: exit %d, want 2 and one document enqueued\n%s%s", code, got, errOut)
	}
	if err := testenv.Poll(ctx, 2*time.Minute, 2*time.Second, func(ctx context.Context) (bool, error) {
		return d.pgState(ctx)[victim] == rev, nil
	}); err != nil {
		t.Fatalf("%s not delivered again after the remote repair: %v", victim, err)
	}
	if got := same("after the repair", 0, "--output", "pg"); !strings.Contains(got, "in sync") {
		t.Errorf("verify pg --remote after the repair:\n%s", got)
	}
}

// squeezeSpace collapses runs of white space to one space.
func squeezeSpace(s string) string { return strings.Join(strings.Fields(s), " ") }
