package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver/pgsink"
)

// cmdSchema prints the CREATE TABLE IF NOT EXISTS statements of the postgres
// outputs: the mapped tables, versions and data-quality tables of an output
// with a mapping, the data and versions tables of one without. It reads only
// the configuration file: no database or AWS access.
func cmdSchema(_ context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "schema")
	sc := scopeFlags(fs, "only this job", "only this output")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *sc.path == "" {
		return errors.New("schema: --config is required")
	}
	cfg, err := config.Load(*sc.path)
	if err != nil {
		return err
	}
	printed := 0
	for _, j := range cfg.Jobs {
		if *sc.job != "" && j.ID != *sc.job {
			continue
		}
		for _, o := range j.Outputs {
			if *sc.output != "" && o.ID != *sc.output {
				continue
			}
			if o.Postgres == nil {
				if *sc.output != "" {
					return fmt.Errorf("schema: output %s of job %s is not a postgres output", o.ID, j.ID)
				}
				continue
			}
			ddl, err := pgsink.DDL(*o.Postgres, o.ID)
			if err != nil {
				return fmt.Errorf("schema: job %s: %w", j.ID, err)
			}
			mode := "document mode"
			if o.Postgres.Mapping != nil {
				mode = "mapping mode"
			}
			if printed > 0 {
				fmt.Fprintln(env.stdout)
			}
			fmt.Fprintf(env.stdout, "-- job %s, output %s (%s)\n%s", j.ID, o.ID, mode, ddl)
			printed++
		}
	}
	if printed == 0 {
		return errors.New("schema: no postgres output matches")
	}
	return nil
}
