package tests

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/demo/sample"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/tests/faults"
)

// previousRelease is the commit of main the upgrade test runs as the release
// before 1.0.0, the first with a version: it records no version in the lease
// item and keeps claim checks under claim-check/<job>/<generation>/.
const previousRelease = "776fc7190fd14e74d4cd3c4db64b1c9128940b40"

// bigBody is larger than stack.max_message_bytes (256 KiB by default), so a
// document carrying it travels as a claim check.
var bigBody = strings.Repeat("claim-checked ", 300<<10/14)

// TestUpgradeFromPreviousRelease runs the previous release (built from git)
// and this one side by side on one pipeline, as a rolling deploy does, in
// both orders: the previous poller queues changes, a large one claim
// checked, checkpoints and holds the lease; this release's writer delivers
// them; this release's poller takes the lease over with the checkpoint and
// queues what follows, a large change among it, which the previous
// release's writer delivers. Every output ends equal to the source, nothing
// is dead-lettered, no change is queued twice, and the FIFO HTTP output's
// receiver sees each document's changes once each, in order.
func TestUpgradeFromPreviousRelease(t *testing.T) {
	parallel(t)
	ctx := t.Context()
	root := repoRoot(t)
	release := releaseVersion(t, root)
	prev := previousChangesctl(t, root)
	cur := currentChangesctl(t)
	rec := &deliveries{}
	s := newStack(t, stackOptions{ttl: 6 * time.Second, wrapRest: rec.wrap})
	if o := s.Config.Jobs[0].Output("rest"); !o.FIFO() {
		t.Fatalf("the rest output has ordering %q; the test needs a FIFO one", o.Ordering)
	}
	run := func(bin, name string, args ...string) *ctlProc {
		return startCtl(t, bin, name, append([]string{"run", "--config", s.ConfigPath}, args...)...)
	}
	// One invocation per poller process for the whole test (the first tick
	// comes at once): the lease passes from the previous poller to this
	// one only when the test stops the previous one, never at the end of a
	// budget.
	pollerArgs := []string{"--no-writer", "--tick", "5m", "--poller-timeout", "5m"}
	writerArgs := []string{"--no-poller", "--until-idle", "--timeout", "3m"}

	// The previous poller queues the first changes, a claim-checked one
	// among them, and holds the lease.
	s.load(ctx, sample.Options{Docs: 40, UpdateEvery: 4, DeleteEvery: 9, Seed: 7})
	s.putBig(ctx, "big-1", "first")
	oldPoller := run(prev, "previous poller", pollerArgs...)
	s.waitQueued(ctx, oldPoller)
	held := s.leaseState(ctx)
	if !held.Held(time.Now()) || held.HolderVersion != "" {
		t.Fatalf("after the previous poller queued: lease held %v, holder version %q; want held, with no version recorded", held.Held(time.Now()), held.HolderVersion)
	}
	unscoped := regexp.MustCompile(`^` + regexp.QuoteMeta(claimcheck.UnscopedPrefix("orders")) + `[0-9]+/[0-9]+\.json$`)
	if keys := s.claimChecks(ctx); !slices.ContainsFunc(keys, unscoped.MatchString) {
		t.Fatalf("the previous poller wrote no claim check of its shape (%s): %q", unscoped, keys)
	}

	// This release's writer delivers what the previous poller queued.
	run(cur, "writer", writerArgs...).wait(t, 4*time.Minute)
	s.checkExact(ctx, "this writer delivered the previous poller's changes")

	// This release's poller stands by, then takes the lease over from the
	// previous one with its checkpoint, and queues what follows.
	newPoller := run(cur, "poller", pollerArgs...)
	s.update(ctx, "second", 0, 20)
	s.waitQueued(ctx, oldPoller)
	last := s.leaseState(ctx)
	oldPoller.stop(t)
	s.waitHolder(ctx, newPoller, func(st *lease.State) bool {
		return st.Owner != last.Owner && st.Held(time.Now())
	})
	now := s.leaseState(ctx)
	if now.HolderVersion != release || now.TakeoverKind != lease.Handoff || now.Generation != last.Generation+1 {
		t.Errorf("this poller's lease: version %q takeover %s generation %d; want %s handoff %d", now.HolderVersion, now.TakeoverKind, now.Generation, release, last.Generation+1)
	}
	// The checkpoint the previous poller released the lease with, which
	// may be past the one read before it was stopped.
	released := regexp.MustCompile(`msg="lease released" job=orders owner=` + regexp.QuoteMeta(last.Owner) + ` generation=\d+ checkpoint=(\S+)`).FindStringSubmatch(oldPoller.output())
	if released == nil {
		t.Fatalf("the previous poller did not log its release:\n%s", oldPoller.tail(20))
	}
	// The poller logs its takeover once the write that took the lease
	// returns: the line may come a moment after the item shows it.
	took := fmt.Sprintf("takeover=handoff previous_owner=%s checkpoint=%s", last.Owner, released[1])
	if err := testenv.Poll(ctx, 10*time.Second, 50*time.Millisecond, func(context.Context) (bool, error) {
		return strings.Contains(newPoller.output(), took), nil
	}); err != nil {
		t.Errorf("this poller did not take the lease with the previous checkpoint (%q): %v\n%s", took, err, newPoller.tail(20))
	}
	status, err := exec.CommandContext(ctx, cur, "status", "--config", s.ConfigPath).CombinedOutput()
	if err != nil || !strings.Contains(string(status), "orders: lease holder version "+release+"\n") {
		t.Errorf("changesctl status (%v) does not name the holder's version %s:\n%s", err, release, status)
	}
	s.update(ctx, "third", 20, 40)
	s.deleteSome(ctx, 3)
	s.putBig(ctx, "big-1", "second")
	s.putBig(ctx, "big-2", "first")
	for i := range 10 {
		if _, err := s.PutDoc(ctx, fmt.Sprintf("upgrade-new-%02d", i), map[string]any{"phase": "third"}); err != nil {
			t.Fatal(err)
		}
	}
	s.waitQueued(ctx, newPoller)
	if keys := s.claimChecks(ctx); !slices.ContainsFunc(keys, func(k string) bool {
		return strings.HasPrefix(k, claimcheck.Prefix(s.Config.Stack.Prefix, "orders"))
	}) {
		t.Fatalf("this poller wrote no claim check under %s: %q", claimcheck.Prefix(s.Config.Stack.Prefix, "orders"), keys)
	}

	// The previous release's writer delivers what this poller queued.
	run(prev, "previous writer", writerArgs...).wait(t, 4*time.Minute)
	s.checkExact(ctx, "the previous writer delivered this poller's changes")
	newPoller.stop(t)
	rec.check(t)
}

