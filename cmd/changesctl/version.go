package main

import (
	"context"
	"fmt"

	"github.com/changes-worker/changes-worker/shared/version"
)

// cmdVersion prints the release changesctl was built from.
func cmdVersion(_ context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "version")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("version takes no arguments, got %q", fs.Arg(0))
	}
	_, err := fmt.Fprintln(env.stdout, "changesctl", version.Long())
	return err
}
