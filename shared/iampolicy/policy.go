// Package iampolicy evaluates AWS IAM policy documents against requests, as
// IAM does for a principal and a resource of one account: an explicit Deny
// in any applicable statement wins, else an Allow in any applicable
// statement allows, else the request is denied by default. A statement
// applies when its action, its resource, its principal (in a resource-based
// policy) and every one of its conditions match the request.
//
// It covers what the stack's policies and the operator policy use:
// Action/NotAction with the wildcards * and ? (case-insensitive),
// Resource/NotResource with ARN wildcards (case-sensitive, per ARN segment),
// Principal "*", AWS ARNs and service principals, and the condition
// operators String*, Arn*, Numeric*, Bool and Null with the ForAllValues:
// and ForAnyValue: set qualifiers and the IfExists suffix. A document that
// uses anything else (policy variables, NotPrincipal, date or IP operators)
// is refused by Parse, naming what it does not support, rather than
// evaluated wrongly. Organizations SCPs, permissions boundaries and session
// policies are not modelled. The rules follow IAM's "Policy evaluation
// logic" and "IAM JSON policy elements" references.
package iampolicy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Effect is a statement's effect.
type Effect string

// Effects.
const (
	EffectAllow Effect = "Allow"
	EffectDeny  Effect = "Deny"
)

// Policy is a parsed policy document. Name labels it in results; it is not
// part of the document.
type Policy struct {
	Name       string
	Statements []Statement
}

// Statement is one statement of a policy.
type Statement struct {
	Sid    string
	Effect Effect
	// Principal is nil in an identity-based policy; in a resource-based
	// policy it says whom the statement applies to.
	Principal *Principal
	// Action or NotAction, Resource or NotResource: one of each pair is set.
	Action, NotAction     []string
	Resource, NotResource []string
	Conditions            []Condition
}

// Principal is a resource-based statement's Principal element.
type Principal struct {
	// All is Principal "*" or {"AWS": "*"}.
	All bool
	// AWS are account ids or IAM ARNs; Service are service principals.
	AWS, Service []string
}

// Condition is one key of one operator of a statement's Condition element:
// {"Operator": {"Key": Values}}.
type Condition struct {
	Operator string // as written, e.g. ForAllValues:StringLike
	Key      string
	Values   []string
}

// Parse reads a policy document (JSON). It returns an error naming the
// statement and element it cannot evaluate.
func Parse(name string, doc []byte) (*Policy, error) {
	var raw struct {
		Version   string
		Statement json.RawMessage
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("parse policy %s: %w", name, err)
	}
	var list []json.RawMessage
	switch {
	case len(raw.Statement) == 0:
		return nil, fmt.Errorf("parse policy %s: no Statement", name)
	case raw.Statement[0] == '[':
		if err := json.Unmarshal(raw.Statement, &list); err != nil {
			return nil, fmt.Errorf("parse policy %s: Statement: %w", name, err)
		}
	default:
		list = []json.RawMessage{raw.Statement}
	}
	p := &Policy{Name: name}
	for i, s := range list {
		st, err := parseStatement(s)
		if err != nil {
			return nil, fmt.Errorf("parse policy %s: statement %d: %w", name, i, err)
		}
		p.Statements = append(p.Statements, st)
	}
	return p, nil
}

// MustParse is Parse for documents written in code; it panics on an error.
func MustParse(name, doc string) *Policy {
	p, err := Parse(name, []byte(doc))
	if err != nil {
		panic(err)
	}
	return p
}

