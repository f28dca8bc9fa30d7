package deliver

import (
	"encoding/json"

	"github.com/changes-worker/changes-worker/shared/change"
)

// Stored is what an output holds for one document, as reported by the state
// reader of a sink that keeps state (each such sink package has one; an HTTP
// endpoint exposes none). Only the sink knows its storage layout; tools that
// need to know what an output holds (verify) ask its state reader.
type Stored struct {
	ID string
	// Version is the observation version of the last change the output
	// applied to the document; zero when the output records none (a copy
	// written behind the sink's back).
	Version change.Version
	// Rev is the revision of the copy the output stores (also of one that a
	// recorded deletion supersedes); with no copy, the revision the output
	// last recorded.
	Rev string
	// Held reports that the output holds a live copy.
	Held bool
	// Deleted reports that the last change applied was a deletion (or a
	// removal) while a copy is still stored: a deletion not settled yet, or
	// a copy the output should not hold (then Problem says so).
	Deleted bool
	// Filtered marks a document the output deliberately holds no copy of
	// (a PostgreSQL mapping's filter rejected revision Rev).
	Filtered bool
	// Problem describes an inconsistency inside the output ("data row
	// without a versions row", ...).
	Problem string
	// Digest identifies the content of the copy in the sink's own terms
	// (see the sink's state reader); "" when it computes none. Two equal
	// digests read from one output mean equal content. It is not a digest of
	// the source's body: comparing content with the source goes through the
	// state reader's CompareContent.
	Digest string
}

// SourceDoc is a live document as the source holds it: what a state
// reader's CompareContent compares with the output's copy.
type SourceDoc struct {
	ID, Rev string
	// Body is the document's JSON as the source sent it, as a change
	// carries it to the sink.
	Body json.RawMessage
}
