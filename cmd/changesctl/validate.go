package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/changes-worker/changes-worker/shared/config"
)

// cmdValidate checks a configuration file as a deploy does
// (config.CheckForDeploy: what loading checks and what AWS would refuse) and
// prints every problem, one a line, each naming its key (a syntax error its
// line and column); or, when there is none, "ok", the jobs with their
// outputs, and the deploy's warnings, one a line. It reads only the file:
// no AWS access.
func cmdValidate(_ context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "validate")
	sc := scopeFlags(fs, "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("validate: unexpected argument %q", fs.Arg(0))
	}
	if *sc.path == "" {
		return errors.New("validate: --config is required")
	}
	raw, err := os.ReadFile(*sc.path)
	if err != nil {
		return fmt.Errorf("validate: %w", err)
	}
	cfg, warnings, err := config.CheckForDeploy(raw)
	if err != nil {
		problems := []error{err}
		if list, ok := err.(interface{ Unwrap() []error }); ok {
			problems = list.Unwrap()
		}
		for _, p := range problems {
			fmt.Fprintln(env.stdout, p)
		}
		return fmt.Errorf("validate: %s: %s", *sc.path, counted(len(problems), "problem"))
	}
	outputs := 0
	for _, j := range cfg.Jobs {
		outputs += len(j.Outputs)
	}
	fmt.Fprintf(env.stdout, "ok: %s, %s\n", counted(len(cfg.Jobs), "job"), counted(outputs, "output"))
	for _, j := range cfg.Jobs {
		names := make([]string, len(j.Outputs))
		for i, o := range j.Outputs {
			names[i] = o.ID + " (" + o.Type + ")"
		}
		fmt.Fprintf(env.stdout, "  %s: %s source, outputs %s\n", j.ID, j.Source.Type, strings.Join(names, ", "))
	}
	for _, w := range warnings {
		fmt.Fprintln(env.stdout, "warning: "+w.String())
	}
	return nil
}

// counted is n and noun, in the plural unless n is 1.
func counted(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
