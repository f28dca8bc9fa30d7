package pgsink

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/changes-worker/changes-worker/shared/config"
)

func TestTables(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		out            config.PostgresOutput
		data, versions pgx.Identifier
	}{
		{"document mode", config.PostgresOutput{Schema: "s", Table: "t"}, pgx.Identifier{"s", "t"}, pgx.Identifier{"s", "t_versions"}},
		{"defaults", config.PostgresOutput{}, pgx.Identifier{"public", "my_out"}, pgx.Identifier{"public", "my_out_versions"}},
		{"mapping mode", config.PostgresOutput{Schema: "s", Table: "t", Mapping: &config.Mapping{}}, nil, pgx.Identifier{"s", "t_versions"}},
		{"mapping with its own versions table", config.PostgresOutput{Schema: "s", Table: "t", Mapping: &config.Mapping{VersionsTable: "v"}}, nil, pgx.Identifier{"s", "v"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			data, versions, err := Tables(tt.out, "my-out")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]pgx.Identifier{tt.data, tt.versions}, []pgx.Identifier{data, versions}); diff != "" {
				t.Errorf("tables (-want +got):\n%s", diff)
			}
		})
	}
}
