package testenv

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// releasingGateway answers the admin requests WaitCached makes the way Sync
// Gateway does (the shapes of its database info, document write and admin
// changes feed) with the two behaviours WaitCached must live with: a write
// reaches the changes cache only some feed reads later, and the database's
// update_seq counts sequences reserved and released unused, which no feed
// lists (the allocator's release sets update_seq to the last reserved).
type releasingGateway struct {
	mu       sync.Mutex
	seq      int64 // the last sequence a document took
	reserved int64 // the last sequence reserved
	lag      int   // feed reads that miss a write before it is listed
	unlisted int   // feed reads left that miss the last write
	rev      string
	reads    int // changes feed requests
}

func (g *releasingGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/db/":
		fmt.Fprintf(w, `{"db_name":"db","update_seq":%d,"committed_update_seq":%d,"state":"Online"}`, g.reserved, g.reserved)
	case r.Method == http.MethodPut && r.URL.Path == "/db/"+cacheMarker:
		// The write takes the next sequence of a reserved batch of ten;
		// the nine left are released at once.
		g.seq = g.reserved + 1
		g.reserved += 10
		g.rev = fmt.Sprintf("%d-marker", g.seq)
		g.unlisted = g.lag
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q,"ok":true,"rev":%q}`, cacheMarker, g.rev)
	case r.Method == http.MethodGet && r.URL.Path == "/db/_changes":
		g.reads++
		var since int64
		fmt.Sscan(r.URL.Query().Get("since"), &since)
		var results []string
		last := since
		if g.unlisted > 0 {
			g.unlisted--
		} else if g.seq > since {
			results = append(results, fmt.Sprintf(`{"seq":%d,"id":%q,"changes":[{"rev":%q}]}`, g.seq, cacheMarker, g.rev))
			last = g.seq
		}
		fmt.Fprintf(w, "{\"results\":[\n%s\n],\n\"last_seq\":\"%d\"}\n", strings.Join(results, "\n,"), last)
	default:
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(map[string]string{"error": "not_found", "reason": r.Method + " " + r.URL.Path})
	}
}

// TestWaitCachedPastReleasedSequences: WaitCached returns once the admin
// feed lists the marker it wrote, not before, though the database's
// update_seq counts sequences the feed never lists.
func TestWaitCachedPastReleasedSequences(t *testing.T) {
	g := &releasingGateway{seq: 22, reserved: 22, lag: 3}
	srv := httptest.NewServer(g)
	defer srv.Close()
	db := &SGDatabase{sg: &SyncGateway{AdminURL: srv.URL, HTTP: srv.Client()}, t: t, Name: "db"}
	for round := range 2 {
		g.mu.Lock()
		g.reads = 0
		g.mu.Unlock()
		db.WaitCached()
		g.mu.Lock()
		reads, rev := g.reads, g.rev
		g.mu.Unlock()
		if reads <= g.lag {
			t.Errorf("round %d: WaitCached returned after %d feed reads, before the feed listed the marker (read %d)", round, reads, g.lag+1)
		}
		if db.markerRev != rev {
			t.Errorf("round %d: marker revision %q, want %q", round, db.markerRev, rev)
		}
	}
}
