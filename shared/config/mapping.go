package config

// Mapping maps a document onto relational tables (PostgreSQL mapping mode).
// Its fields and validation are defined with the mapping writer.
type Mapping struct {
	Tables []map[string]any `json:"tables"`
}

func (m *Mapping) validate(p string) []error { return nil }
