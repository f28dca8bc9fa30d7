package deliver

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestEqualJSON(t *testing.T) {
	t.Parallel()
	// Numbers are equal here when their text is, so that the cases show
	// which comparisons reach sameNumber.
	sameText := func(a, b json.Number) bool { return a == b }
	tests := []struct {
		a, b string
		want bool
	}{
		{`{"a":1,"b":[true,null,"x"]}`, `{"b":[true,null,"x"],"a":1}`, true},
		{`{"a":1}`, `{"a":1,"b":2}`, false},
		{`{"a":1}`, `{"b":1}`, false},
		{`[1,2]`, `[2,1]`, false},
		{`[1,2]`, `[1,2,3]`, false},
		{`1`, `1`, true},
		{`1`, `1.0`, false},
		{`1`, `"1"`, false},
		{`"a"`, `"a"`, true},
		{`"a"`, `"b"`, false},
		{`true`, `false`, false},
		{`null`, `null`, true},
		{`null`, `false`, false},
		{`{}`, `[]`, false},
		{`[{"a":[1]}]`, `[{"a":[1]}]`, true},
		{`[{"a":[1]}]`, `[{"a":[2]}]`, false},
	}
	for _, tt := range tests {
		t.Run(tt.a+" "+tt.b, func(t *testing.T) {
			t.Parallel()
			if got := EqualJSON(decode(t, tt.a), decode(t, tt.b), sameText); got != tt.want {
				t.Errorf("EqualJSON(%s, %s) = %v, want %v", tt.a, tt.b, got, tt.want)
			}
			if got := EqualJSON(decode(t, tt.b), decode(t, tt.a), sameText); got != tt.want {
				t.Errorf("EqualJSON(%s, %s) = %v, want %v", tt.b, tt.a, got, tt.want)
			}
		})
	}
}

func decode(t *testing.T, s string) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %s: %v", s, err)
	}
	return v
}
