package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// envTestMain makes the test binary run changesctl's main (TestMain).
const envTestMain = "CHANGESCTL_TEST_MAIN"

// runMain runs changesctl as a process (this test binary, running main) on
// args, with the test's environment less CHANGESCTL_CONFIG, plus env, and
// returns what it printed and its exit status.
func runMain(t *testing.T, env []string, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	for _, kv := range testenv.Environ() {
		if !strings.HasPrefix(kv, "CHANGESCTL_CONFIG=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, envTestMain+"=1"), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("changesctl %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// noConfigLookup is the environment without CHANGESCTL_CONFIG, so that a
// test sees what a command does when no configuration is named.
func noConfigLookup(k string) (string, bool) {
	if k == "CHANGESCTL_CONFIG" {
		return "", false
	}
	return testenv.Lookup(k)
}

// cliArgs runs realMain on args without services and without a
// configuration named, and returns what it printed and its error.
func cliArgs(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb strings.Builder
	err = realMain(t.Context(), &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, lookup: noConfigLookup}, args)
	return out.String(), errb.String(), err
}

// TestHelpExitsZero: -h on every command and every action of a command,
// --help, and help COMMAND, print the command's usage on standard output,
// nothing on standard error, and exit 0.
func TestHelpExitsZero(t *testing.T) {
	t.Parallel()
	actions := map[string][]string{
		"dlq": {"list", "show", "redrive", "purge"}, "halt": {"show", "retry", "skip", "clear"},
		"checkpoint": {"get", "set", "reset"}, "invoke": {"poller", "writer"}, "bucket": {"check"},
		"docid": {"hash"}, "job": {"pause", "resume"},
	}
	var cases [][]string
	for _, c := range commands() {
		cases = append(cases, []string{c.name, "-h"})
		for _, a := range actions[c.name] {
			cases = append(cases, []string{c.name, a, "-h"})
		}
	}
	cases = append(cases, []string{"status", "--help"}, []string{"dlq", "list", "--help"}, []string{"help", "dlq", "list"}, []string{"help", "status"})
	for _, args := range cases {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			stdout, stderr, status := runMain(t, nil, args...)
			verb := args[0]
			if verb == "help" {
				verb = args[1]
			}
			if status != 0 || stderr != "" || !strings.Contains(stdout, "changesctl "+verb) {
				t.Errorf("changesctl %s: exit status %d, want 0; stdout:\n%s\nstderr:\n%s", strings.Join(args, " "), status, stdout, stderr)
			}
		})
	}
	// An action's help lists its own flags.
	stdout, _, _ := runMain(t, nil, "dlq", "list", "-h")
	for _, want := range []string{"--limit", "--samples", "-o", "--config"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("changesctl dlq list -h does not list %s:\n%s", want, stdout)
		}
	}
}

// TestExitStatus: each documented exit status, from the process: 0 done,
// 1 failed, 2 drift found, 3 not supported, 64 a command line that cannot
// be right.
func TestExitStatus(t *testing.T) {
	t.Parallel()
	s := newTestStack(t, outPG)
	s.putDoc("delivered-1", map[string]any{"n": 1}, "")
	s.run(false)                                      // creates the output's tables
	s.putDoc("missing-1", map[string]any{"n": 2}, "") // never delivered: drift
	h := newTestStack(t, outHTTP)
	bad := tempFile(t, "bad.json", []byte(`{"jobs": []}`))
	tests := []struct {
		name   string
		args   []string
		status int
		stderr string
	}{
		{"ok", []string{"version"}, 0, ""},
		{"failed", []string{"validate", "--config", bad}, 1, "problem"},
		{"drift", []string{"verify", "--config", s.ConfigPath, "--output", outPG}, 2, "documents differ"},
		{"not supported", []string{"verify", "--config", h.ConfigPath}, 3, "not supported"},
		{"unknown command", []string{"stauts"}, 64, `unknown command "stauts"`},
		{"unknown action", []string{"dlq", "drain"}, 64, `unknown action "drain"`},
		{"unknown flag", []string{"dlq", "list", "--bogus"}, 64, "flag provided but not defined: -bogus"},
		{"bad flag value", []string{"dlq", "list", "--limit", "many"}, 64, "invalid value"},
		{"missing flag", []string{"checkpoint", "set"}, 64, "--seq is required"},
		{"no configuration", []string{"status"}, 64, "--config is required"},
		{"conflicting flags", []string{"status", "--config", s.ConfigPath, "--watch", "--peek"}, 64, "cannot be combined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, status := runMain(t, nil, tt.args...)
			if status != tt.status || !strings.Contains(stderr, tt.stderr) {
				t.Errorf("changesctl %s: exit status %d, want %d with %q on stderr\nstdout:\n%s\nstderr:\n%s",
					strings.Join(tt.args, " "), status, tt.status, tt.stderr, stdout, stderr)
			}
		})
	}
}

