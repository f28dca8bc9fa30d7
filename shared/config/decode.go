package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The file is read in two passes. The first reads it as plain JSON (objects,
// lists, strings, numbers, true, false, null), stopping at the first syntax
// error with its line and column. The second walks that value against the
// types of File by their json tags and reports, each under its key in the
// file's own terms, every value of the wrong type, unknown key, key in
// another case, key given twice and 0 written where leaving the key out
// gives something else; it drops what it reports, so that the file can be
// decoded all the same and checked for the rest.

// object is a JSON object as the file has it.
type object struct {
	members map[string]any
	// lines are the lines each key is on, one per time it is given.
	lines map[string][]int
}

// MarshalJSON writes the members.
func (o *object) MarshalJSON() ([]byte, error) { return json.Marshal(o.members) }

// source is the file being read: its text, with comments blanked out, and
// where its lines start in it.
type source struct {
	text   []byte // as written
	json   []byte // comments blanked: the same length, the same lines
	starts []int  // offset of each line's first byte
}

// newSource reads b; a /* comment never closed is its error.
func newSource(b []byte) (*source, error) {
	s := &source{text: b, starts: []int{0}}
	for i, c := range b {
		if c == '\n' {
			s.starts = append(s.starts, i+1)
		}
	}
	var open int
	s.json, open = stripComments(b)
	if open >= 0 {
		return nil, fmt.Errorf("syntax error at %s: this /* comment is never closed with */", s.position(open))
	}
	return s, nil
}

// line is the line (from 1) of offset off.
func (s *source) line(off int) int {
	i, found := slices.BinarySearch(s.starts, off)
	if !found {
		i--
	}
	return i + 1
}

// position is "line L, column C" of offset off, the column counted in
// characters from 1.
func (s *source) position(off int) string {
	l := s.line(off)
	start := s.starts[l-1]
	return fmt.Sprintf("line %d, column %d", l, utf8.RuneCount(s.text[start:off])+1)
}

// read returns the file as plain JSON values: *object, []any, string,
// json.Number, bool or nil.
func (s *source) read() (any, error) {
	if len(bytes.TrimSpace(s.json)) == 0 {
		return nil, errors.New("the file holds no JSON object: it is empty or holds only comments")
	}
	var raw json.RawMessage
	if err := json.Unmarshal(s.json, &raw); err != nil {
		return nil, s.syntaxError(err)
	}
	dec := json.NewDecoder(bytes.NewReader(s.json))
	dec.UseNumber()
	return s.value(dec)
}

// syntaxError places err, json.Unmarshal's, in the file.
func (s *source) syntaxError(err error) error {
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		return fmt.Errorf("decode: %w", err)
	}
	if int(se.Offset) >= len(s.json) && strings.HasPrefix(se.Error(), "unexpected end") {
		return fmt.Errorf("syntax error at %s: the file ends before its JSON does (a {, [ or \" is not closed)", s.position(len(s.json)))
	}
	at := max(int(se.Offset)-1, 0) // the character that broke it
	hint := ""
	switch msg := se.Error(); {
	case s.json[at] == '}' || s.json[at] == ']':
		if before := bytes.TrimRight(s.json[:at], " \t\r\n"); len(before) > 0 && before[len(before)-1] == ',' {
			hint = " (remove the comma before it)"
		}
	case strings.HasSuffix(msg, "after object key:value pair") || strings.HasSuffix(msg, "after array element"):
		hint = " (is a comma missing before it?)"
	}
	return fmt.Errorf("syntax error at %s: %v%s", s.position(at), se, hint)
}

// value reads the next value of dec, which holds valid JSON.
func (s *source) value(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	switch tok {
	case json.Delim('{'):
		o := &object{members: map[string]any{}, lines: map[string][]int{}}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, fmt.Errorf("decode: %w", err)
			}
			key, _ := k.(string)
			o.lines[key] = append(o.lines[key], s.line(int(dec.InputOffset())))
			if o.members[key], err = s.value(dec); err != nil {
				return nil, err
			}
		}
		_, err := dec.Token() // '}'
		return o, err
	case json.Delim('['):
		list := []any{}
		for dec.More() {
			v, err := s.value(dec)
			if err != nil {
				return nil, err
			}
			list = append(list, v)
		}
		_, err := dec.Token() // ']'
		return list, err
	}
	return tok, nil
}

