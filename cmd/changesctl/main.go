// Command changesctl operates changes-worker pipelines: it creates their AWS
// resources, runs them on one machine, and shows and repairs their state.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/changes-worker/changes-worker/shared/awsconf"
)

const usage = `changesctl operates changes-worker pipelines.

Usage:
  changesctl validate --config FILE      check a configuration as a deploy would; every problem, by key
  changesctl bootstrap --config FILE     create the table, queues, DLQs and bucket
             [--remove]                 delete the table, queues and DLQs instead (not the bucket)
  changesctl run --config FILE [flags]   run pollers and writers on this machine
  changesctl invoke poller|writer --event FILE --config FILE
                                         run one function once on a Lambda event (see events/)
  changesctl status --config FILE        show each job's lease, checkpoint and queues
  changesctl receiver [--addr A]         serve the reference HTTP receiver (demo endpoint)
  changesctl sample --url DB             load the sample order data set into a source
  changesctl checkpoint get|set|reset --job J   read or move a job's checkpoint
  changesctl schema --config FILE [--job J --output O]  print the PostgreSQL tables' DDL
  changesctl dlq list|show|redrive|purge --job J --output O
                                         inspect failed changes, send them back, or drop them
  changesctl halt show|retry|skip|clear --job J --output O
                                         inspect a halted output's blocked change, retry it, skip it
                                         into the DLQ, or clear a halt whose change left the queue
  changesctl verify --job J --output O [--repair] [--remote]
                                         compare an output with the source (exit 2 on drift),
                                         here or, with --remote, in the stack's verify function
  changesctl bucket check --config FILE  check that the stack bucket expires claim checks
  changesctl docid hash ID...            the form of an id in logs and records with stack.doc_ids hash
  changesctl version                     the release this changesctl was built from

Run "changesctl COMMAND -h" for a command's flags. The AWS endpoint comes from
the standard AWS_ENDPOINT_URL (unset: AWS itself); a command that talks to AWS
first names its endpoint, region and account on stderr.
`

// command is one subcommand.
type command struct {
	name string
	run  func(ctx context.Context, env *cliEnv, args []string) error
}

// cliEnv is what commands share: the standard streams and the environment.
type cliEnv struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	lookup         func(string) (string, bool)
}

func commands() []command {
	return []command{
		{"validate", cmdValidate},
		{"bootstrap", cmdBootstrap},
		{"run", cmdRun},
		{"invoke", cmdInvoke},
		{"status", cmdStatus},
		{"receiver", cmdReceiver},
		{"sample", cmdSample},
		{"checkpoint", cmdCheckpoint},
		{"schema", cmdSchema},
		{"dlq", cmdDLQ},
		{"halt", cmdHalt},
		{"verify", cmdVerify},
		{"bucket", cmdBucket},
		{"docid", cmdDocID},
		{"version", cmdVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env := &cliEnv{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, lookup: os.LookupEnv}
	if err := realMain(ctx, env, os.Args[1:]); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(safeText(os.Stderr), "changesctl:", err)
		}
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(int(ee))
		}
		os.Exit(1)
	}
}

// exitError carries a specific exit status (verify uses 2 for drift).
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// realMain runs the command args names. Whatever it prints goes through
// safeText: it may hold text from the source or an output.
func realMain(ctx context.Context, env *cliEnv, args []string) error {
	env = &cliEnv{stdin: env.stdin, stdout: safeText(env.stdout), stderr: safeText(env.stderr), lookup: env.lookup}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(env.stdout, usage)
		return nil
	}
	if args[0] == "--version" {
		return cmdVersion(ctx, env, args[1:])
	}
	for _, c := range commands() {
		if c.name == args[0] {
			// With CHANGES_AWS_CALLS set, its AWS requests are recorded as
			// the command's.
			return c.run(awsconf.WithCaller(ctx, "changesctl "+c.name), env, args[1:])
		}
	}
	fmt.Fprint(env.stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

func newLogger(w io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}
