package deliver

import (
	"errors"
	"fmt"

	"github.com/changes-worker/changes-worker/shared/change"
)

// CheckChange returns a permanent *Error when no sink can apply c: reason
// "invalid_change" when c is nil, has no document id or no observation
// version (generation and counter from 1, which monotonic apply needs), and
// "invalid_body" when a live change has no body (claim checks are resolved
// before a sink sees a change). Sinks call it first in their own checks; the
// envelope's full validation (change.Envelope.Check) is the writer's, when
// it decodes a message.
func CheckChange(c *change.Envelope) error {
	switch {
	case c == nil:
		return PermanentError("invalid_change", errors.New("check change: change is nil"))
	case c.DocID == "":
		return PermanentError("invalid_change", errors.New("check change: doc_id is empty"))
	case c.Generation < 1 || c.Counter < 1:
		return PermanentError("invalid_change", fmt.Errorf("check change %s: version %s must have generation and counter >= 1", c.DocID, c.Version))
	case !c.Tombstone() && len(c.Doc) == 0:
		return PermanentError("invalid_body", fmt.Errorf("check change %s: live change has no body", c.DocID))
	}
	return nil
}