// checker walks the file's value against the types of File.
type checker struct {
	problems []error
	// dropped are the keys whose values were of the wrong type: checks of
	// the decoded file under them would only repeat the problem.
	dropped []string
	// zeros are the numbers written as 0.
	zeros []zero
}

// zero is a number written as 0: its key, and the path to its field from
// File (struct field and list indexes).
type zero struct {
	key string
	at  []int
}

// What keys of the kinds whose type says little take.
const (
	wantDuration  = `a duration: a string like "90s" or "1m30s", or a number of seconds`
	wantSecretRef = `a secret reference {"secret": NAME} or {"env": NAME}`
)

var secretRefType = reflect.TypeFor[SecretRef]()

// problem reports a problem of the value at key p.
func (c *checker) problem(p, format string, args ...any) {
	c.problems = append(c.problems, errors.New(keyPrefix(p)+fmt.Sprintf(format, args...)))
}

// wrong reports v, the value at key p, as not what p takes, and returns
// false: the caller drops it.
func (c *checker) wrong(p string, v any, want string) bool {
	c.drop(p, "%s, want %s", kind(v), want)
	return false
}

// drop reports a problem of the value at key p, which the caller drops.
func (c *checker) drop(p, format string, args ...any) {
	if p == "" {
		c.problems = append(c.problems, errors.New("the file: "+fmt.Sprintf(format, args...)))
		return
	}
	c.problem(p, format, args...)
	c.dropped = append(c.dropped, p)
}

// kind describes a value without quoting it: a string may be a secret.
func kind(v any) string {
	switch v := v.(type) {
	case *object:
		return "an object"
	case []any:
		return "a list"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return strconv.FormatBool(v)
	}
	return "null"
}

