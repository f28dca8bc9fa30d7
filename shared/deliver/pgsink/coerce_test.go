package pgsink

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

func TestCoerce(t *testing.T) {
	t.Parallel()
	num := func(s string) json.Number { return json.Number(s) }
	tests := []struct {
		name  string
		v     any
		typ   string
		epoch string
		want  coercion
	}{
		{"text as is", "hello", "text", "", coercion{text: "hello"}},
		{"number as text", num("12.50"), "text", "", coercion{text: "12.50", reason: reasonNumberAsText}},
		{"boolean as text", true, "text", "", coercion{text: "true", reason: reasonBooleanAsText}},
		{"object as text", map[string]any{"b": "<x>", "a": num("1")}, "text", "", coercion{text: `{"a":1,"b":"<x>"}`, reason: reasonJSONAsText}},
		{"nul in text", "a\x00b", "text", "", coercion{fail: failNUL}},

		{"integer", num("42"), "integer", "", coercion{text: "42"}},
		{"negative bigint", num("-9223372036854775808"), "bigint", "", coercion{text: "-9223372036854775808"}},
		{"integral float", num("42.0"), "integer", "", coercion{text: "42", reason: reasonIntegralNumber}},
		{"integral exponent", num("4.2e1"), "bigint", "", coercion{text: "42", reason: reasonIntegralNumber}},
		{"string integer", " 42 ", "integer", "", coercion{text: "42", reason: reasonParsedString}},
		{"string integral float", "7.000", "bigint", "", coercion{text: "7", reason: reasonParsedString}},
		{"fraction", num("42.5"), "integer", "", coercion{fail: failNotInteger}},
		{"integer overflow", num("2147483648"), "integer", "", coercion{fail: failOutOfRange}},
		{"bigint overflow", num("9223372036854775808"), "bigint", "", coercion{fail: failOutOfRange}},
		{"huge exponent", num("1e999999999999"), "bigint", "", coercion{fail: failOutOfRange}},
		{"tiny exponent", num("1e-999999999999"), "bigint", "", coercion{fail: failNotInteger}},
		{"zero with exponent", num("0e-5"), "integer", "", coercion{text: "0", reason: reasonIntegralNumber}},
		{"word into integer", "forty-two", "integer", "", coercion{fail: failNotNumber}},
		{"boolean into integer", true, "integer", "", coercion{fail: failNotNumber}},
		{"hex is not a number", "0x10", "bigint", "", coercion{fail: failNotNumber}},

		{"numeric", num("12.50"), "numeric", "", coercion{text: "12.50"}},
		{"numeric exponent", num("1.5e3"), "numeric", "", coercion{text: "1.5e3"}},
		{"string numeric", "-0.25", "numeric", "", coercion{text: "-0.25", reason: reasonParsedString}},
		{"NaN string", "NaN", "numeric", "", coercion{fail: failNotNumber}},
		{"numeric out of range", num("1e200000"), "numeric", "", coercion{fail: failOutOfRange}},

		{"boolean", false, "boolean", "", coercion{text: "false"}},
		{"string boolean", "TRUE", "boolean", "", coercion{text: "true", reason: reasonParsedString}},
		{"one", num("1"), "boolean", "", coercion{text: "true", reason: reasonNumberAsBool}},
		{"two", num("2"), "boolean", "", coercion{fail: failNotBoolean}},
		{"yes", "yes", "boolean", "", coercion{fail: failNotBoolean}},

		{"rfc 3339", "2024-03-01T10:20:30Z", "timestamptz", "", coercion{text: "2024-03-01T10:20:30Z"}},
		{"offset kept as written", "2024-03-01T10:20:30.5+02:00", "timestamptz", "", coercion{text: "2024-03-01T10:20:30.5+02:00"}},
		{"offset without colon", "2024-03-01T10:20:30+0200", "timestamptz", "", coercion{text: "2024-03-01T10:20:30+0200"}},
		{"space separator", "2024-03-01 10:20:30z", "timestamptz", "", coercion{text: "2024-03-01T10:20:30Z"}},
		{"offset in hours", "2024-03-01T10:20:30-05", "timestamptz", "", coercion{text: "2024-03-01T10:20:30-05"}},
		{"decimal comma", "2024-03-01T10:20:30,25Z", "timestamptz", "", coercion{text: "2024-03-01T10:20:30.25Z"}},
		{"nanoseconds", "2024-03-01T10:20:30.1234567Z", "timestamptz", "", coercion{text: "2024-03-01T10:20:30.123457Z", reason: reasonRounded}},
		{"no offset", "2024-03-01T10:20:30", "timestamptz", "", coercion{text: "2024-03-01T10:20:30Z", reason: reasonAssumedUTC}},
		{"no seconds", "2024-03-01T10:20", "timestamptz", "", coercion{text: "2024-03-01T10:20:00Z", reason: reasonAssumedUTC}},
		{"date", "2024-03-01", "timestamptz", "", coercion{text: "2024-03-01T00:00:00Z", reason: reasonDateOnly}},
		{"guessed seconds", num("1709288430"), "timestamptz", "", coercion{text: "2024-03-01T10:20:30Z", reason: reasonEpochSeconds}},
		{"guessed milliseconds", num("1709288430250"), "timestamptz", "", coercion{text: "2024-03-01T10:20:30.25Z", reason: reasonEpochMillis}},
		{"configured seconds", num("1709288430.5"), "timestamptz", "s", coercion{text: "2024-03-01T10:20:30.5Z"}},
		{"configured milliseconds", num("1709288430250"), "timestamptz", "ms", coercion{text: "2024-03-01T10:20:30.25Z"}},
		{"milliseconds before 1973 when configured", num("86400000"), "timestamptz", "ms", coercion{text: "1970-01-02T00:00:00Z"}},
		{"negative epoch", num("-1"), "timestamptz", "s", coercion{text: "1969-12-31T23:59:59Z"}},
		{"epoch in a string", "1709288430", "timestamptz", "s", coercion{text: "2024-03-01T10:20:30Z", reason: reasonParsedString}},
		{"sub-microsecond epoch", num("1.0000004"), "timestamptz", "s", coercion{text: "1970-01-01T00:00:01Z", reason: reasonRounded}},
		{"epoch past 9999", num("1e20"), "timestamptz", "ms", coercion{fail: failOutOfRange}},
		{"year zero", "0000-01-01T00:00:00Z", "timestamptz", "", coercion{fail: failOutOfRange}},
		{"not a time", "yesterday", "timestamptz", "", coercion{fail: failNotTimestamp}},
		{"boolean time", true, "timestamptz", "", coercion{fail: failNotTimestamp}},

		{"jsonb object", map[string]any{"z": []any{num("1"), "<"}, "a": nil}, "jsonb", "", coercion{text: `{"a":null,"z":[1,"<"]}`}},
		{"jsonb string", "s", "jsonb", "", coercion{text: `"s"`}},
		{"jsonb nul", []any{"a\x00"}, "jsonb", "", coercion{fail: failNUL}},

		{"uuid", "0B4E9B8C-1D2E-4F3A-8B7C-6D5E4F3A2B1C", "uuid", "", coercion{text: "0b4e9b8c-1d2e-4f3a-8b7c-6d5e4f3a2b1c"}},
		{"uuid braces", "{0b4e9b8c-1d2e-4f3a-8b7c-6d5e4f3a2b1c}", "uuid", "", coercion{text: "0b4e9b8c-1d2e-4f3a-8b7c-6d5e4f3a2b1c", reason: reasonNormalizedUUID}},
		{"uuid urn", "urn:uuid:0b4e9b8c-1d2e-4f3a-8b7c-6d5e4f3a2b1c", "uuid", "", coercion{text: "0b4e9b8c-1d2e-4f3a-8b7c-6d5e4f3a2b1c", reason: reasonNormalizedUUID}},
		{"uuid without hyphens", "0b4e9b8c1d2e4f3a8b7c6d5e4f3a2b1c", "uuid", "", coercion{text: "0b4e9b8c-1d2e-4f3a-8b7c-6d5e4f3a2b1c", reason: reasonNormalizedUUID}},
		{"uuid bad digit", "0b4e9b8c-1d2e-4f3a-8b7c-6d5e4f3a2b1g", "uuid", "", coercion{fail: failNotUUID}},
		{"uuid hyphens misplaced", "0b4e9b8c1-d2e-4f3a-8b7c-6d5e4f3a2b1c", "uuid", "", coercion{fail: failNotUUID}},
		{"uuid number", num("1"), "uuid", "", coercion{fail: failNotUUID}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := coerce(tt.v, tt.typ, tt.epoch)
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(coercion{})); diff != "" {
				t.Errorf("coerce(%#v, %s) (-want +got):\n%s", tt.v, tt.typ, diff)
			}
		})
	}
}

