package config

import (
	"flag"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md from the code")

// referenceDoc is the configuration reference writeReference writes.
const referenceDoc = "../../docs/configuration.md"

// TestReferenceDoc: docs/configuration.md is what writeReference writes
// (make lint runs this test). Regenerate it with -update.
func TestReferenceDoc(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	if err := writeReference(&b); err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(referenceDoc, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(referenceDoc)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(strings.Split(b.String(), "\n"), strings.Split(string(got), "\n")); d != "" {
		t.Errorf("%s differs from what the code generates (-generated +file); regenerate it: go test ./shared/config -run TestReferenceDoc -update\n%s", referenceDoc, d)
	}
}

// TestReferenceKeysDocumented: every key of the file has a meaning in
// keyDocs, and keyDocs documents no key the file does not have.
func TestReferenceKeysDocumented(t *testing.T) {
	t.Parallel()
	rows, docs := map[string]bool{}, keyDocs()
	for _, s := range reference() {
		for _, r := range s.rows {
			rows[r.path] = true
			if docs[r.path].meaning == "" {
				t.Errorf("key %s has no meaning in keyDocs", r.path)
			}
		}
	}
	for path := range docs {
		if !rows[path] {
			t.Errorf("keyDocs documents %s, which is no key of the file", path)
		}
	}
}

// TestReferenceDerivedDefaults: a default the sample's other keys change
// (ids, prefix, the order of the outputs) is written in keyDocs, since the
// sample's value would be wrong for other files.
func TestReferenceDerivedDefaults(t *testing.T) {
	t.Parallel()
	a, err := newRefSample("", "job", "", false)
	if err != nil {
		t.Fatal(err)
	}
	b, err := newRefSample("other", "other-job", "other-", true)
	if err != nil {
		t.Fatal(err)
	}
	docs := keyDocs()
	for _, s := range reference() {
		for _, r := range s.rows {
			if s.places != nil || docs[r.path].def != "" {
				continue
			}
			if da, db := a.defaultAt(r.path), b.defaultAt(r.path); da != db {
				t.Errorf("the default of %s depends on other keys (%s, %s): write it in keyDocs", r.path, da, db)
			}
		}
	}
}

// rangeAllowed matches an allowed range "min–max", alone or before a ';'.
var rangeAllowed = regexp.MustCompile(`^([0-9a-z.]+)–([0-9a-z.]+)(?:;|$)`)

// TestReferenceRanges: Validate accepts both ends of every integer and
// duration range the reference states, and refuses, naming the key, the
// values just outside it.
func TestReferenceRanges(t *testing.T) {
	t.Parallel()
	checked, docs := 0, keyDocs()
	for _, s := range reference() {
		for _, r := range s.rows {
			m := rangeAllowed.FindStringSubmatch(docs[r.path].allowed)
			if m == nil || s.places != nil {
				continue
			}
			checked++
			t.Run(r.path, func(t *testing.T) {
				t.Parallel()
				values, err := rangeValues(r.typ, m[1], m[2])
				if err != nil {
					t.Fatalf("allowed %q: %v", docs[r.path].allowed, err)
				}
				for i, v := range values {
					rs, err := newRefSample("", "job", "", false)
					if err != nil {
						t.Fatal(err)
					}
					sample := rs.defaulted
					field, key, ok := valueAt(reflect.ValueOf(sample), refKeys(r.path), "")
					if !ok {
						t.Fatalf("the sample has no %s", r.path)
					}
					field.Set(v.Convert(field.Type()))
					refused := false
					for _, err := range sample.problems() {
						refused = refused || strings.HasPrefix(err.Error(), key+":")
					}
					if inside := i < 2; refused == inside {
						t.Errorf("%s = %v: refused %v, want %v", key, v, refused, !inside)
					}
				}
			})
		}
	}
	if checked < 10 {
		t.Errorf("checked %d ranges, want the reference's (at least 10)", checked)
	}
}

// rangeValues are the ends of a range of the type typ ("integer" or
// "duration"), then the values just outside it.
func rangeValues(typ, lo, hi string) ([]reflect.Value, error) {
	switch typ {
	case "integer":
		a, err1 := strconv.ParseInt(lo, 10, 64)
		b, err2 := strconv.ParseInt(hi, 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("not integers: %v %v", err1, err2)
		}
		return []reflect.Value{reflect.ValueOf(a), reflect.ValueOf(b), reflect.ValueOf(a - 1), reflect.ValueOf(b + 1)}, nil
	case "duration":
		a, err1 := time.ParseDuration(lo)
		b, err2 := time.ParseDuration(hi)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("not durations: %v %v", err1, err2)
		}
		return []reflect.Value{reflect.ValueOf(a), reflect.ValueOf(b), reflect.ValueOf(a - time.Millisecond), reflect.ValueOf(b + time.Millisecond)}, nil
	}
	return nil, fmt.Errorf("a range of a %s", typ)
}
