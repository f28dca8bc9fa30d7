package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/pipeline"
)

// Descriptions of --job and --output for commands that act on one job or
// one output and default to the only one.
const (
	helpOneJob    = "job id (default: the only job)"
	helpOneOutput = "output id (default: the job's only output)"
)

// newFlags returns the flag set of a command, reporting to its stderr.
func newFlags(env *cliEnv, name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	return fs
}

// runAction runs the action that starts the arguments of a command with
// actions (`dlq list`, `halt show`...) on the arguments after it; each
// action defines and parses its own flags. A missing or unknown action
// prints the command's usage and is an error naming the actions there are.
func runAction(ctx context.Context, env *cliEnv, cmd, usage string, args []string, actions ...command) error {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		for _, a := range actions {
			if a.name == args[0] {
				return a.run(ctx, env, args[1:])
			}
		}
	}
	names := make([]string, len(actions))
	for i, a := range actions {
		names[i] = a.name
	}
	want := "want " + oneOf(names)
	fmt.Fprint(env.stderr, usage)
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return fmt.Errorf("%s: %s", cmd, want)
	}
	return fmt.Errorf("%s: unknown action %q (%s)", cmd, args[0], want)
}

// oneOf lists words as "a, b or c".
func oneOf(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// scope is what a command's --config, --job and --output flags name.
type scope struct {
	path, job, output *string
}

// scopeFlags defines --config on fs, and --job and --output with these
// descriptions; an empty description leaves that flag out.
func scopeFlags(fs *flag.FlagSet, jobHelp, outputHelp string) *scope {
	s := &scope{path: fs.String("config", "", "job configuration file"), job: new(string), output: new(string)}
	if jobHelp != "" {
		s.job = fs.String("job", "", jobHelp)
	}
	if outputHelp != "" {
		s.output = fs.String("output", "", outputHelp)
	}
	return s
}

// load reads the configuration file and builds the dependencies.
func (s *scope) load(ctx context.Context, env *cliEnv, verbose bool) (*pipeline.Deps, error) {
	return load(ctx, env, *s.path, env.stderr, verbose)
}

// openJob loads the dependencies and finds the job; cmd prefixes a failure
// to find it. The caller closes the dependencies.
func (s *scope) openJob(ctx context.Context, env *cliEnv, cmd string) (*pipeline.Deps, *config.Job, error) {
	deps, err := s.load(ctx, env, false)
	if err != nil {
		return nil, nil, err
	}
	j, err := pickJob(deps.Config, *s.job)
	if err != nil {
		deps.Close()
		return nil, nil, fmt.Errorf("%s: %w", cmd, err)
	}
	return deps, j, nil
}

// openOutput loads the dependencies and finds the job and the output; cmd
// prefixes a failure to find them. The caller closes the dependencies.
func (s *scope) openOutput(ctx context.Context, env *cliEnv, cmd string) (*pipeline.Deps, *config.Job, *config.Output, error) {
	deps, err := s.load(ctx, env, false)
	if err != nil {
		return nil, nil, nil, err
	}
	j, o, err := route(deps.Config, *s.job, *s.output)
	if err != nil {
		deps.Close()
		return nil, nil, nil, fmt.Errorf("%s: %w", cmd, err)
	}
	return deps, j, o, nil
}
