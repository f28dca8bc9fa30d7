package config

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestUnknownKeysEveryOne: every misspelt key is reported at once, under the
// key of the object holding it, a key in another case too, with the
// problems Validate finds.
func TestUnknownKeysEveryOne(t *testing.T) {
	t.Parallel()
	_, err := Parse([]byte(`{"stack":{"prefx":"x","Retain":false},"jobz":1,"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db","auht":{}},
		"feed":{"limitt":5},"outputs":[{"id":"p","type":"postgres","postgres":{"dsn":{"env":"D"},"mapping":{"tables":[{"name":"t","columns":[{"name":"c","path":"c","type":"text","nullable":true}]}]}}},
		{"type":"s3","s3":{"buckt":"b"}}]}]}`))
	var got []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		got = append(got, e.Error())
	}
	want := []string{
		`jobs[a].feed: unknown field "limitt"`,
		`jobs[a].outputs[p].postgres.mapping.tables[0].columns[0]: unknown field "nullable"`,
		`jobs[a].outputs[1].s3: unknown field "buckt"`,
		`jobs[a].source: unknown field "auht"`,
		`unknown field "jobz"`,
		`stack: unknown field "Retain", did you mean "retain"? (keys are case-sensitive)`,
		`stack: unknown field "prefx"`,
		`jobs[a].outputs[1].id: "" must be 1-32 lowercase letters, digits or '-'`,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("errors (-want +got):\n%s", d)
	}
	if errors.Unwrap(err) != nil {
		t.Errorf("error wraps one error, want a list")
	}
}
