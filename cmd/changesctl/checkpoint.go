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

	"github.com/changes-worker/changes-worker/shared/lease"
	"github.com/changes-worker/changes-worker/shared/pipeline"
)

// cmdCheckpoint reads or moves a job's checkpoint.
//
//	checkpoint get   --job J
//	checkpoint set   --job J --seq SEQ [--force] [--yes]
//	checkpoint reset --job J [--force] [--yes]
//
// set and reset take the job's lease first: they refuse while a poller holds
// it, unless --force, which takes it anyway and bumps the generation so the
// running poller is fenced out at its next write.
func cmdCheckpoint(ctx context.Context, env *cliEnv, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return errors.New("checkpoint: want get, set or reset")
	}
	verb := args[0]
	fs := flag.NewFlagSet("checkpoint "+verb, flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	path := fs.String("config", "", "job configuration file")
	job := fs.String("job", "", "job id")
	seq := fs.String("seq", "", "sequence to store, as JSON (a number, or a quoted string)")
	force := fs.Bool("force", false, "take the lease even while a poller holds it (fences the poller out)")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	deps, err := load(ctx, env, *path, env.stderr, false)
	if err != nil {
		return err
	}
	j := deps.Config.Job(*job)
	if j == nil {
		return fmt.Errorf("checkpoint: no job %q in the configuration", *job)
	}
	store := lease.New(deps.DynamoDB, deps.Config.TableName())
	st, err := store.Get(ctx, j.ID)
	if err != nil {
		return err
	}
	switch verb {
	case "get":
		cp := "(beginning)"
		if st.Checkpoint != nil {
			cp = string(st.Checkpoint)
		}
		fmt.Fprintf(env.stdout, "%s checkpoint %s generation %d", j.ID, cp, st.Generation)
		if !st.CheckpointAt.IsZero() {
			fmt.Fprintf(env.stdout, " written %s ago", time.Since(st.CheckpointAt).Round(time.Second))
		}
		fmt.Fprintln(env.stdout)
		return nil
	case "set", "reset":
	default:
		return fmt.Errorf("checkpoint: unknown action %q (want get, set or reset)", verb)
	}

	var target json.RawMessage
	if verb == "set" {
		if *seq == "" {
			return errors.New("checkpoint set: --seq is required")
		}
		if !json.Valid([]byte(*seq)) {
			return fmt.Errorf("checkpoint set: --seq %q is not JSON (quote a string seq: '\"12-abc\"')", *seq)
		}
		target = json.RawMessage(*seq)
	}
	desc := "the beginning of the feed (every document is sent again)"
	if target != nil {
		desc = string(target)
	}
	if !*yes && !confirm(env, fmt.Sprintf("move job %s's checkpoint from %s to %s?", j.ID, orBeginning(st.Checkpoint), desc)) {
		return errors.New("checkpoint: not confirmed")
	}
	owner := fmt.Sprintf("changesctl-%s-%d", pipeline.Hostname(), time.Now().UnixNano())
	ttl := j.Lease.TTL.D()
	var l *lease.Lease
	if *force {
		l, err = store.ForceTake(ctx, j.ID, owner, pipeline.Hostname(), ttl)
	} else {
		l, _, err = store.Acquire(ctx, j.ID, owner, pipeline.Hostname(), ttl)
		if errors.Is(err, lease.ErrLeaseHeld) {
			return fmt.Errorf("checkpoint %s: a poller holds the lease (%s); stop it, wait for it to release, or use --force", verb, st.Owner)
		}
	}
	if err != nil {
		return err
	}
	if err := store.SetCheckpoint(ctx, l, target); err != nil {
		return err
	}
	if err := store.Release(ctx, l); err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "%s checkpoint set to %s (generation %d)\n", j.ID, orBeginning(target), l.Generation)
	return nil
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
