package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/changes-worker/changes-worker/shared/docid"
)

// cmdDocID prints, for each document id given, the form under which the
// logs, DLQ attributes and records name it with stack.doc_ids hash, so an
// operator who knows an id can find its lines. It needs no configuration
// or AWS access.
func cmdDocID(ctx context.Context, env *cliEnv, args []string) error {
	const usage = "usage: changesctl docid hash ID [ID...]\n"
	return runAction(ctx, env, "docid", usage, args, command{"hash", func(_ context.Context, env *cliEnv, args []string) error {
		fs := newFlags(env, "docid hash")
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			return errors.New("docid hash: name at least one document id")
		}
		for _, id := range fs.Args() {
			fmt.Fprintf(env.stdout, "%s\t%s\n", docid.Hash(id), printable(id))
		}
		return nil
	}})
}