// TestCoercedTextParses checks that PostgreSQL reads every coerced text as
// the value the coercion meant, through the same casts the statements use.
func TestCoercedTextParses(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	tests := []struct {
		typ, text, want string // want: the value cast back to text (timestamps in UTC)
	}{
		{"numeric", "1.5e3", "1500"},
		{"numeric", "+.5", "0.5"},
		{"numeric", "-5.", "-5"},
		{"integer", "-2147483648", "-2147483648"},
		{"timestamptz", "2024-03-01T08:20:30.5Z", "2024-03-01 08:20:30.5"},
		{"timestamptz", "2024-03-01T10:20:30.5+02:00", "2024-03-01 08:20:30.5"},
		{"timestamptz", "2024-03-01T10:20:30+0200", "2024-03-01 08:20:30"},
		{"timestamptz", "2024-03-01T10:20:30-05", "2024-03-01 15:20:30"},
		{"timestamptz", "2024-03-01T10:20:30.123456-0130", "2024-03-01 11:50:30.123456"},
		{"timestamptz", "0001-01-01T00:00:00Z", "0001-01-01 00:00:00"},
		{"timestamptz", "9999-12-31T23:59:59.999999Z", "9999-12-31 23:59:59.999999"},
		{"uuid", "0b4e9b8c-1d2e-4f3a-8b7c-6d5e4f3a2b1c", "0b4e9b8c-1d2e-4f3a-8b7c-6d5e4f3a2b1c"},
		{"jsonb", `{"a":null,"z":[1,"<"]}`, `{"a": null, "z": [1, "<"]}`},
		{"boolean", "true", "true"},
	}
	for _, tt := range tests {
		t.Run(tt.typ+" "+tt.text, func(t *testing.T) {
			t.Parallel()
			expr := "r.c::" + tt.typ
			if tt.typ == "timestamptz" {
				expr += " AT TIME ZONE 'UTC'" // whatever the session's zone
			}
			var got string
			err := pool.QueryRow(t.Context(), `SELECT (`+expr+`)::text FROM unnest($1::text[]) AS r(c)`, []string{tt.text}).Scan(&got)
			if err != nil {
				t.Fatalf("cast %q to %s: %v", tt.text, tt.typ, err)
			}
			if got != tt.want {
				t.Errorf("%q::%s = %q, want %q", tt.text, tt.typ, got, tt.want)
			}
		})
	}
}

func TestJSONEqual(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a, b string
		want bool
	}{
		{`"order"`, `"order"`, true},
		{`"order"`, `"Order"`, false},
		{`1`, `1.0`, true},
		{`1`, `1e0`, true},
		{`100`, `1e2`, true},
		{`0`, `-0.0`, true},
		{`1`, `"1"`, false},
		{`{"a":[1,{"b":true}],"c":null}`, `{"c":null,"a":[1.0,{"b":true}]}`, true},
		{`{"a":1}`, `{"a":1,"b":2}`, false},
		{`[1,2]`, `[2,1]`, false},
		{`null`, `false`, false},
	}
	for _, tt := range tests {
		a, err := decodeDoc([]byte(tt.a))
		if err != nil {
			t.Fatal(err)
		}
		b, err := decodeDoc([]byte(tt.b))
		if err != nil {
			t.Fatal(err)
		}
		if got := jsonEqual(a, b); got != tt.want {
			t.Errorf("jsonEqual(%s, %s) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}