// deliveries records the requests the HTTP output's receiver answered.
type deliveries struct {
	mu   sync.Mutex
	reqs []delivery
}

type delivery struct {
	docID, rev string
	version    change.Version
	status     int
}

// wrap records each request to next with its answer.
func (d *deliveries) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		id, err := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), "/docs/"))
		var v change.Version
		if _, serr := fmt.Sscanf(r.Header.Get("X-Changes-Version"), "%d.%d", &v.Generation, &v.Counter); serr != nil || err != nil {
			id = "unreadable request " + r.URL.EscapedPath()
		}
		d.mu.Lock()
		d.reqs = append(d.reqs, delivery{docID: id, rev: r.Header.Get("X-Changes-Rev"), version: v, status: sw.status})
		d.mu.Unlock()
	})
}

// check fails t unless each document's changes arrived once each, in the
// order they were observed (their versions rising), and no revision came
// twice (what a change queued again would be).
func (d *deliveries) check(t *testing.T) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	last := map[string]change.Version{}
	revs := map[string]bool{}
	for _, r := range d.reqs {
		if v, ok := last[r.docID]; ok && r.version.Compare(v) <= 0 {
			t.Errorf("the HTTP receiver got %q version %s (rev %s, answered %d) after version %s", r.docID, r.version, r.rev, r.status, v)
		}
		last[r.docID] = r.version
		if k := r.docID + " " + r.rev; revs[k] {
			t.Errorf("the HTTP receiver got %q rev %s twice", r.docID, r.rev)
		} else {
			revs[k] = true
		}
	}
	gens := map[int64]int{}
	for _, r := range d.reqs {
		gens[r.version.Generation]++
	}
	t.Logf("the HTTP receiver got %d requests for %d documents; by the generation that queued them: %v", len(d.reqs), len(last), gens)
	if len(gens) < 2 {
		t.Error("the HTTP receiver got no changes of one of the two pollers")
	}
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// putBig writes a document whose body is claim checked.
func (s *testStack) putBig(ctx context.Context, id, phase string) {
	s.t.Helper()
	body := map[string]any{"phase": phase, "padding": bigBody}
	if rev := s.sourceState(ctx)[id]; rev != "" {
		body["_rev"] = rev
	}
	if _, err := s.PutDoc(ctx, id, body); err != nil {
		s.t.Fatal(err)
	}
}

