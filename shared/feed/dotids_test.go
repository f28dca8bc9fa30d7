package feed

import (
	"encoding/json"
	"testing"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// dotIDs are document ids that a URL path would read as relative segments
// if they were not escaped.
var dotIDs = []string{".", "..", "...", "_design/.."}

// TestCouchGetDotIDs reads documents whose ids are made of dots, by id and
// by revision, from the real source: each answer must be that document,
// not the server's welcome or the database's info.
func TestCouchGetDotIDs(t *testing.T) {
	t.Parallel()
	db := testenv.CouchDB(t)
	var docs []map[string]any
	for _, id := range dotIDs {
		docs = append(docs, map[string]any{"_id": id, "v": id})
	}
	revs := bulkDocs(t, db, true, docs...)
	c := newCouchClient(t, db, nil)
	for i, id := range dotIDs {
		body, rev, err := c.Get(t.Context(), id)
		if err != nil {
			t.Errorf("Get(%q): %v", id, err)
			continue
		}
		var got struct {
			ID string `json:"_id"`
			V  string `json:"v"`
		}
		if err := json.Unmarshal(body, &got); err != nil || got.ID != id || got.V != id || rev != revs[i] {
			t.Errorf("Get(%q) = %s rev %s (%v), want the document at %s", id, body, rev, err, revs[i])
		}
		got.ID = ""
		body, err = c.getDoc(t.Context(), id, revs[i])
		if err != nil {
			t.Errorf("get %q at rev %s: %v", id, revs[i], err)
			continue
		}
		if err := json.Unmarshal(body, &got); err != nil || got.ID != id {
			t.Errorf("get %q at rev %s = %s (%v), want the document", id, revs[i], body, err)
		}
	}
}