// value checks v, the value at key p, against t, the type it decodes to;
// at is where it lands from File, nil where no 0 is looked for. It returns
// false when v is to be dropped.
func (c *checker) value(p string, at []int, v any, t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if v == nil {
		return true // null: as if the key were left out
	}
	switch t {
	case rawMessageType:
		return true
	case durationType:
		return c.duration(p, v)
	case headerValueType:
		if o, ok := v.(*object); ok {
			c.object(p, nil, o, secretRefType)
			return true
		}
		if _, ok := v.(string); !ok {
			return c.wrong(p, v, "a string or "+wantSecretRef)
		}
		return true
	case secretRefType:
		if _, ok := v.(string); ok {
			return c.wrong(p, v, wantSecretRef+" (the value itself goes in Secrets Manager or an environment variable, never in this file)")
		}
	}
	switch t.Kind() {
	case reflect.Struct:
		o, ok := v.(*object)
		if !ok {
			return c.wrong(p, v, "an object")
		}
		c.object(p, at, o, t)
	case reflect.Map:
		o, ok := v.(*object)
		if !ok {
			return c.wrong(p, v, "an object")
		}
		for _, k := range slices.Sorted(maps.Keys(o.members)) {
			kp := fmt.Sprintf("%s[%s]", p, k)
			c.once(kp, o.lines[k])
			if !c.value(kp, nil, o.members[k], t.Elem()) {
				delete(o.members, k)
			}
		}
	case reflect.Slice:
		list, ok := v.([]any)
		if !ok {
			return c.wrong(p, v, "a list")
		}
		for i, e := range list {
			id := ""
			if o, ok := e.(*object); ok {
				id, _ = o.members["id"].(string)
			}
			if !c.value(item(p, i, id), step(at, i), e, t.Elem()) {
				list[i] = nil
			}
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			return c.wrong(p, v, "a string")
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			return c.wrong(p, v, "true or false")
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := v.(json.Number)
		if !ok {
			return c.wrong(p, v, "a whole number")
		}
		i, err := strconv.ParseInt(string(n), 10, t.Bits())
		if errors.Is(err, strconv.ErrRange) {
			c.drop(p, "%s, want a whole number between %d and %d", n, int64(-1)<<(t.Bits()-1), int64(uint64(math.MaxUint64)>>(65-t.Bits())))
			return false
		}
		if err != nil {
			c.drop(p, "%s, want a whole number", n)
			return false
		}
		if i == 0 {
			c.zero(p, at)
		}
	case reflect.Float32, reflect.Float64:
		n, ok := v.(json.Number)
		if !ok {
			return c.wrong(p, v, "a number")
		}
		f, err := strconv.ParseFloat(string(n), t.Bits())
		if err != nil {
			limit := math.MaxFloat64
			if t.Bits() == 32 {
				limit = math.MaxFloat32
			}
			c.drop(p, "%s, want a number between %g and %g", n, -limit, limit)
			return false
		}
		if f == 0 {
			c.zero(p, at)
		}
	}
	return true
}

// object checks o, the object at key p, against the struct type t: every
// key must be one of t's, written as t writes it; a key in another case is
// reported and read as the key it resembles, unless that is given too.
func (c *checker) object(p string, at []int, o *object, t reflect.Type) {
	known := fields(t)
	for _, k := range slices.Sorted(maps.Keys(o.members)) {
		v := o.members[k]
		i := slices.IndexFunc(known, func(f field) bool { return f.name == k })
		if i < 0 {
			delete(o.members, k)
			i = slices.IndexFunc(known, func(f field) bool { return strings.EqualFold(f.name, k) })
			if i < 0 {
				c.problem(p, "unknown field %q", k)
				continue
			}
			c.problem(p, "unknown field %q, did you mean %q? (keys are case-sensitive)", k, known[i].name)
			name := known[i].name
			if _, given := o.members[name]; given {
				continue
			}
			o.members[name], o.lines[name] = v, o.lines[k]
			k = name
		}
		f := known[i]
		key := joinKey(p, f.name)
		c.once(key, o.lines[k])
		if !c.value(key, step(at, f.index), v, f.typ) {
			delete(o.members, k)
		}
	}
}

// duration checks v, the value at key p of a Duration.
func (c *checker) duration(p string, v any) bool {
	switch v := v.(type) {
	case string:
		if _, err := time.ParseDuration(v); err != nil {
			c.drop(p, "%q, want %s", v, wantDuration)
			return false
		}
		return true
	case json.Number:
		if _, err := strconv.ParseFloat(string(v), 64); err != nil {
			c.drop(p, "%s, want %s", v, wantDuration)
			return false
		}
		return true
	}
	return c.wrong(p, v, wantDuration)
}

// once reports a key given more than once, with the lines it is on.
func (c *checker) once(p string, lines []int) {
	if len(lines) < 2 {
		return
	}
	s := make([]string, len(lines))
	for i, l := range lines {
		s[i] = strconv.Itoa(l)
	}
	c.problem(p, "given %d times (lines %s and %s): give it once", len(lines), strings.Join(s[:len(s)-1], ", "), s[len(s)-1])
}

// zero notes a number written as 0 at key p, where at says.
func (c *checker) zero(p string, at []int) {
	if at != nil {
		c.zeros = append(c.zeros, zero{key: p, at: at})
	}
}

// step is the path at, then index i; nil when at is.
func step(at []int, i int) []int {
	if at == nil {
		return nil
	}
	return append(slices.Clip(at), i)
}

// zeroProblems reports the numbers written as 0 whose keys, left out, get
// another value: what f, defaulted, holds there. A 0 would silently become
// it; where the default is 0 itself, 0 is taken.
func (c *checker) zeroProblems(f *File) []error {
	var errs []error
	for _, z := range c.zeros {
		if v, ok := fieldAt(reflect.ValueOf(f).Elem(), z.at); ok && !v.IsZero() {
			errs = append(errs, fmt.Errorf("%s: "+zeroRefused, z.key, fmt.Sprint(v.Interface())))
		}
	}
	return errs
}

// fieldAt is the field of v at path at (struct field and list indexes).
func fieldAt(v reflect.Value, at []int) (reflect.Value, bool) {
	for _, i := range at {
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return reflect.Value{}, false
			}
			v = v.Elem()
		}
		switch {
		case v.Kind() == reflect.Struct:
			v = v.Field(i)
		case v.Kind() == reflect.Slice && i < v.Len():
			v = v.Index(i)
		default:
			return reflect.Value{}, false
		}
	}
	return v, true
}

// covers reports whether err, a check of the decoded file, is about a key
// whose value was dropped, and so repeats a problem already reported.
func (c *checker) covers(err error) bool {
	s := err.Error()
	for _, k := range c.dropped {
		if rest, ok := strings.CutPrefix(s, k); ok && rest != "" && strings.ContainsRune(":.[", rune(rest[0])) {
			return true
		}
	}
	return false
}
