// Package iamcheck checks the AWS requests recorded during a test
// (awsconf.EnvCalls) against the IAM policies of their callers: the roles
// of a deployed stack's functions, read from its cloud assembly and
// resolved to the stack's physical resources, and the operator policy of
// docs/deploy.md for changesctl. A request its caller's policies would not
// allow is reported as denied; an action a policy grants that no request
// used is reported as unused.
package iamcheck

import (
	"fmt"
	"sort"
	"strings"

	"github.com/changes-worker/changes-worker/shared/awsconf"
	"github.com/changes-worker/changes-worker/shared/iampolicy"
)

// Principal is a caller as IAM sees it: the ARN that resource-based
// policies name, and its identity-based policies.
type Principal struct {
	ARN      string
	Policies []*iampolicy.Policy
	// EventSource: the role is a function's that an SQS event source
	// mapping invokes; Lambda polls the queue with the role.
	EventSource bool
}

// Policies are what the recorded calls are evaluated against.
type Policies struct {
	// Callers maps a recorded caller (a function name, "changesctl
	// status") to its principal. A caller mapped to nil is not checked
	// (changesctl run plays the functions); a caller missing from the map
	// is reported.
	Callers map[string]*Principal
	// Resource are the resource-based policies (bucket and queue
	// policies) of the resources the calls reach.
	Resource []*iampolicy.Policy
}

// Unused is an action a policy grants that no checked request used.
type Unused struct {
	Principal string // the callers of the principal, joined
	Grant     iampolicy.Match
	Action    string
	// ByLambda: Lambda itself makes such requests with the function's
	// role (its logs, the SQS event source mapping's receives and
	// deletes), which the recording cannot see.
	ByLambda bool
}

func (u Unused) String() string {
	s := u.Principal + ": " + u.Action + " (" + u.Grant.String() + ")"
	if u.ByLambda {
		s += ", used by Lambda itself"
	}
	return s
}

// Report is the outcome of Check.
type Report struct {
	// Checked counts the requests evaluated; Skipped the calls of callers
	// not checked.
	Checked, Skipped int
	// ByCaller counts the requests evaluated per caller.
	ByCaller map[string]int
	// Calls is the number of calls the file held (Deployed.Check).
	Calls int
	// Denied describes each request that would be denied, and each call
	// that could not be checked (no mapping, no policy for its caller).
	Denied []string
	// Unused lists the granted actions no request used.
	Unused []Unused
}

// logActions and eventSourceActions are the actions Lambda performs with a
// function's role rather than the function's code: writing its logs, and
// the SQS event source mapping's polling.
var (
	logActions         = map[string]bool{"logs:createlogstream": true, "logs:putlogevents": true}
	eventSourceActions = map[string]bool{"sqs:receivemessage": true, "sqs:deletemessage": true, "sqs:getqueueattributes": true}
)

// secureTransport is the request context every request has on AWS: the SDK
// reaches the services' endpoints over HTTPS (the local emulators answer
// plain HTTP, which says nothing about AWS).
var secureTransport = map[string][]string{"aws:SecureTransport": {"true"}}

// Check evaluates every request of calls against its caller's policies and
// the resource-based policies.
func Check(calls []awsconf.Call, p *Policies) Report {
	rep := Report{ByCaller: map[string]int{}}
	type key struct {
		policy string
		stmt   int
	}
	used := map[key][]string{} // the actions allowed by each statement
	callersOf := map[*Principal][]string{}
	for name, pr := range p.Callers {
		if pr != nil {
			callersOf[pr] = append(callersOf[pr], name)
		}
	}
	for _, c := range calls {
		pr, known := p.Callers[c.Caller]
		switch {
		case !known:
			rep.Denied = append(rep.Denied, fmt.Sprintf("%s: %s %s: no policy known for this caller", c.Caller, c.Service, c.Operation))
			continue
		case pr == nil:
			rep.Skipped++
			continue
		case c.Unmapped != "":
			rep.Denied = append(rep.Denied, fmt.Sprintf("%s: %s %s: cannot be checked: %s", c.Caller, c.Service, c.Operation, c.Unmapped))
			continue
		}
		for _, r := range c.Requests {
			rep.Checked++
			rep.ByCaller[c.Caller]++
			r.Principal = pr.ARN
			r.Context = withContext(r.Context, secureTransport)
			res := iampolicy.Evaluate(r, append(append([]*iampolicy.Policy{}, pr.Policies...), p.Resource...)...)
			if res.Decision != iampolicy.Allow {
				why := ""
				if len(res.Denied) > 0 {
					why = fmt.Sprintf(" by %v", res.Denied)
				}
				rep.Denied = append(rep.Denied, fmt.Sprintf("%s: %s %s: %s is %s%s", c.Caller, c.Service, c.Operation, r, res.Decision, why))
			}
			for _, m := range res.Allowed {
				k := key{m.Policy, m.Statement}
				used[k] = append(used[k], r.Action)
			}
		}
	}
	for pr, names := range callersOf {
		sort.Strings(names)
		for _, pol := range pr.Policies {
			for i, st := range pol.Statements {
				if st.Effect != iampolicy.EffectAllow {
					continue
				}
				for _, a := range st.Action {
					if anyMatches(a, used[key{pol.Name, i}]) {
						continue
					}
					rep.Unused = append(rep.Unused, Unused{
						Principal: strings.Join(names, ", "), Grant: iampolicy.Match{Policy: pol.Name, Statement: i, Sid: st.Sid},
						Action: a, ByLambda: logActions[strings.ToLower(a)] || pr.EventSource && eventSourceActions[strings.ToLower(a)],
					})
				}
			}
		}
	}
	sort.Strings(rep.Denied)
	sort.Slice(rep.Unused, func(i, j int) bool { return rep.Unused[i].String() < rep.Unused[j].String() })
	return rep
}

func anyMatches(pattern string, actions []string) bool {
	for _, a := range actions {
		if iampolicy.ActionMatches(pattern, a) {
			return true
		}
	}
	return false
}

func withContext(ctx, add map[string][]string) map[string][]string {
	out := make(map[string][]string, len(ctx)+len(add))
	for k, v := range add {
		out[k] = v
	}
	for k, v := range ctx {
		out[k] = v
	}
	return out
}
