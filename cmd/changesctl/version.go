package main

import (
	"context"
	"fmt"
	"runtime"

	"github.com/changes-worker/changes-worker/shared/version"
)

// cmdVersion prints the release changesctl was built from.
func cmdVersion(_ context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "version")
	asJSON := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("version takes no arguments, got %q", fs.Arg(0))
	}
	if *asJSON {
		return writeJSON(env.stdout, versionShown{Version: version.String(), Commit: version.Commit(), Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH})
	}
	_, err := fmt.Fprintln(env.stdout, "changesctl", version.Long())
	return err
}

// versionShown is what `version -o json` prints.
type versionShown struct {
	Version  string `json:"version"`
	Commit   string `json:"commit"`
	Go       string `json:"go"`
	Platform string `json:"platform"`
}