// update writes a new revision of the live sample documents from..to-1.
func (s *testStack) update(ctx context.Context, phase string, from, to int) {
	s.t.Helper()
	live := s.sourceState(ctx)
	for i := from; i < to; i++ {
		id := sample.ID(i)
		rev, ok := live[id]
		if !ok {
			continue
		}
		if _, err := s.PutDoc(ctx, id, map[string]any{"_rev": rev, "phase": phase, "n": i}); err != nil {
			s.t.Fatal(err)
		}
	}
}

// deleteSome deletes the first n live sample documents.
func (s *testStack) deleteSome(ctx context.Context, n int) {
	s.t.Helper()
	live := s.sourceState(ctx)
	for i := 0; n > 0; i++ {
		if rev, ok := live[sample.ID(i)]; ok {
			if err := s.DeleteDoc(ctx, sample.ID(i), rev); err != nil {
				s.t.Fatal(err)
			}
			n--
		}
	}
}

// leaseState reads the job's item.
func (s *testStack) leaseState(ctx context.Context) *lease.State {
	s.t.Helper()
	st, err := s.Leases.Get(ctx, "orders")
	if err != nil {
		s.t.Fatal(err)
	}
	return st
}

// waitQueued waits until the job's checkpoint reaches the source's update
// sequence: every change is queued. p is the poller expected to queue.
func (s *testStack) waitQueued(ctx context.Context, p *ctlProc) {
	s.t.Helper()
	err := testenv.Poll(ctx, 90*time.Second, 200*time.Millisecond, func(ctx context.Context) (bool, error) {
		want, err := s.UpdateSeq(ctx)
		if err != nil {
			return false, err
		}
		w, err := faults.SeqNumber(want)
		if err != nil {
			return false, err
		}
		st, err := s.Leases.Get(ctx, "orders")
		if err != nil {
			return false, err
		}
		got, err := faults.SeqNumber(st.Checkpoint)
		return err == nil && got >= w, err
	})
	if err != nil {
		s.t.Fatalf("the %s did not queue the source's changes: %v\n%s", p.name, err, p.tail(30))
	}
}

// waitHolder waits until the job's item satisfies ok.
func (s *testStack) waitHolder(ctx context.Context, p *ctlProc, ok func(*lease.State) bool) {
	s.t.Helper()
	err := testenv.Poll(ctx, 60*time.Second, 100*time.Millisecond, func(ctx context.Context) (bool, error) {
		st, err := s.Leases.Get(ctx, "orders")
		return err == nil && ok(st), err
	})
	if err != nil {
		s.t.Fatalf("the %s did not take the lease: %v\n%s", p.name, err, p.tail(30))
	}
}

// claimChecks lists the keys under claim-check/ in the stack bucket.
func (s *testStack) claimChecks(ctx context.Context) []string {
	s.t.Helper()
	var keys []string
	p := s3.NewListObjectsV2Paginator(s.Deps.S3, &s3.ListObjectsV2Input{Bucket: aws.String(s.Config.Stack.Bucket), Prefix: aws.String("claim-check/")})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			s.t.Fatal(err)
		}
		for _, o := range page.Contents {
			keys = append(keys, aws.ToString(o.Key))
		}
	}
	return keys
}