func parseStatement(b json.RawMessage) (Statement, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return Statement{}, err
	}
	var st Statement
	var errs []error
	for k, v := range raw {
		var err error
		switch k {
		case "Sid":
			err = json.Unmarshal(v, &st.Sid)
		case "Effect":
			var e string
			err = json.Unmarshal(v, &e)
			st.Effect = Effect(e)
		case "Action":
			st.Action, err = stringList(v)
		case "NotAction":
			st.NotAction, err = stringList(v)
		case "Resource":
			st.Resource, err = stringList(v)
		case "NotResource":
			st.NotResource, err = stringList(v)
		case "Principal":
			st.Principal, err = parsePrincipal(v)
		case "Condition":
			st.Conditions, err = parseConditions(v)
		default:
			err = errors.New("not supported")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
		}
	}
	if st.Effect != EffectAllow && st.Effect != EffectDeny {
		errs = append(errs, fmt.Errorf("element Effect %q: want Allow or Deny", st.Effect))
	}
	if (st.Action == nil) == (st.NotAction == nil) {
		errs = append(errs, errors.New("want exactly one of Action and NotAction"))
	}
	if (st.Resource == nil) == (st.NotResource == nil) {
		errs = append(errs, errors.New("want exactly one of Resource and NotResource"))
	}
	for _, list := range [][]string{st.Resource, st.NotResource} {
		for _, r := range list {
			if strings.Contains(r, "${") {
				errs = append(errs, fmt.Errorf("element Resource %q: policy variables are not supported", r))
			}
		}
	}
	if st.Sid != "" {
		for i, err := range errs {
			errs[i] = fmt.Errorf("%s: %w", st.Sid, err)
		}
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return st, errors.Join(errs...)
}

// stringList reads a string or a list of strings.
func stringList(b json.RawMessage) ([]string, error) {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		return []string{one}, nil
	}
	var list []string
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, errors.New("want a string or a list of strings")
	}
	if list == nil {
		list = []string{}
	}
	return list, nil
}

func parsePrincipal(b json.RawMessage) (*Principal, error) {
	var star string
	if err := json.Unmarshal(b, &star); err == nil {
		if star != "*" {
			return nil, fmt.Errorf("%q: want \"*\" or an object", star)
		}
		return &Principal{All: true}, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, errors.New("want \"*\" or an object")
	}
	p := &Principal{}
	for k, v := range m {
		list, err := stringList(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		switch k {
		case "AWS":
			for _, a := range list {
				if a == "*" {
					p.All = true
				} else {
					p.AWS = append(p.AWS, a)
				}
			}
		case "Service":
			p.Service = append(p.Service, list...)
		default:
			return nil, fmt.Errorf("%s principals are not supported", k)
		}
	}
	return p, nil
}

func parseConditions(b json.RawMessage) ([]Condition, error) {
	var ops map[string]map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&ops); err != nil {
		return nil, errors.New("want {operator: {key: values}}")
	}
	var out []Condition
	for op, keys := range ops {
		if _, err := parseOperator(op); err != nil {
			return nil, err
		}
		for k, v := range keys {
			vals, err := conditionValues(v)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", op, k, err)
			}
			for _, s := range vals {
				if strings.Contains(s, "${") {
					return nil, fmt.Errorf("%s %s %q: policy variables are not supported", op, k, s)
				}
			}
			out = append(out, Condition{Operator: op, Key: k, Values: vals})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Operator != out[j].Operator {
			return out[i].Operator < out[j].Operator
		}
		return out[i].Key < out[j].Key
	})
	return out, nil
}

// conditionValues reads a condition's value or values: strings, booleans
// and numbers, as the strings IAM compares.
func conditionValues(b json.RawMessage) ([]string, error) {
	var list []json.RawMessage
	if err := json.Unmarshal(b, &list); err != nil {
		list = []json.RawMessage{b}
	}
	out := make([]string, 0, len(list))
	for _, v := range list {
		dec := json.NewDecoder(bytes.NewReader(v))
		dec.UseNumber()
		var x any
		if err := dec.Decode(&x); err != nil {
			return nil, err
		}
		switch x := x.(type) {
		case string:
			out = append(out, x)
		case bool:
			out = append(out, fmt.Sprint(x))
		case json.Number:
			out = append(out, x.String())
		default:
			return nil, fmt.Errorf("value %s: want a string, a boolean or a number", v)
		}
	}
	return out, nil
}
