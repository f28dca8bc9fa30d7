package main

import (
	"context"
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
	asJSON := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("validate: unexpected argument %q", fs.Arg(0))
	}
	file, err := sc.configFile(env)
	if err != nil {
		return fmt.Errorf("validate: %w", err)
	}
	raw, err := os.ReadFile(file.path)
	if err != nil {
		return fmt.Errorf("validate: %w", file.wrap(err))
	}
	cfg, warnings, err := config.CheckForDeploy(raw)
	v := validation{Problems: []string{}, Jobs: []validJob{}, Warnings: []string{}}
	if err != nil {
		problems := []error{err}
		if list, ok := err.(interface{ Unwrap() []error }); ok {
			problems = list.Unwrap()
		}
		for _, p := range problems {
			v.Problems = append(v.Problems, p.Error())
		}
		if err := printValidation(env, v, *asJSON); err != nil {
			return err
		}
		return fmt.Errorf("validate: %s: %s", file.path, counted(len(problems), "problem"))
	}
	v.OK = true
	for _, j := range cfg.Jobs {
		vj := validJob{Job: j.ID, Source: j.Source.Type}
		for _, o := range j.Outputs {
			vj.Outputs = append(vj.Outputs, validOutput{ID: o.ID, Type: o.Type})
		}
		v.Jobs = append(v.Jobs, vj)
	}
	for _, w := range warnings {
		v.Warnings = append(v.Warnings, w.String())
	}
	return printValidation(env, v, *asJSON)
}

// validation is what `validate -o json` prints: ok, or the problems, each
// naming its key; the jobs and the deploy's warnings.
type validation struct {
	OK       bool       `json:"ok"`
	Problems []string   `json:"problems"`
	Jobs     []validJob `json:"jobs"`
	Warnings []string   `json:"warnings"`
}

type validJob struct {
	Job     string        `json:"job"`
	Source  string        `json:"source"`
	Outputs []validOutput `json:"outputs"`
}

type validOutput struct {
	ID   string `json:"id"`
	Type string `json:"type"`
}

func printValidation(env *cliEnv, v validation, asJSON bool) error {
	if asJSON {
		return writeJSON(env.stdout, v)
	}
	for _, p := range v.Problems {
		fmt.Fprintln(env.stdout, p)
	}
	if !v.OK {
		return nil
	}
	outputs := 0
	for _, j := range v.Jobs {
		outputs += len(j.Outputs)
	}
	fmt.Fprintf(env.stdout, "ok: %s, %s\n", counted(len(v.Jobs), "job"), counted(outputs, "output"))
	for _, j := range v.Jobs {
		names := make([]string, len(j.Outputs))
		for i, o := range j.Outputs {
			names[i] = o.ID + " (" + o.Type + ")"
		}
		fmt.Fprintf(env.stdout, "  %s: %s source, outputs %s\n", j.Job, j.Source, strings.Join(names, ", "))
	}
	for _, w := range v.Warnings {
		fmt.Fprintln(env.stdout, "warning: "+w)
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