// checkExact fails the test unless every output holds exactly the source's
// winners and no DLQ holds a message.
func (s *testStack) checkExact(ctx context.Context, when string) {
	s.t.Helper()
	want := s.sourceState(ctx)
	for name, got := range map[string]map[string]string{"pg": s.pgState(ctx), "archive": s.s3State(ctx), "rest": s.httpState()} {
		if d := cmp.Diff(want, got); d != "" {
			s.t.Errorf("%s: output %s differs from the source (-source +output):\n%s", when, name, d)
		}
	}
	for _, o := range s.Config.Jobs[0].Outputs {
		q, err := s.Queues(ctx, "orders", o.ID)
		if err != nil {
			s.t.Fatal(err)
		}
		d, err := dlq.QueueDepth(ctx, s.Deps.SQS, q.DLQURL)
		if err != nil {
			s.t.Fatal(err)
		}
		if d.Total() > 0 {
			s.t.Errorf("%s: the DLQ of %s holds %d messages:\n%s", when, o.ID, d.Total(), s.dlqReasons(ctx, o.ID))
		}
	}
	if s.t.Failed() {
		s.t.FailNow()
	}
}

// dlqReasons lists the failure reasons of an output's dead-lettered changes.
func (s *testStack) dlqReasons(ctx context.Context, output string) string {
	out, err := exec.CommandContext(ctx, currentChangesctl(s.t), "dlq", "list", "--config", s.ConfigPath, "--job", "orders", "--output", output).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("changesctl dlq list: %v\n%s", err, out)
	}
	return string(out)
}

// ctlProc is a changesctl process whose output is kept.
type ctlProc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

// startCtl starts bin with args against the local services; the process is
// killed when the test ends, if still running.
func startCtl(t *testing.T, bin, name string, args ...string) *ctlProc {
	t.Helper()
	p := &ctlProc{name: name, out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = testenv.Environ()
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start the %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("the %s's output (last 40 lines):\n%s", name, p.tail(40))
		}
	})
	return p
}

// wait waits for the process to end and fails the test unless it succeeded.
func (p *ctlProc) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("the %s did not end within %s:\n%s", p.name, timeout, p.tail(30))
	}
	if p.err != nil {
		t.Fatalf("the %s failed: %v\n%s", p.name, p.err, p.tail(30))
	}
}

// stop ends the process as a signal does (SIGTERM) and waits for it.
func (p *ctlProc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("stop the %s: %v", p.name, err)
	}
	p.wait(t, 30*time.Second)
}

func (p *ctlProc) output() string { return p.out.String() }

func (p *ctlProc) tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.out.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// previousChangesctl builds the previous release's changesctl from this
// repository's history: git archive of previousRelease into a directory of
// the test's, and go build there. A checkout without that commit (a shallow
// clone) fails the test saying so.
func previousChangesctl(t testing.TB, root string) string {
	t.Helper()
	if out, err := exec.Command("git", "-C", root, "cat-file", "-e", previousRelease+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("the upgrade test builds the previous release from commit %s of this repository, which %s does not have (%v: %s): "+
			"run it in a clone with full history (git fetch --unshallow)", previousRelease, root, err, bytes.TrimSpace(out))
	}
	dir := t.TempDir()
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", previousRelease)
	extract := exec.Command("tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	extract.Stdin = pipe
	var archiveErr, extractErr bytes.Buffer
	archive.Stderr, extract.Stderr = &archiveErr, &extractErr
	if err := extract.Start(); err != nil {
		t.Fatalf("extract the previous release: %v", err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v: %s", previousRelease, err, archiveErr.Bytes())
	}
	if err := extract.Wait(); err != nil {
		t.Fatalf("extract the previous release: %v: %s", err, extractErr.Bytes())
	}
	bin := filepath.Join(dir, "changesctl")
	build := exec.Command("go", "build", "-o", bin, "./cmd/changesctl")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the previous release's changesctl in %s: %v\n%s", dir, err, out)
	}
	return bin
}
