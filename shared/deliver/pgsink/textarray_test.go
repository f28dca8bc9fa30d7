package pgsink

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A textArray reaches PostgreSQL as the text[] it holds, NULLs and
// characters the array syntax quotes included, in every query mode (the
// exec and simple protocol modes through its text form), and a nil one as
// NULL.
func TestTextArrayInEveryQueryMode(t *testing.T) {
	t.Parallel()
	in := textArray{text("plain"), text(""), {}, text("NULL"), text(`say "hi"`), text(`back\slash`), text("a,b {c} d"),
		text(" padded "), text("é ✓ \u2028"), text("line\nbreak\ttab")}
	modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			pool := poolWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = mode })
			var got []pgtype.Text
			if err := pool.QueryRow(t.Context(), `SELECT $1::text[]`, in).Scan(&got); err != nil {
				t.Fatalf("select: %v", err)
			}
			if diff := cmp.Diff([]pgtype.Text(in), got); diff != "" {
				t.Errorf("text[] read back (-sent +got):\n%s", diff)
			}
			var isNull bool
			if err := pool.QueryRow(t.Context(), `SELECT $1::text[] IS NULL`, textArray(nil)).Scan(&isNull); err != nil {
				t.Fatalf("select nil: %v", err)
			}
			if !isNull {
				t.Error("a nil textArray is not NULL")
			}
		})
	}
}
