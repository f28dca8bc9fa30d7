package pgsink

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/delivertest"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// jsonString encodes s as a JSON string.
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// fuzzMapping has a column of every type, all on_error null, and a child
// table, so that any document maps or fails for a stated reason.
var fuzzMapping = &config.Mapping{Tables: []*config.MappedTable{
	{Name: "root", Columns: []*config.MappedColumn{
		{Name: "t", Path: "t", Type: config.ColumnText},
		{Name: "i", Path: "i", Type: config.ColumnInteger},
		{Name: "b", Path: "b", Type: config.ColumnBigint},
		{Name: "n", Path: "n", Type: config.ColumnNumeric},
		{Name: "ok", Path: "ok", Type: config.ColumnBoolean},
		{Name: "at", Path: "at", Type: config.ColumnTimestamptz},
		{Name: "j", Path: "j", Type: config.ColumnJSONB},
		{Name: "u", Path: "u", Type: config.ColumnUUID},
		{Name: "odd", Path: `["a.b"][0]`, Type: config.ColumnText},
	}},
	{Name: "child", Parent: "root", From: "items", Columns: []*config.MappedColumn{
		{Name: "v", Path: "v", Type: config.ColumnNumeric},
		{Name: "top", Path: "$.t", Type: config.ColumnText},
	}},
}}

// FuzzMapDoc: mapping any body never panics; it fails only permanently,
// and what it maps can be written: no stored text holds U+0000 and every
// data-quality original is JSON that jsonb reads as written.
func FuzzMapDoc(f *testing.F) {
	s, err := configure(config.PostgresOutput{Table: "fuzz", Mapping: fuzzMapping}, "fuzz")
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(`{"t":"x","i":"42","b":4.2e1,"n":"0e-99999","ok":1,"at":"2024-03-01T10:20:30+16:00","j":{"n":1e-99999},"u":"{0b4e9b8c-1d2e-4f3a-8b7c-6d5e4f3a2b1c}","items":[{"v":1},{"v":"x"}]}`))
	f.Add([]byte(`{"t":{"k":"\u0000"},"j":["\ud800"],"at":1e20,"items":{"v":1}}`))
	f.Add([]byte(`{"a.b":["..", "\u0000"],"items":[null,1,[],{"v":{"x":1e131072}}]}`))
	for _, id := range testenv.HostileIDs() {
		q := jsonString(id)
		f.Add([]byte(`{"t":` + q + `,"n":` + q + `,"at":` + q + `,"j":` + q + `,"u":` + q + `,"items":[{"v":` + q + `}]}`))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		c := delivertest.Live("d", "1-a", delivertest.V(1, 1))
		c.Doc = body
		md, err := s.mapping.mapDoc(c)
		if err != nil {
			if e := deliver.Classify(err); e.Class != deliver.Permanent {
				t.Fatalf("mapping failed %s, want permanent: %v", e.Class, err)
			}
			return
		}
		for _, rows := range md.rows {
			for _, r := range rows {
				for _, v := range r.vals {
					if v.Valid && strings.IndexByte(v.String, 0) >= 0 {
						t.Fatalf("stored text %q holds U+0000", v.String)
					}
				}
			}
		}
		for _, rec := range md.records {
			if !json.Valid([]byte(rec.original)) || !jsonAsWrittenOK(rec.original) || hasNUL(rawValue(rawJSON(rec.original))) {
				t.Fatalf("record %s: original %.200q cannot be stored as jsonb", rec.column, rec.original)
			}
		}
	})
}

// FuzzCoerce: a coercion that succeeds gives a text PostgreSQL reads as the
// column type (checked on the real database); none panics.
func FuzzCoerce(f *testing.F) {
	pool := testenv.Postgres(f)
	types := []string{config.ColumnText, config.ColumnInteger, config.ColumnBigint, config.ColumnNumeric,
		config.ColumnBoolean, config.ColumnTimestamptz, config.ColumnJSONB, config.ColumnUUID}
	epochs := []string{"", config.EpochSeconds, config.EpochMillis}
	typeIndex := func(typ string) uint8 {
		for i, t := range types {
			if t == typ {
				return uint8(i)
			}
		}
		return 0
	}
	for _, tt := range refusedByPostgres {
		var raw string
		switch v := tt.v.(type) {
		case json.Number:
			raw = string(v)
		case string:
			raw = jsonString(v)
		case rawJSON:
			raw = string(v)
		}
		f.Add(typeIndex(tt.typ), []byte(raw), uint8(0))
	}
	for _, raw := range []string{`"2024-03-01 10:20:30z"`, `1709288430250`, `"1709288430.5"`, `-1`, `"0001-01-01T00:00:00Z"`, `"9999-12-31T23:59:59.9999995Z"`,
		`"urn:uuid:0b4e9b8c-1d2e-4f3a-8b7c-6d5e4f3a2b1c"`, `"-0.0"`, `"+.5"`, `9223372036854775807`, `"TRUE"`, `{"a":[1e2,"\u0000"]}`, `1e-7`} {
		for i := range types {
			f.Add(uint8(i), []byte(raw), uint8(1))
		}
	}
	for _, id := range testenv.HostileIDs() {
		f.Add(uint8(0), []byte(jsonString(id)), uint8(0))
		f.Add(typeIndex(config.ColumnJSONB), []byte(`{`+jsonString(id)+`:`+jsonString(id)+`}`), uint8(0))
	}
	f.Fuzz(func(t *testing.T, typ uint8, raw []byte, epoch uint8) {
		tape, err := parseTape(raw)
		if err != nil || tape.nodes[0].kind == 'n' {
			return
		}
		column := types[int(typ)%len(types)]
		var v any
		if column == config.ColumnJSONB {
			v = tape.raw(0)
		} else {
			v = tape.scalar(0)
		}
		co := coerce(v, column, epochs[int(epoch)%len(epochs)])
		if co.fail != "" {
			return
		}
		var n int
		if err := pool.QueryRow(t.Context(), `SELECT count(r.c::`+column+`) FROM unnest($1::text[]) AS r(c)`, []string{co.text}).Scan(&n); err != nil {
			t.Fatalf("coerce(%.100s, %s) = %.100q, which PostgreSQL refuses: %v", raw, column, co.text, err)
		}
	})
}
