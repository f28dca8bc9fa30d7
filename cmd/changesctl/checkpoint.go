package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
)

const checkpointUsage = `usage: changesctl checkpoint get|set|reset --config FILE [--job J] [flags]

  get     print the job's checkpoint, lease holder and generation
  set     store --seq SEQ as the checkpoint
  reset   re-sync: --from beginning (default; every document is sent again)
          or --from now (the source's current position; earlier changes are skipped)

set and reset take the job's lease first, so no poller runs meanwhile:
without --force they wait up to --wait for a running poller to hand it over;
--force takes it at once and bumps the generation, fencing the poller out.
`

// cmdCheckpoint reads or moves a job's checkpoint.
//
//	checkpoint get   --job J [-o json]
//	checkpoint set   --job J --seq SEQ [--wait D] [--force] [--yes] [-o json]
//	checkpoint reset --job J [--from beginning|now] [--wait D] [--force] [--yes] [-o json]
//
// set and reset take the job's lease first: a poller holding it is given
// --wait to hand it over (pollers release it at the end of every
// invocation), unless --force, which takes it at once and bumps the
// generation so the running poller is fenced out at its next write. The new
// checkpoint is written under that lease, which is then released: the next
// poller starts from it.
func cmdCheckpoint(ctx context.Context, env *cliEnv, args []string) error {
	return runAction(ctx, env, "checkpoint", checkpointUsage, args,
		command{"get", cmdCheckpointGet}, command{"set", cmdCheckpointSet}, command{"reset", cmdCheckpointReset})
}

// cmdCheckpointGet prints the job's checkpoint, lease holder and generation.
func cmdCheckpointGet(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "checkpoint get")
	sc := scopeFlags(fs, helpOneJob, "")
	asJSON := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	deps, j, err := sc.openJob(ctx, env, "checkpoint")
	if err != nil {
		return err
	}
	defer deps.Close()
	st, err := lease.New(deps.DynamoDB, deps.Config.TableName()).Get(ctx, j.ID)
	if err != nil {
		return err
	}
	return checkpointGet(env, j, st, *asJSON)
}

// cmdCheckpointSet stores --seq as the checkpoint.
func cmdCheckpointSet(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "checkpoint set")
	mf := moveFlags(fs)
	seq := fs.String("seq", "", "sequence to store, as JSON: a number (1350), or a string in quotes ('\"13-g1AAAA\"')")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *seq == "" {
		return usagef("checkpoint set: --seq is required")
	}
	if !json.Valid([]byte(*seq)) {
		return usagef("checkpoint set: --seq %q is not JSON (quote a string seq: '\"12-abc\"')", *seq)
	}
	return mf.move(ctx, env, checkpointMove{verb: "set", target: json.RawMessage(*seq), desc: *seq})
}

// cmdCheckpointReset moves the checkpoint to the beginning of the feed or
// to the source's current position.
func cmdCheckpointReset(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "checkpoint reset")
	mf := moveFlags(fs)
	from := fs.String("from", "beginning", "beginning or now")
	if err := fs.Parse(args); err != nil {
		return err
	}
	m := checkpointMove{verb: "reset", desc: "the beginning of the feed (every document is sent again; outputs ignore what they already hold)"}
	switch *from {
	case "beginning":
	case "now":
		m.fromNow = true
		m.desc = "the source's current position (changes made before it are never sent; use verify --repair to catch up)"
	default:
		return usagef("checkpoint reset: --from %q (want beginning or now)", *from)
	}
	return mf.move(ctx, env, m)
}

// checkpointMove is where set or reset moves a checkpoint: a literal seq,
// the beginning (nil), or the source's current position (fromNow), read
// once the lease is ours; desc says which for the confirmation.
type checkpointMove struct {
	verb    string
	target  json.RawMessage
	fromNow bool
	desc    string
}

// leaseScope is what the flags of set and reset name: the configuration
// and the job, and how to take the job's lease.
type leaseScope struct {
	*scope
	wait               *time.Duration
	force, yes, asJSON *bool
}

func moveFlags(fs *flag.FlagSet) *leaseScope {
	return &leaseScope{
		scope:  scopeFlags(fs, helpOneJob, ""),
		wait:   fs.Duration("wait", 0, "wait this long for a running poller to hand the lease over (0: do not wait)"),
		force:  fs.Bool("force", false, "take the lease even while a poller holds it (fences the poller out)"),
		yes:    fs.Bool("yes", false, "do not ask for confirmation"),
		asJSON: outputFlag(fs),
	}
}

