// Package deliver is the contract between the writer and an output: the Sink
// interface, the classified delivery Error (transient or permanent) that a
// sink returns, and EachDocument for sinks that write one document per
// request. It knows nothing of SQS or Lambda, so a sink depends on this
// package and its own client only. The delivertest subpackage is the
// conformance suite every Sink runs.
package deliver

import (
	"context"

	"github.com/changes-worker/changes-worker/shared/change"
)

// Sink applies changes to one output.
//
// Apply receives changes with their bodies resolved (claim checks already
// fetched) and returns a slice of the same length: nil where the change was
// applied or was not newer than what the output already holds, an error
// (preferably a classified *Error) where it failed. A batch never holds two
// changes of the same document when the output is ordered per document.
//
// Implementations apply changes monotonically by Version: a change whose
// version is not higher than the stored one changes nothing. Apply is
// idempotent, safe for concurrent use, and returns promptly when ctx ends.
type Sink interface {
	Apply(ctx context.Context, changes []*change.Envelope) []error
}
