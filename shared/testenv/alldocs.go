package testenv

// AllDocs is the answer of a CouchDB or Sync Gateway _all_docs request: a
// row per live document with its winning revision.
type AllDocs struct {
	Rows []struct {
		ID    string `json:"id"`
		Value struct {
			Rev string `json:"rev"`
		} `json:"value"`
	} `json:"rows"`
}

// Winners returns doc id → winning revision of every row.
func (a AllDocs) Winners() map[string]string {
	out := make(map[string]string, len(a.Rows))
	for _, r := range a.Rows {
		out[r.ID] = r.Value.Rev
	}
	return out
}
