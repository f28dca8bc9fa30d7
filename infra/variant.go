package main

import "fmt"

// variant selects what the stack contains.
//
// The full variant is what runs on AWS. The local variant is the same stack
// without the compute, which `changesctl run` (and `changesctl verify`) host
// on one machine instead: the poller, writer and verify functions, the
// poller's schedules, the writer's event source mappings and the Lambda
// permissions and invoke configuration that go with them. Everything else stays as it is — table, bucket, queues and DLQs
// with their redrive and redrive-allow policies, queue and bucket policies,
// secrets, the functions' roles (less what only the functions use: their VPC
// access, the writer's switch of its own event source mappings) and log
// groups, the alarm topic, alarms and dashboard — so the local variant deploys to an emulator that cannot run
// Lambda functions (LocalStack without Docker) and the local runtime drives
// the deployed queues and table.
type variant string

const (
	variantFull  variant = "full"
	variantLocal variant = "local"
)

// parseVariant reads the context value variant; empty means full.
func parseVariant(s string) (variant, error) {
	switch variant(s) {
	case "", variantFull:
		return variantFull, nil
	case variantLocal:
		return variantLocal, nil
	}
	return "", fmt.Errorf("context %s=%q: want %s or %s", contextVariant, s, variantFull, variantLocal)
}

// functions reports whether the variant has the Lambda functions.
func (v variant) functions() bool { return v != variantLocal }
