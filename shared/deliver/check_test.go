package deliver

import (
	"encoding/json"
	"testing"

	"github.com/changes-worker/changes-worker/shared/change"
)

func TestCheckChange(t *testing.T) {
	t.Parallel()
	v := change.Version{Generation: 1, Counter: 1}
	tests := []struct {
		name       string
		c          *change.Envelope
		wantReason string // "" for no error
	}{
		{name: "live change", c: &change.Envelope{DocID: "a", Version: v, Doc: json.RawMessage(`{}`)}},
		{name: "tombstone without body", c: &change.Envelope{DocID: "a", Version: v, Deleted: true}},
		{name: "removal without body", c: &change.Envelope{DocID: "a", Version: v, Removed: true}},
		{name: "nil", c: nil, wantReason: "invalid_change"},
		{name: "no document id", c: &change.Envelope{Version: v, Doc: json.RawMessage(`{}`)}, wantReason: "invalid_change"},
		{name: "no generation", c: &change.Envelope{DocID: "a", Version: change.Version{Counter: 1}, Doc: json.RawMessage(`{}`)}, wantReason: "invalid_change"},
		{name: "no counter", c: &change.Envelope{DocID: "a", Version: change.Version{Generation: 1}, Doc: json.RawMessage(`{}`)}, wantReason: "invalid_change"},
		{name: "live change without body", c: &change.Envelope{DocID: "a", Version: v}, wantReason: "invalid_body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := CheckChange(tt.c)
			if tt.wantReason == "" {
				if err != nil {
					t.Errorf("CheckChange = %v, want nil", err)
				}
				return
			}
			if e := Classify(err); err == nil || e.Class != Permanent || e.Reason != tt.wantReason {
				t.Errorf("CheckChange = %v, want permanent %s", err, tt.wantReason)
			}
		})
	}
}
