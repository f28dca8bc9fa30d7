package deliver

import "encoding/json"

// EqualJSON reports whether a and b, decoded by encoding/json with
// UseNumber, are the same JSON value: objects with the same members whatever
// their order, arrays with the same elements in order, equal strings,
// booleans and nulls, and numbers that sameNumber says are equal. Sinks
// compare what they stored with a source body this way; each decides what
// equal numbers are in its storage.
func EqualJSON(a, b any, sameNumber func(a, b json.Number) bool) bool {
	switch a := a.(type) {
	case nil, bool, string:
		return a == b
	case json.Number:
		bn, ok := b.(json.Number)
		return ok && sameNumber(a, bn)
	case []any:
		bs, ok := b.([]any)
		if !ok || len(a) != len(bs) {
			return false
		}
		for i := range a {
			if !EqualJSON(a[i], bs[i], sameNumber) {
				return false
			}
		}
		return true
	case map[string]any:
		bm, ok := b.(map[string]any)
		if !ok || len(a) != len(bm) {
			return false
		}
		for k, v := range a {
			w, ok := bm[k]
			if !ok || !EqualJSON(v, w, sameNumber) {
				return false
			}
		}
		return true
	}
	return false
}
