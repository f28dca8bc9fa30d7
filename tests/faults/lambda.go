package faults

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"

	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

// The deployed stack on LocalStack: its Lambda functions run on this
// machine, each execution environment a bootstrap process under the
// Runtime Interface Emulator (localstack/lambdahost), and its schedule
// rules fire from LocalStack's scheduler.

// Bootstrap is the process of one execution environment of a Lambda
// function that LocalStack runs on this machine.
type Bootstrap struct {
	PID int
	// LogStream is the environment's log stream, which is also the host a
	// poller in it records as the lease holder's (pipeline.Hostname).
	LogStream string
}

// Bootstraps lists the running bootstrap processes of function, found by the
// AWS_LAMBDA_FUNCTION_NAME of their environment.
func Bootstraps(function string) ([]Bootstrap, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []Bootstrap
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(string(cmdline), "\x00")
		if filepath.Base(args[0]) != "bootstrap" {
			continue
		}
		environ, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		env := strings.Split(string(environ), "\x00")
		if !slices.Contains(env, "AWS_LAMBDA_FUNCTION_NAME="+function) {
			continue
		}
		b := Bootstrap{PID: pid}
		for _, kv := range env {
			if s, ok := strings.CutPrefix(kv, "AWS_LAMBDA_LOG_STREAM_NAME="); ok {
				b.LogStream = s
			}
		}
		out = append(out, b)
	}
	return out, nil
}

// ErrNoBootstrap: no running bootstrap of the function serves the execution
// environment asked for.
var ErrNoBootstrap = errors.New("no bootstrap runs in that execution environment")

// KillBootstrap sends SIGKILL to the bootstrap of function that runs in the
// execution environment whose log stream is host (the job item's host of a
// poller holding the lease) and returns its pid, and only that one.
func KillBootstrap(function, host string) (int, error) {
	all, err := Bootstraps(function)
	if err != nil {
		return 0, err
	}
	for _, b := range all {
		if b.LogStream == host {
			if err := syscall.Kill(b.PID, syscall.SIGKILL); err != nil {
				return 0, fmt.Errorf("kill bootstrap %d: %w", b.PID, err)
			}
			return b.PID, nil
		}
	}
	return 0, fmt.Errorf("%s in %s: %w", function, host, ErrNoBootstrap)
}

// StartSchedule enables a schedule rule of the deployed stack and puts its
// targets again: LocalStack schedules a rule when its targets are put, as
// the rule is then. stop removes the targets and disables the rule, which
// LocalStack's DisableRule alone does not stop.
func StartSchedule(ctx context.Context, eb *eventbridge.Client, rule string) (stop func(context.Context) error, err error) {
	targets, err := eb.ListTargetsByRule(ctx, &eventbridge.ListTargetsByRuleInput{Rule: &rule})
	if err != nil {
		return nil, fmt.Errorf("list targets of %s: %w", rule, err)
	}
	if _, err := eb.EnableRule(ctx, &eventbridge.EnableRuleInput{Name: &rule}); err != nil {
		return nil, fmt.Errorf("enable rule %s: %w", rule, err)
	}
	if _, err := eb.PutTargets(ctx, &eventbridge.PutTargetsInput{Rule: &rule, Targets: targets.Targets}); err != nil {
		return nil, fmt.Errorf("put targets of %s: %w", rule, err)
	}
	return func(ctx context.Context) error {
		var ids []string
		for _, tg := range targets.Targets {
			ids = append(ids, aws.ToString(tg.Id))
		}
		_, rerr := eb.RemoveTargets(ctx, &eventbridge.RemoveTargetsInput{Rule: &rule, Ids: ids})
		_, derr := eb.DisableRule(ctx, &eventbridge.DisableRuleInput{Name: &rule})
		return errors.Join(rerr, derr)
	}, nil
}

// Adopt wraps a stack built elsewhere whose job is Job, for StartLoad and
// Watch; its other methods need a stack from NewStack.
func Adopt(st *stack.Stack) *Stack {
	j := st.Config.Jobs[0]
	return &Stack{Stack: st, TTL: j.Lease.TTL.D(), Limit: j.Feed.Limit, hc: &http.Client{Timeout: 2 * time.Minute}}
}