// TestConfigFromEnvironment: CHANGESCTL_CONFIG names the configuration
// when --config is absent; --config wins when both are set; a file the
// variable names that cannot be read is an error naming the variable.
func TestConfigFromEnvironment(t *testing.T) {
	ctx, s := parallelStack(t, outPG)
	run := func(env string, args ...string) (string, error) {
		var out, errb strings.Builder
		lookup := func(k string) (string, bool) {
			if k == "CHANGESCTL_CONFIG" {
				return env, env != ""
			}
			return testenv.Lookup(k)
		}
		err := realMain(ctx, &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, lookup: lookup}, args)
		return out.String(), err
	}
	missing := t.TempDir() + "/missing.json"
	for _, tt := range []struct {
		name, env string
		args      []string
		want      string
	}{
		{"variable", s.ConfigPath, []string{"checkpoint", "get"}, "orders checkpoint (beginning)"},
		{"variable, validate", s.ConfigPath, []string{"validate"}, "ok: 1 job, 1 output"},
		{"variable, schema", s.ConfigPath, []string{"schema"}, "CREATE TABLE IF NOT EXISTS"},
		{"flag wins", missing, []string{"checkpoint", "get", "--config", s.ConfigPath}, "orders checkpoint (beginning)"},
	} {
		out, err := run(tt.env, tt.args...)
		if err != nil || !strings.Contains(out, tt.want) {
			t.Errorf("%s: CHANGESCTL_CONFIG=%s changesctl %s: %v\n%s", tt.name, tt.env, strings.Join(tt.args, " "), err, out)
		}
	}
	if _, err := run(s.ConfigPath, "checkpoint", "get", "--config", missing); err == nil || !strings.Contains(err.Error(), "missing.json") {
		t.Errorf("--config naming a missing file, CHANGESCTL_CONFIG a good one: error %v, want one naming missing.json", err)
	}
	if _, err := run(missing, "checkpoint", "get"); err == nil || !strings.Contains(err.Error(), "CHANGESCTL_CONFIG") {
		t.Errorf("CHANGESCTL_CONFIG naming a missing file: error %v, want one naming CHANGESCTL_CONFIG", err)
	}
}

// TestOutputFormats: every command that prints takes -o json and -o table
// (--json stays the shorthand of -o json): JSON decodes, a table does not.
func TestOutputFormats(t *testing.T) {
	ctx, s := parallelStack(t, outPG)
	s.putDoc("doc-1", map[string]any{"n": 1}, "")
	for _, args := range [][]string{
		{"validate"},
		{"schema"},
		{"bootstrap"},
		{"status"},
		{"checkpoint", "get"},
		{"checkpoint", "set", "--seq", "5", "--yes"},
		{"checkpoint", "reset", "--yes"},
		{"run", "--until-idle", "--tick", "1s"},
		{"invoke", "poller", "--event", sampleEvent("schedule.json"), "--function-timeout", "3s"},
		{"dlq", "list"},
		{"dlq", "show"},
		{"dlq", "redrive"},
		{"dlq", "purge", "--yes"},
		{"verify"},
		{"bucket", "check"},
		{"docid", "hash", "a/b"},
		{"version"},
	} {
		for _, format := range []string{"json", "table"} {
			// Drift or a bucket without the expiry rule exit non-zero,
			// having printed their report.
			run := func(args ...string) (string, string, error) { return s.cli(ctx, "", args...) }
			if args[0] == "docid" || args[0] == "version" { // no configuration
				run = func(args ...string) (string, string, error) { return cliArgs(t, args...) }
			}
			out, errOut, err := run(append(slicesClone(args), "-o", format)...)
			if err != nil && (strings.Contains(err.Error(), "flag provided but not defined") || strings.Contains(err.Error(), "invalid value")) {
				t.Errorf("changesctl %s -o %s: %v", strings.Join(args, " "), format, err)
				continue
			}
			isJSON := json.Valid([]byte(out))
			if format == "json" && !isJSON || format == "table" && (isJSON || strings.TrimSpace(out) == "") {
				t.Errorf("changesctl %s -o %s (%v) printed:\n%s\nstderr:\n%s", strings.Join(args, " "), format, err, out, errOut)
			}
		}
	}
	if out, _, err := s.cli(ctx, "", "checkpoint", "get", "--json"); err != nil || !json.Valid([]byte(out)) {
		t.Errorf("checkpoint get --json: %v\n%s", err, out)
	}
	if _, _, err := s.cli(ctx, "", "status", "-o", "yaml"); err == nil || !strings.Contains(err.Error(), "json or table") {
		t.Errorf("status -o yaml: %v, want an error naming json or table", err)
	}
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }

