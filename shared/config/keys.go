package config

import (
	"encoding/json"
	"reflect"
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

// Types whose values the key walkers do not enter as structs: they decode
// themselves.
var (
	durationType    = reflect.TypeFor[Duration]()
	headerValueType = reflect.TypeFor[HeaderValue]()
	rawMessageType  = reflect.TypeFor[json.RawMessage]()
)

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
