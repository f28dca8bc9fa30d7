package main

import (
	"context"
	"fmt"
	"net/http"

	"github.com/changes-worker/changes-worker/shared/demo/sample"
)

// cmdSample loads the sample order data set into a source database.
func cmdSample(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "sample")
	db := fs.String("url", "", "database URL, e.g. http://127.0.0.1:5984/demo-orders")
	docs := fs.Int("docs", 1000, "documents to insert")
	update := fs.Int("update-every", 4, "update every n-th document once more")
	del := fs.Int("delete-every", 10, "delete every n-th document afterwards")
	fresh := fs.Bool("fresh", false, "delete and recreate the database first")
	asJSON := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *db == "" {
		return usagef("sample: --url is required")
	}
	c := http.DefaultClient
	if *fresh {
		if err := sample.DeleteDB(ctx, c, *db); err != nil {
			return err
		}
	}
	if err := sample.CreateDB(ctx, c, *db); err != nil {
		return err
	}
	final, err := sample.Load(ctx, c, *db, sample.Options{Docs: *docs, UpdateEvery: *update, DeleteEvery: *del, Seed: 1})
	if err != nil {
		return err
	}
	live := 0
	for _, d := range final {
		if !d.Deleted {
			live++
		}
	}
	if *asJSON {
		return writeJSON(env.stdout, sampleLoaded{Documents: len(final), Live: live, Deleted: len(final) - live})
	}
	fmt.Fprintf(env.stdout, "loaded %d documents into the source (%d live, %d deleted)\n", len(final), live, len(final)-live)
	return nil
}

// sampleLoaded is what `sample -o json` prints.
type sampleLoaded struct {
	Documents int `json:"documents"`
	Live      int `json:"live"`
	Deleted   int `json:"deleted"`
}
