package iampolicy

import (
	"fmt"
	"strconv"
	"strings"
)

// operator is a parsed condition operator.
type operator struct {
	set      string // "", "ForAllValues" or "ForAnyValue"
	base     string // e.g. StringLike
	ifExists bool
}

// Condition operators supported: each is compared value by value by its
// function; the negated ones are "not any of the positive".
var (
	positive = map[string]func(policy, request string) bool{
		"StringEquals":             func(p, r string) bool { return p == r },
		"StringEqualsIgnoreCase":   strings.EqualFold,
		"StringLike":               glob,
		"ArnEquals":                arnLike,
		"ArnLike":                  arnLike,
		"Bool":                     strings.EqualFold,
		"NumericEquals":            numeric(func(p, r float64) bool { return r == p }),
		"NumericLessThan":          numeric(func(p, r float64) bool { return r < p }),
		"NumericLessThanEquals":    numeric(func(p, r float64) bool { return r <= p }),
		"NumericGreaterThan":       numeric(func(p, r float64) bool { return r > p }),
		"NumericGreaterThanEquals": numeric(func(p, r float64) bool { return r >= p }),
	}
	negated = map[string]string{
		"StringNotEquals":           "StringEquals",
		"StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
		"StringNotLike":             "StringLike",
		"ArnNotEquals":              "ArnEquals",
		"ArnNotLike":                "ArnLike",
		"NumericNotEquals":          "NumericEquals",
	}
)

func parseOperator(s string) (operator, error) {
	op := operator{base: s}
	if set, rest, ok := strings.Cut(s, ":"); ok {
		if set != "ForAllValues" && set != "ForAnyValue" {
			return op, fmt.Errorf("condition operator %q: unknown qualifier %q", s, set)
		}
		op.set, op.base = set, rest
	}
	if b, ok := strings.CutSuffix(op.base, "IfExists"); ok {
		op.base, op.ifExists = b, true
	}
	_, pos := positive[op.base]
	_, neg := negated[op.base]
	if !pos && !neg && op.base != "Null" {
		return op, fmt.Errorf("condition operator %q is not supported", s)
	}
	return op, nil
}

func numeric(cmp func(policy, request float64) bool) func(string, string) bool {
	return func(p, r string) bool {
		pf, err1 := strconv.ParseFloat(p, 64)
		rf, err2 := strconv.ParseFloat(r, 64)
		return err1 == nil && err2 == nil && cmp(pf, rf)
	}
}

// arnLike compares ARNs as Resource does.
func arnLike(p, r string) bool { return ResourceMatches(p, r) }

// lookup returns the values of key in ctx; condition keys are
// case-insensitive.
func lookup(ctx map[string][]string, key string) ([]string, bool) {
	if v, ok := ctx[key]; ok {
		return v, true
	}
	for k, v := range ctx {
		if strings.EqualFold(k, key) {
			return v, true
		}
	}
	return nil, false
}

// holds evaluates the condition against the request's keys:
//   - Null is true when the key's absence is what the value ("true") says;
//   - a key absent from the request makes ...IfExists and ForAllValues true,
//     a negated operator true, and any other operator false;
//   - ForAllValues needs every value of the request to match, ForAnyValue
//     one of them; without a qualifier one value matching is enough for a
//     positive operator, and a negated operator needs none to match;
//   - a value matches when it matches any of the condition's values.
func (c Condition) holds(ctx map[string][]string) bool {
	op, err := parseOperator(c.Operator)
	if err != nil {
		return false // Parse refuses such documents
	}
	vals, present := lookup(ctx, c.Key)
	present = present && len(vals) > 0
	if op.base == "Null" {
		want := len(c.Values) > 0 && strings.EqualFold(c.Values[0], "true")
		return want == !present
	}
	base, neg := op.base, false
	if b, ok := negated[base]; ok {
		base, neg = b, true
	}
	cmp := positive[base]
	matchOne := func(v string) bool {
		for _, p := range c.Values {
			if cmp(p, v) {
				return true
			}
		}
		return false
	}
	if !present {
		switch {
		case op.ifExists, op.set == "ForAllValues":
			return true
		case op.set == "ForAnyValue":
			return false
		}
		return neg
	}
	pred := func(v string) bool { return matchOne(v) != neg }
	switch op.set {
	case "ForAllValues":
		for _, v := range vals {
			if !pred(v) {
				return false
			}
		}
		return true
	case "ForAnyValue":
		for _, v := range vals {
			if pred(v) {
				return true
			}
		}
		return false
	}
	any := false
	for _, v := range vals {
		any = any || matchOne(v)
	}
	return any != neg
}