// TestOutputNamedLikeAFormat: --output names an output; asked for one
// called json or table that does not exist, the error points at -o.
func TestOutputNamedLikeAFormat(t *testing.T) {
	ctx, s := parallelStack(t, outPG)
	_, _, err := s.cli(ctx, "", "dlq", "list", "--output", "json")
	if err == nil || !strings.Contains(err.Error(), `no output "json"`) || !strings.Contains(err.Error(), "-o json") {
		t.Errorf("dlq list --output json: %v, want an error pointing at -o json", err)
	}
}

// TestDidYouMean: a mistyped command, action or flag is refused with the
// one that was probably meant.
func TestDidYouMean(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"stauts"}, "did you mean status?"},
		{[]string{"verfy"}, "did you mean verify?"},
		{[]string{"dlq", "lsit"}, "did you mean list?"},
		{[]string{"checkpoint", "rest"}, "did you mean reset?"},
		{[]string{"halt", "skp"}, "did you mean skip?"},
		{[]string{"dlq", "list", "--limt", "3"}, "did you mean --limit?"},
	} {
		_, _, err := cliArgs(t, tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("changesctl %s: %v, want %q", strings.Join(tt.args, " "), err, tt.want)
		}
	}
	if _, _, err := cliArgs(t, "zzzzzz"); err == nil || strings.Contains(err.Error(), "did you mean") {
		t.Errorf("changesctl zzzzzz: %v, want no suggestion", err)
	}
}

// TestFlagNames: one name per idea across commands (--wait, --limit,
// --samples, --job, --function-timeout); the names they replace still work
// until 2.0.0, with a warning on standard error. Parsing succeeds when the
// command goes on to ask for its configuration.
func TestFlagNames(t *testing.T) {
	t.Parallel()
	event := sampleEvent("schedule.json")
	for _, tt := range []struct {
		args []string
		warn string
	}{
		{[]string{"verify", "--wait", "1m", "--samples", "3"}, ""},
		{[]string{"dlq", "list", "--limit", "3", "--samples", "2"}, ""},
		{[]string{"run", "--job", "a", "--job", "b"}, ""},
		{[]string{"invoke", "poller", "--event", event, "--function-timeout", "5s"}, ""},
		{[]string{"verify", "--lease-wait", "1m"}, "--lease-wait is deprecated, use --wait"},
		{[]string{"verify", "--sample", "3"}, "--sample is deprecated, use --samples"},
		{[]string{"dlq", "list", "--max", "3"}, "--max is deprecated, use --limit"},
		{[]string{"run", "--jobs", "a,b"}, "--jobs is deprecated, use --job"},
		{[]string{"invoke", "poller", "--event", event, "--timeout", "5s"}, "--timeout is deprecated, use --function-timeout"},
	} {
		_, stderr, err := cliArgs(t, tt.args...)
		if err == nil || !strings.Contains(err.Error(), "--config is required") {
			t.Errorf("changesctl %s: %v, want the flags accepted (then: --config is required)", strings.Join(tt.args, " "), err)
		}
		if tt.warn != "" && !strings.Contains(stderr, tt.warn) {
			t.Errorf("changesctl %s: stderr %q, want %q", strings.Join(tt.args, " "), stderr, tt.warn)
		}
		if tt.warn == "" && strings.Contains(stderr, "deprecated") {
			t.Errorf("changesctl %s: stderr %q warns", strings.Join(tt.args, " "), stderr)
		}
	}
}

