package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// field is one key of a configuration object: its name in the file, the
// Go type its value decodes to and the index of its struct field.
type field struct {
	name  string
	typ   reflect.Type
	index int
}

// fields lists the keys of the object struct type t decodes, in the order
// of t's fields.
func fields(t reflect.Type) []field {
	var out []field
	for i := range t.NumField() {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if name == "" || name == "-" || !sf.IsExported() {
			continue
		}
		out = append(out, field{name: name, typ: sf.Type, index: i})
	}
	return out
}

// Types whose values the key walkers do not enter: they decode themselves.
var (
	durationType    = reflect.TypeFor[Duration]()
	headerValueType = reflect.TypeFor[HeaderValue]()
	rawMessageType  = reflect.TypeFor[json.RawMessage]()
)

// unknownKeys reports every key of doc, a decoded JSON value of Go type t
// at key p, that names no setting, each under the key of the object that
// holds it. A key matches a setting as encoding/json matches it, ignoring
// case. Values of the wrong JSON type are left to the decoder to report.
func unknownKeys(p string, doc any, t reflect.Type) []error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == durationType || t == headerValueType || t == rawMessageType {
		return nil
	}
	var errs []error
	switch t.Kind() {
	case reflect.Struct:
		obj, _ := doc.(map[string]any)
		known := fields(t)
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			i := slices.IndexFunc(known, func(f field) bool { return strings.EqualFold(f.name, k) })
			if i < 0 {
				errs = append(errs, fmt.Errorf("%sunknown field %q", keyPrefix(p), k))
				continue
			}
			errs = append(errs, unknownKeys(joinKey(p, known[i].name), obj[k], known[i].typ)...)
		}
	case reflect.Slice:
		list, _ := doc.([]any)
		for i, e := range list {
			obj, _ := e.(map[string]any)
			id, _ := obj["id"].(string)
			errs = append(errs, unknownKeys(item(p, i, id), e, t.Elem())...)
		}
	case reflect.Map:
		obj, _ := doc.(map[string]any)
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			errs = append(errs, unknownKeys(fmt.Sprintf("%s[%s]", p, k), obj[k], t.Elem())...)
		}
	}
	return errs
}

// joinKey is key k of the object at key p.
func joinKey(p, k string) string {
	if p == "" {
		return k
	}
	return p + "." + k
}

// keyPrefix starts an error about the object at key p: "p: ", or nothing
// for the whole file.
func keyPrefix(p string) string {
	if p == "" {
		return ""
	}
	return p + ": "
}