// move takes the job's lease, writes the checkpoint m names under it, and
// releases the lease.
func (s *leaseScope) move(ctx context.Context, env *cliEnv, m checkpointMove) error {
	deps, j, err := s.openJob(ctx, env, "checkpoint")
	if err != nil {
		return err
	}
	defer deps.Close()
	store := lease.New(deps.DynamoDB, deps.Config.TableName())
	st, err := store.Get(ctx, j.ID)
	if err != nil {
		return err
	}
	if st.Held(time.Now()) && !*s.force && *s.wait == 0 {
		return fmt.Errorf("checkpoint %s: a poller holds the lease (%s, generation %d); stop the pipeline, pass --wait 2m to take it at the next handoff, or --force",
			m.verb, st.Owner, st.Generation)
	}
	if !*s.yes && !confirm(env, fmt.Sprintf("move job %s's checkpoint from %s to %s?", j.ID, orBeginning(st.Checkpoint), m.desc)) {
		return errors.New("checkpoint: not confirmed")
	}
	owner := fmt.Sprintf("changesctl-%s-%d", pipeline.Hostname(), time.Now().UnixNano())
	sess := lease.NewSession(store, j.ID, owner, pipeline.Hostname(), j.Lease.TTL.D())
	if err := takeLease(ctx, sess, *s.wait, *s.force); err != nil {
		return fmt.Errorf("checkpoint %s: %w", m.verb, err)
	}
	l := sess.Lease()
	err = func() error {
		if m.fromNow {
			src, err := deps.Feed(ctx, j)
			if err != nil {
				return err
			}
			if m.target, err = src.Now(ctx); err != nil {
				return fmt.Errorf("read the source's position: %w", err)
			}
		}
		return store.SetCheckpoint(ctx, l, m.target)
	}()
	if rerr := sess.Release(ctx); rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", m.verb, err)
	}
	if *s.asJSON {
		return writeJSON(env.stdout, checkpointMoved{Job: j.ID, Checkpoint: m.target, Generation: l.Generation, Takeover: string(l.Kind)})
	}
	fmt.Fprintf(env.stdout, "%s checkpoint set to %s (lease generation %d, taken as %s); the next poller starts there\n",
		j.ID, orBeginning(m.target), l.Generation, l.Kind)
	return nil
}

// checkpointMoved is what `checkpoint set|reset -o json` prints: the new
// checkpoint (null: the beginning), and the lease generation and takeover
// under which it was written.
type checkpointMoved struct {
	Job        string          `json:"job"`
	Checkpoint json.RawMessage `json:"checkpoint"`
	Generation int64           `json:"generation"`
	Takeover   string          `json:"takeover"`
}

// checkpointState is `checkpoint get -o json`.
type checkpointState struct {
	Job                string          `json:"job"`
	Checkpoint         json.RawMessage `json:"checkpoint"`
	CheckpointAt       *time.Time      `json:"checkpoint_at,omitempty"`
	Generation         int64           `json:"generation"`
	Owner              string          `json:"owner,omitempty"`
	Role               string          `json:"role"`
	Pending            int64           `json:"pending"`
	CheckpointsWritten int64           `json:"checkpoints_written"`
}

func checkpointGet(env *cliEnv, j *config.Job, st *lease.State, asJSON bool) error {
	now := time.Now()
	if asJSON {
		s := checkpointState{Job: j.ID, Checkpoint: st.Checkpoint, Generation: st.Generation, Owner: st.Owner,
			Role: role(st, now), Pending: st.Pending, CheckpointsWritten: st.Checkpoints}
		if !st.CheckpointAt.IsZero() {
			s.CheckpointAt = &st.CheckpointAt
		}
		return writeJSON(env.stdout, s)
	}
	fmt.Fprintf(env.stdout, "%s checkpoint %s, generation %d", j.ID, orBeginning(st.Checkpoint), st.Generation)
	if !st.CheckpointAt.IsZero() {
		fmt.Fprintf(env.stdout, ", written %s", ago(now, st.CheckpointAt))
	}
	fmt.Fprintf(env.stdout, "; lease %s", role(st, now))
	if st.Owner != "" {
		fmt.Fprintf(env.stdout, " (%s)", st.Owner)
	}
	fmt.Fprintln(env.stdout)
	return nil
}

// takeLease takes the job's lease for an operator: at once with force
// (generation bumped, running poller fenced out), else when it is free,
// standing by for up to wait for the holder to hand it over.
func takeLease(ctx context.Context, sess *lease.Session, wait time.Duration, force bool) error {
	if force {
		return sess.Force(ctx)
	}
	// Standbys look once a second; look more often to win the handoff.
	sess.Interval = 100 * time.Millisecond
	err := sess.Wait(ctx, time.Now().Add(wait))
	var held *lease.HeldError
	if errors.As(err, &held) {
		return fmt.Errorf("a poller holds the lease (%s, generation %d); stop the pipeline, wait longer (--wait), or use --force",
			held.Holder.Owner, held.Holder.Generation)
	}
	return err
}

// pickJob finds the job, defaulting to the only one.
func pickJob(f *config.File, id string) (*config.Job, error) {
	if id == "" {
		if len(f.Jobs) == 1 {
			return f.Jobs[0], nil
		}
		return nil, usagef("--job is required: the configuration has several jobs")
	}
	if j := f.Job(id); j != nil {
		return j, nil
	}
	ids := make([]string, len(f.Jobs))
	for i, j := range f.Jobs {
		ids[i] = j.ID
	}
	return nil, usagef("no job %q in the configuration%s", id, didYouMean(id, ids, ""))
}

func orBeginning(seq json.RawMessage) string {
	if seq == nil {
		return "(beginning)"
	}
	return string(seq)
}

// confirm asks a yes/no question on the terminal.
func confirm(env *cliEnv, q string) bool {
	fmt.Fprintf(env.stderr, "%s [y/N] ", q)
	line, _ := bufio.NewReader(env.stdin).ReadString('\n')
	a := strings.ToLower(strings.TrimSpace(line))
	return a == "y" || a == "yes"
}