// TestMissingQueueNamesRegionAndPrefix: a queue the configuration names
// that the endpoint does not have is reported with the region and the
// stack prefix to check, not with advice to bootstrap (which on AWS would
// create resources outside the stack).
func TestMissingQueueNamesRegionAndPrefix(t *testing.T) {
	t.Parallel()
	prefix := testenv.Name(t)
	cfg := writeS3Config(t, prefix, "")
	for _, args := range [][]string{
		{"dlq", "list", "--config", cfg},
		{"run", "--config", cfg, "--no-poller", "--until-idle", "--timeout", "30s"},
	} {
		var out, errb strings.Builder
		err := realMain(t.Context(), &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, lookup: noConfigLookup}, args)
		if err == nil || strings.Contains(err.Error(), "bootstrap first") || !strings.Contains(err.Error(), "us-east-1") || !strings.Contains(err.Error(), "stack.prefix") {
			t.Errorf("changesctl %s: %v, want an error naming the region and stack.prefix, without bootstrap first", strings.Join(args, " "), err)
		}
	}
}

// TestJobPauseResume: job pause disables the job's schedule rule and job
// resume enables it again, each saying what it did; where the job has no
// rule (the pipeline runs under changesctl run), both exit 3 saying so.
func TestJobPauseResume(t *testing.T) {
	ctx, s := parallelStack(t, outPG)
	rule := s.Config.ScheduleName(s.Config.Jobs[0])

	_, stderr, status := runMain(t, nil, "job", "pause", "--config", s.ConfigPath)
	if status != 3 || !strings.Contains(stderr, rule) || !strings.Contains(stderr, "changesctl run") {
		t.Errorf("job pause without a rule: exit status %d, want 3, naming the rule and changesctl run; stderr:\n%s", status, stderr)
	}

	eb := eventbridge.NewFromConfig(s.Deps.AWS)
	if _, err := eb.PutRule(ctx, &eventbridge.PutRuleInput{Name: &rule, ScheduleExpression: aws.String("rate(1 minute)"), State: ebtypes.RuleStateEnabled}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = eb.DeleteRule(context.WithoutCancel(ctx), &eventbridge.DeleteRuleInput{Name: &rule})
	})
	state := func() ebtypes.RuleState {
		t.Helper()
		out, err := eb.DescribeRule(ctx, &eventbridge.DescribeRuleInput{Name: &rule})
		if err != nil {
			t.Fatal(err)
		}
		return out.State
	}

	stdout, stderr, status := runMain(t, nil, "job", "pause", "--config", s.ConfigPath, "-o", "json")
	var got struct {
		Job, Rule, State, Was string
	}
	if status != 0 || json.Unmarshal([]byte(stdout), &got) != nil || got.Job != "orders" || got.Rule != rule || got.State != "DISABLED" || got.Was != "ENABLED" {
		t.Errorf("job pause -o json: exit status %d, printed %+v\n%s\nstderr:\n%s", status, got, stdout, stderr)
	}
	if st := state(); st != ebtypes.RuleStateDisabled {
		t.Errorf("after job pause the rule is %s", st)
	}
	// Pausing again changes nothing, and says so.
	out := s.mustCLI(ctx, "job", "pause")
	if !strings.Contains(out, "already paused") {
		t.Errorf("job pause twice:\n%s", out)
	}

	s.pollerCheckpoint() // a running invocation holds the lease
	out, errOut, err := s.cli(ctx, "", "job", "pause", "--wait", "1s")
	if err == nil || !strings.Contains(err.Error(), "poller-7") {
		t.Errorf("job pause --wait 1s while a poller holds the lease: %v, want an error naming the holder\n%s\n%s", err, out, errOut)
	}

	out = s.mustCLI(ctx, "job", "resume")
	if !strings.Contains(out, rule+" enabled") {
		t.Errorf("job resume:\n%s", out)
	}
	if st := state(); st != ebtypes.RuleStateEnabled {
		t.Errorf("after job resume the rule is %s", st)
	}
}
