package iampolicy

import (
	"fmt"
	"strings"
)

// Request is what IAM authorises for one call: one action on one resource,
// with the request's condition keys.
type Request struct {
	// Principal is the ARN of the caller (a role's ARN), matched against the
	// Principal of resource-based statements. Identity-based policies are
	// the caller's own and ignore it.
	Principal string `json:"principal,omitempty"`
	// Action is service:Operation as IAM names it (sqs:SendMessage).
	Action string `json:"action"`
	// Resource is the ARN of the resource, or "*" for an action that takes
	// no resource.
	Resource string `json:"resource"`
	// Context holds the request's condition keys and their values
	// (dynamodb:LeadingKeys, s3:prefix, aws:SecureTransport). Key names are
	// case-insensitive.
	Context map[string][]string `json:"context,omitempty"`
}

func (r Request) String() string {
	s := r.Action + " on " + r.Resource
	if len(r.Context) > 0 {
		s += fmt.Sprintf(" with %v", r.Context)
	}
	return s
}

// Decision is the outcome of an evaluation.
type Decision int

// Decisions, as IAM names them.
const (
	// ImplicitDeny: no statement allows the request.
	ImplicitDeny Decision = iota
	// Allow: a statement allows it and none denies it.
	Allow
	// ExplicitDeny: a statement denies it.
	ExplicitDeny
)

func (d Decision) String() string {
	switch d {
	case Allow:
		return "allowed"
	case ExplicitDeny:
		return "explicitly denied"
	}
	return "implicitly denied"
}

// Match names a statement that applied to a request.
type Match struct {
	Policy    string
	Statement int // index in the policy
	Sid       string
}

func (m Match) String() string {
	if m.Sid != "" {
		return m.Policy + " " + m.Sid
	}
	return fmt.Sprintf("%s statement %d", m.Policy, m.Statement)
}

// Result is an evaluation's decision and the statements that led to it.
type Result struct {
	Decision Decision
	// Allowed and Denied are the Allow and Deny statements that applied.
	Allowed, Denied []Match
}

// Evaluate decides req against the policies that apply to it in one
// account: the caller's identity-based policies and the resource's
// resource-based policies (statements with a Principal). An explicit deny
// in any of them wins; otherwise an allow in either kind allows. It is
// safe for concurrent use.
func Evaluate(req Request, policies ...*Policy) Result {
	var res Result
	for _, p := range policies {
		for i, st := range p.Statements {
			if !st.applies(req) {
				continue
			}
			m := Match{Policy: p.Name, Statement: i, Sid: st.Sid}
			if st.Effect == EffectDeny {
				res.Denied = append(res.Denied, m)
			} else {
				res.Allowed = append(res.Allowed, m)
			}
		}
	}
	switch {
	case len(res.Denied) > 0:
		res.Decision = ExplicitDeny
	case len(res.Allowed) > 0:
		res.Decision = Allow
	}
	return res
}

// applies reports whether the statement's principal, action, resource and
// conditions all match req.
func (st *Statement) applies(req Request) bool {
	if st.Principal != nil && !st.Principal.matches(req.Principal, st.Effect) {
		return false
	}
	if st.Action != nil && !anyAction(st.Action, req.Action) || st.NotAction != nil && anyAction(st.NotAction, req.Action) {
		return false
	}
	if st.Resource != nil && !anyResource(st.Resource, req.Resource) || st.NotResource != nil && anyResource(st.NotResource, req.Resource) {
		return false
	}
	for _, c := range st.Conditions {
		if !c.holds(req.Context) {
			return false
		}
	}
	return true
}

// matches reports whether a resource-based statement names the caller. An
// account (its id or arn:...:iam::ACCOUNT:root) names every principal of
// the account for a Deny; for an Allow it only delegates to the account's
// identity-based policies, so it does not allow by itself.
func (p *Principal) matches(caller string, effect Effect) bool {
	if p.All {
		return true
	}
	for _, a := range p.AWS {
		if a == caller {
			return true
		}
		if effect == EffectDeny && accountOf(a) != "" && accountOf(a) == accountOf(caller) {
			return true
		}
	}
	return false
}

// accountOf returns the account of an ARN or an account id.
func accountOf(s string) string {
	if !strings.HasPrefix(s, "arn:") {
		return s
	}
	parts := strings.SplitN(s, ":", 6)
	if len(parts) < 6 {
		return ""
	}
	return parts[4]
}

func anyAction(patterns []string, action string) bool {
	for _, p := range patterns {
		if ActionMatches(p, action) {
			return true
		}
	}
	return false
}

func anyResource(patterns []string, resource string) bool {
	for _, p := range patterns {
		if ResourceMatches(p, resource) {
			return true
		}
	}
	return false
}

// ActionMatches reports whether an Action element (service:Name, with * and
// ?) covers action. Action names are case-insensitive.
func ActionMatches(pattern, action string) bool {
	return glob(strings.ToLower(pattern), strings.ToLower(action))
}

// ResourceMatches reports whether a Resource element covers resource: "*"
// covers everything; otherwise the ARN's segments (split at the first five
// colons) are matched one by one, case-sensitively, each with * and ?, and a
// * that ends the pattern's last segment also covers the segments after it.
func ResourceMatches(pattern, resource string) bool {
	if pattern == "*" {
		return true
	}
	ps := strings.SplitN(pattern, ":", 6)
	rs := strings.SplitN(resource, ":", 6)
	for i, p := range ps {
		if i >= len(rs) {
			return false
		}
		if i == len(ps)-1 && len(ps) < len(rs) {
			// A trailing * may reach past the colons.
			return strings.HasSuffix(p, "*") && glob(p, strings.Join(rs[i:], ":"))
		}
		if !glob(p, rs[i]) {
			return false
		}
	}
	return len(ps) == len(rs)
}

// glob matches s against pattern, where * stands for any run of characters
// and ? for any one character.
func glob(pattern, s string) bool {
	// Iterative matching with backtracking to the last *.
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		switch {
		case p < len(pattern) && (pattern[p] == '?' || pattern[p] == s[i]):
			p++
			i++
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, i
			p++
		case star >= 0:
			p = star + 1
			mark++
			i = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
