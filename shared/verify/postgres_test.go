package verify

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/pgsink"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

func scanAll(t *testing.T, out Output) map[string]Doc {
	t.Helper()
	got := map[string]Doc{}
	if err := out.Scan(t.Context(), func(d Doc) error {
		got[d.ID] = d
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestPostgresDocumentMode reads tables written by the real sink, then
// tampered with behind its back.
func TestPostgresDocumentMode(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testenv.Postgres(t)
	table := strings.ReplaceAll(testenv.Name(t), "-", "_")
	out := config.PostgresOutput{Table: table}
	sink, err := pgsink.New(pool, out, "out-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.CreateTables(ctx); err != nil {
		t.Fatal(err)
	}
	data, versions, err := pgsink.Tables(out, "out-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = pool.Exec(cctx, `DROP TABLE IF EXISTS `+data.Sanitize()+`, `+versions.Sanitize())
	})
	var changes []*change.Envelope
	for i, id := range []string{"live", "gone-row", "edited", "deleted", "no-version", "deletion-recorded"} {
		changes = append(changes, &change.Envelope{V: 1, Job: "j", Output: "out-1", DocID: id, Rev: "1-" + id, Seq: json.RawMessage("1"),
			Version: change.Version{Generation: 1, Counter: int64(i + 1)}, Doc: json.RawMessage(`{"x":1}`)})
	}
	changes = append(changes, &change.Envelope{V: 1, Job: "j", Output: "out-1", DocID: "deleted", Rev: "2-deleted", Seq: json.RawMessage("2"),
		Version: change.Version{Generation: 1, Counter: 10}, Deleted: true})
	for i, err := range sink.Apply(ctx, changes) {
		if err != nil {
			t.Fatalf("apply %d: %v", i, err)
		}
	}
	for _, stmt := range []string{
		`DELETE FROM ` + data.Sanitize() + ` WHERE doc_id = 'gone-row'`,
		`UPDATE ` + data.Sanitize() + ` SET rev = '0-edited' WHERE doc_id = 'edited'`,
		`DELETE FROM ` + versions.Sanitize() + ` WHERE doc_id = 'no-version'`,
		`UPDATE ` + versions.Sanitize() + ` SET deleted = true WHERE doc_id = 'deletion-recorded'`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	pg := &Postgres{DB: pool, Data: data, Versions: versions}
	want := map[string]Doc{
		"live":              {ID: "live", Rev: "1-live", Held: true},
		"gone-row":          {ID: "gone-row", Rev: "1-gone-row", Problem: `versions table records rev "1-gone-row" but the data row is gone`},
		"edited":            {ID: "edited", Rev: "0-edited", Held: true, Problem: `versions table records rev "1-edited"`},
		"no-version":        {ID: "no-version", Rev: "1-no-version", Held: true, Problem: "data row without a versions row"},
		"deletion-recorded": {ID: "deletion-recorded", Rev: "1-deletion-recorded", Held: true, Problem: `versions table records a deletion (rev "1-deletion-recorded")`},
	}
	if diff := cmp.Diff(want, scanAll(t, pg)); diff != "" {
		t.Errorf("Scan (-want +got):\n%s", diff)
	}
	got, err := pg.Lookup(ctx, []string{"live", "edited", "deleted", "never"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"edited", "live"}, slices.Sorted(maps.Keys(got))); diff != "" {
		t.Errorf("Lookup found (-want +got):\n%s", diff)
	}
}

// TestPostgresMappingMode reads a mapping-mode versions table: filtered rows
// are not held, deleted rows are skipped.
func TestPostgresMappingMode(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testenv.Postgres(t)
	name := strings.ReplaceAll(testenv.Name(t), "-", "_") + "_v"
	out := config.PostgresOutput{Table: "unused", Mapping: &config.Mapping{VersionsTable: name}}
	data, versions, err := pgsink.Tables(out, "out-1")
	if err != nil {
		t.Fatal(err)
	}
	if data != nil || versions.Sanitize() != (pgx.Identifier{"public", name}).Sanitize() {
		t.Fatalf("tables %v %v", data, versions)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = pool.Exec(cctx, `DROP TABLE IF EXISTS `+versions.Sanitize())
	})
	for _, stmt := range []string{
		`CREATE TABLE ` + versions.Sanitize() + ` (doc_id text PRIMARY KEY, generation bigint NOT NULL, counter bigint NOT NULL,
			rev text NOT NULL, deleted boolean NOT NULL, filtered boolean NOT NULL DEFAULT false, seq text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`,
		`INSERT INTO ` + versions.Sanitize() + ` (doc_id, generation, counter, rev, deleted, filtered, seq) VALUES
			('mapped', 1, 1, '1-m', false, false, '1'), ('filtered', 1, 2, '1-f', false, true, '2'), ('deleted', 1, 3, '2-d', true, false, '3')`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	want := map[string]Doc{
		"mapped":   {ID: "mapped", Rev: "1-m", Held: true},
		"filtered": {ID: "filtered", Rev: "1-f", Filtered: true},
	}
	if diff := cmp.Diff(want, scanAll(t, &Postgres{DB: pool, Versions: versions})); diff != "" {
		t.Errorf("Scan (-want +got):\n%s", diff)
	}
}
