package syncgateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestServerIsSyncGateway31 checks that the tests talk to the pinned build
// and that a database created for one test serves its own users.
func TestServerIsSyncGateway31(t *testing.T) {
	t.Parallel()
	db := sg.CreateDB(t, "")
	db.PutUser("alice", "alicepw", "orders")
	rev := db.Put("o1", "", map[string]any{"channels": []string{"orders"}, "n": 1})

	resp, err := sg.HTTP.Get(sg.PublicURL + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var root struct {
		Vendor struct{ Name, Version string } `json:"vendor"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&root); err != nil {
		t.Fatal(err)
	}
	if root.Vendor.Name != "Couchbase Sync Gateway" || root.Vendor.Version != "3.1" {
		t.Errorf("server says %+v, want Couchbase Sync Gateway 3.1", root.Vendor)
	}
	if server := resp.Header.Get("Server"); !strings.HasPrefix(server, "Couchbase Sync Gateway/3.1 ") || !strings.HasSuffix(server, " CE") {
		t.Errorf("Server header %q, want Couchbase Sync Gateway/3.1 ... CE", server)
	}

	status, body := db.Public(http.MethodGet, "/o1", "alice", "alicepw", nil)
	if status != http.StatusOK || !strings.Contains(string(body), `"_rev":"`+rev+`"`) {
		t.Errorf("alice GET o1: %d %s, want 200 with rev %s", status, body, rev)
	}
	if status, body := db.Public(http.MethodGet, "/o1", "alice", "wrong", nil); status != http.StatusUnauthorized {
		t.Errorf("wrong password: %d %s, want 401", status, body)
	}
}
