package pgsink

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver/delivertest"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// refusedByPostgres are values the JSON decoder and Go's time parser accept
// but PostgreSQL refuses as they are written, with what coercion makes of
// them. Each coerced text must be read by PostgreSQL (checked below).
var refusedByPostgres = []struct {
	name string
	v    any
	typ  string
	want coercion
}{
	// numeric: PostgreSQL keeps the written scale (digits after the point
	// minus the exponent), at most 16383, and at most 131072 digits before
	// the point.
	{"zero with a huge negative exponent", json.Number("0e-99999"), "numeric", coercion{text: "0", reason: reasonNormalizedNumber}},
	{"zero with a huge negative exponent in a string", "-0.0E-20000", "numeric", coercion{text: "0", reason: reasonNormalizedNumber}},
	{"trailing zeros past the scale limit", json.Number("1." + strings.Repeat("0", 20000)), "numeric", coercion{text: "1", reason: reasonNormalizedNumber}},
	{"exponent that cancels the fraction", json.Number("1234" + strings.Repeat("0", 16380) + "e-16384"), "numeric", coercion{text: "0.1234", reason: reasonNormalizedNumber}},
	{"zero with an exponent past 2^30", json.Number("0e1073741824"), "numeric", coercion{text: "0", reason: reasonNormalizedNumber}},
	{"value with too many decimal places", json.Number("1e-16384"), "numeric", coercion{fail: failOutOfRange}},
	{"value too large", json.Number("1000e131069"), "numeric", coercion{fail: failOutOfRange}},
	{"smallest scale accepted as written", json.Number("1e-16383"), "numeric", coercion{text: "1e-16383"}},
	{"largest value accepted as written", json.Number("9.9e131071"), "numeric", coercion{text: "9.9e131071"}},

	// timestamptz: PostgreSQL reads UTC offsets up to ±15:59 and minutes
	// below 60; Go also reads +16:00 to +24:00 and a minute 60.
	{"offset +16:00", "2024-03-01T10:20:30+16:00", "timestamptz", coercion{text: "2024-02-29T18:20:30Z", reason: reasonOffsetToUTC}},
	{"offset -24:00", "2024-03-01T10:20:30.5-24:00", "timestamptz", coercion{text: "2024-03-02T10:20:30.5Z", reason: reasonOffsetToUTC}},
	{"offset minute 60", "2024-03-01T10:20:30+01:60", "timestamptz", coercion{text: "2024-03-01T08:20:30Z", reason: reasonOffsetToUTC}},
	{"offset minute 60 without colon", "2024-03-01T10:20:30-0060", "timestamptz", coercion{text: "2024-03-01T11:20:30Z", reason: reasonOffsetToUTC}},
	{"offset -15:59 as written", "2024-03-01T10:20:30-15:59", "timestamptz", coercion{text: "2024-03-01T10:20:30-15:59"}},

	// jsonb: numbers are numerics; unpaired surrogates are refused.
	{"jsonb number PostgreSQL cannot hold", rawJSON(`{"n":1e-99999}`), "jsonb", coercion{fail: failOutOfRange}},
	{"jsonb number written out", rawJSON(`{"n":0e-99999,"m":[1.5e2]}`), "jsonb", coercion{text: `{"m":[1.5e2],"n":0}`, reason: reasonNormalizedJSON}},
	{"jsonb unpaired surrogate", rawJSON(`["\ud800","\uDC00x","ok \ud83d\ude00"]`), "jsonb", coercion{text: "[\"\uFFFD\",\"\uFFFDx\",\"ok 😀\"]", reason: reasonNormalizedJSON}},
}

func TestCoerceWhatPostgreSQLRefuses(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	for _, tt := range refusedByPostgres {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := coerce(tt.v, tt.typ, "")
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(coercion{})); diff != "" {
				t.Errorf("coerce(%.60v, %s) (-want +got):\n%.2000s", tt.v, tt.typ, diff)
			}
			if got.fail != "" {
				return
			}
			var n int
			err := pool.QueryRow(t.Context(), `SELECT count(r.c::`+tt.typ+`) FROM unnest($1::text[]) AS r(c)`, []string{got.text}).Scan(&n)
			if err != nil {
				t.Errorf("PostgreSQL refuses the coerced text as %s: %v", tt.typ, err)
			}
		})
	}
}

// TestMappingStoresWhatPostgreSQLRefuses: with on_error null (the default)
// a value PostgreSQL refuses is coerced or nulled and recorded; the
// document is written, it does not go to the DLQ. The data-quality record
// keeps the original even when jsonb cannot hold it as written. (Unpaired
// surrogates read as U+FFFD in every column, as encoding/json reads them,
// without a record.)
func TestMappingStoresWhatPostgreSQLRefuses(t *testing.T) {
	t.Parallel()
	m := &config.Mapping{Tables: []*config.MappedTable{
		{Name: "hostile", Columns: []*config.MappedColumn{
			{Name: "amount", Path: "amount", Type: "numeric"},
			{Name: "tiny", Path: "tiny", Type: "numeric"},
			{Name: "at", Path: "at", Type: "timestamptz"},
			{Name: "extra", Path: "extra", Type: "jsonb"},
			{Name: "names", Path: "names", Type: "jsonb"},
		}},
	}}
	s, pool, _ := newMappedSink(t, nil, m)
	c := delivertest.Live("h1", "1-h1", v(1, 1))
	c.Doc = json.RawMessage(`{"amount":0e-99999,"tiny":1e-99999,"at":"2024-03-01T10:20:30+16:00","extra":{"n":1e-99999},"names":["\ud800"]}`)
	if err := s.Apply(t.Context(), []*change.Envelope{c})[0]; err != nil {
		t.Fatalf("apply: %v", err)
	}

	var amount, tiny, at, extra, names *string
	err := pool.QueryRow(t.Context(), `SELECT amount::text, tiny::text, (at AT TIME ZONE 'UTC')::text, extra::text, names::text FROM `+
		s.mapping.tables[0].ident+` WHERE doc_id = 'h1'`).Scan(&amount, &tiny, &at, &extra, &names)
	if err != nil {
		t.Fatal(err)
	}
	str := func(p *string) string {
		if p == nil {
			return "NULL"
		}
		return *p
	}
	got := []string{str(amount), str(tiny), str(at), str(extra), str(names)}
	want := []string{"0", "NULL", "2024-02-29 18:20:30", "NULL", `["` + "\uFFFD" + `"]`}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stored amount, tiny, at, extra, names (-want +got):\n%s", diff)
	}

	rows, err := pool.Query(t.Context(), `SELECT column_name, original::text, coalesce(stored, 'NULL'), reason FROM `+s.mapping.quality+` ORDER BY column_name`)
	if err != nil {
		t.Fatal(err)
	}
	var records []string
	for rows.Next() {
		var col, orig, stored, reason string
		if err := rows.Scan(&col, &orig, &stored, &reason); err != nil {
			t.Fatal(err)
		}
		records = append(records, strings.Join([]string{col, orig, stored, reason}, " | "))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	wantRecords := []string{
		`hostile.amount | 0 | 0 | normalized_number`,
		`hostile.at | "2024-03-01T10:20:30+16:00" | 2024-02-29T18:20:30Z | offset_converted_to_utc`,
		`hostile.extra | {"n": "1e-99999"} | NULL | out_of_range`,
		`hostile.tiny | "1e-99999" | NULL | out_of_range`,
	}
	if diff := cmp.Diff(wantRecords, records); diff != "" {
		t.Errorf("data-quality records (-want +got):\n%s", diff)
	}
}
