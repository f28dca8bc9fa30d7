package main

import (
	"context"
	"fmt"

	"github.com/changes-worker/changes-worker/shared/docid"
)

const docIDUsage = `usage: changesctl docid hash ID [ID...] [-o json|table]

  hash   the form under which the logs, DLQ attributes and records name each
         document id with stack.doc_ids hash, to find an id's lines

It needs no configuration and no AWS access.
`

// cmdDocID prints, for each document id given, the form under which the
// logs, DLQ attributes and records name it with stack.doc_ids hash, so an
// operator who knows an id can find its lines. It needs no configuration
// or AWS access.
func cmdDocID(ctx context.Context, env *cliEnv, args []string) error {
	return runAction(ctx, env, "docid", docIDUsage, args, command{"hash", func(_ context.Context, env *cliEnv, args []string) error {
		fs := newFlags(env, "docid hash")
		asJSON := outputFlag(fs)
		ids, err := parseAll(fs, args)
		if err != nil {
			return err
		}
		if len(ids) == 0 {
			return usagef("docid hash: name at least one document id")
		}
		if *asJSON {
			out := make([]hashedID, len(ids))
			for i, id := range ids {
				out[i] = hashedID{ID: id, Hash: docid.Hash(id)}
			}
			return writeJSON(env.stdout, out)
		}
		for _, id := range ids {
			fmt.Fprintf(env.stdout, "%s\t%s\n", docid.Hash(id), printable(id))
		}
		return nil
	}})
}

// hashedID is one id as `docid hash -o json` prints it.
type hashedID struct {
	ID   string `json:"id"`
	Hash string `json:"hash"`
}
