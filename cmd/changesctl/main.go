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
  changesctl job pause|resume --job J    stop or restart a deployed job's schedule
  changesctl bucket check --config FILE  check that the stack bucket expires claim checks
  changesctl docid hash ID...            the form of an id in logs and records with stack.doc_ids hash
  changesctl version                     the release this changesctl was built from
  changesctl help COMMAND [ACTION]       a command's usage and flags (as COMMAND -h)

--config FILE may be left out when CHANGESCTL_CONFIG names the file; --config
wins when both are set. Every command that prints a result takes -o table
(the default) or -o json (--json for short). The AWS endpoint comes from the
standard AWS_ENDPOINT_URL (unset: AWS itself); a command that talks to AWS
first names its endpoint, region and account on stderr.

Exit status: 0 done, 1 failed, 2 drift found (verify), 3 not supported for
what the command was pointed at, 64 a command line that cannot be right
(unknown command, action or flag, a refused value, a missing flag).
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
	// refused is the flag set whose Parse refused the command line, set by
	// newFlags; realMain makes its error a usage error.
	refused *flag.FlagSet
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
		{"job", cmdJob},
		{"bucket", cmdBucket},
		{"docid", cmdDocID},
		{"version", cmdVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	env := &cliEnv{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, lookup: os.LookupEnv}
	status := exitStatus(realMain(ctx, env, os.Args[1:]), safeText(os.Stderr))
	stop()
	os.Exit(status)
}

// The exit statuses, as docs/operations.md#exit-status lists them.
const (
	exitFailed      = 1
	exitDrift       = 2
	exitUnsupported = 3
	exitUsage       = 64 // EX_USAGE of sysexits.h
)

// exitError carries the exit status of an outcome that is not a plain
// failure: drift found, or a command that does not apply to what it was
// pointed at. Wrap it with %w.
type exitError int

func (e exitError) Error() string {
	switch e {
	case exitDrift:
		return "drift found"
	case exitUnsupported:
		return "not supported"
	}
	return fmt.Sprintf("exit status %d", int(e))
}

// errUnsupported is the error of a command that does not apply to what it
// was pointed at (exit status 3).
var errUnsupported = exitError(exitUnsupported)

// usageError is a command line that cannot be right, whatever the state of
// the pipeline: an unknown command, action or flag, a value a flag refuses,
// a required flag missing, flags that exclude each other (exit status 64).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usagef returns a usage error.
func usagef(format string, a ...any) error { return &usageError{fmt.Errorf(format, a...)} }

// exitStatus is the status main exits with for what realMain returned; it
// writes the error, if any, to w. Help asked for is no error.
func exitStatus(err error, w io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(w, "changesctl:", err)
	var ee exitError
	var ue *usageError
	switch {
	case errors.As(err, &ee):
		return int(ee)
	case errors.As(err, &ue):
		return exitUsage
	}
	return exitFailed
}

// realMain runs the command args names. Whatever it prints goes through
// safeText: it may hold text from the source or an output.
func realMain(ctx context.Context, env *cliEnv, args []string) error {
	env = &cliEnv{stdin: env.stdin, stdout: safeText(env.stdout), stderr: safeText(env.stderr), lookup: env.lookup}
	if len(args) == 0 || isHelp(args[0]) {
		fmt.Fprint(env.stdout, usage)
		return nil
	}
	if args[0] == "help" {
		if len(args) == 1 {
			fmt.Fprint(env.stdout, usage)
			return nil
		}
		// help COMMAND [ACTION] is COMMAND [ACTION] -h.
		args = append(args[1:min(len(args), 3):min(len(args), 3)], "-h")
	}
	if args[0] == "--version" {
		return cmdVersion(ctx, env, args[1:])
	}
	names := make([]string, 0, len(commands()))
	for _, c := range commands() {
		if c.name == args[0] {
			// With CHANGES_AWS_CALLS set, its AWS requests are recorded as
			// the command's.
			err := c.run(awsconf.WithCaller(ctx, "changesctl "+c.name), env, args[1:])
			if env.refused != nil && err != nil && !errors.Is(err, flag.ErrHelp) {
				return refusedFlags(env.refused, err)
			}
			return err
		}
		names = append(names, c.name)
	}
	hint := didYouMean(args[0], names, "")
	if hint == "" {
		hint = " (changesctl -h lists the commands)"
	}
	return usagef("unknown command %q%s", args[0], hint)
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "--h":
		return true
	}
	return false
}

func newLogger(w io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}
