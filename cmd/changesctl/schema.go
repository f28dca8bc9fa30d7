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
	sc := scopeFlags(fs, "only this job `id`", "only this output `id`")
	asJSON := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	file, err := sc.configFile(env)
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	cfg, err := config.Load(file.path)
	if err != nil {
		return file.wrap(err)
	}
	var tables []schemaShown
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
					return fmt.Errorf("schema: output %s of job %s is a %s output: %w (it prints the tables of postgres outputs)", o.ID, j.ID, o.Type, errUnsupported)
				}
				continue
			}
			ddl, err := pgsink.DDL(*o.Postgres, o.ID)
			if err != nil {
				return fmt.Errorf("schema: job %s: %w", j.ID, err)
			}
			mode := "document"
			if o.Postgres.Mapping != nil {
				mode = "mapping"
			}
			tables = append(tables, schemaShown{Job: j.ID, Output: o.ID, Mode: mode, DDL: ddl})
		}
	}
	if len(tables) == 0 {
		return errors.New("schema: no postgres output matches")
	}
	if *asJSON {
		return writeJSON(env.stdout, tables)
	}
	for i, t := range tables {
		if i > 0 {
			fmt.Fprintln(env.stdout)
		}
		fmt.Fprintf(env.stdout, "-- job %s, output %s (%s mode)\n%s", t.Job, t.Output, t.Mode, t.DDL)
	}
	return nil
}

// schemaShown is one output's tables as `schema -o json` prints them.
type schemaShown struct {
	Job    string `json:"job"`
	Output string `json:"output"`
	Mode   string `json:"mode"`
	DDL    string `json:"ddl"`
}
