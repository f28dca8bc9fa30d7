package feed

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// bigSource is a CouchDB-like source of n documents of about size bytes
// each, with integer seqs 1..n (document i at seq i+1). It serves _changes
// (include_docs honoured), _bulk_get (JSON, or multipart/mixed when the
// request's Accept asks for multipart first) and document GETs, writing its
// answers as a stream without building them in memory. It records, per
// request, what was asked and how many bytes it managed to write before the
// client stopped reading.
type bigSource struct {
	t    *testing.T
	srv  *httptest.Server
	n    int
	size int

	mu      sync.Mutex
	started int
	log     []bigRequest
	docs    [][]byte // built lazily, shared by every answer
}

// bigRequest is one request the source served.
type bigRequest struct {
	Path    string
	Limit   int // _changes
	Asked   int // _bulk_get: documents asked for
	Written int64
	Whole   bool // the answer was written to its end
}

func newBigSource(t *testing.T, n, size int) *bigSource {
	t.Helper()
	s := &bigSource{t: t, n: n, size: size, docs: make([][]byte, n)}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *bigSource) db() string { return s.srv.URL + "/db" }

func (s *bigSource) id(i int) string { return fmt.Sprintf("d%05d", i) }

// doc returns document i's body.
func (s *bigSource) doc(i int) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.docs[i] == nil {
		head := fmt.Sprintf(`{"_id":%q,"_rev":"1-a","n":%d,"pad":"`, s.id(i), i)
		pad := max(s.size-len(head)-2, 0)
		s.docs[i] = []byte(head + strings.Repeat("x", pad) + `"}`)
	}
	return s.docs[i]
}

// requests returns the requests served so far, waiting (up to 10 s) until
// every request the source received has finished: a handler still writing
// into a connection the client closed finishes a little later.
func (s *bigSource) requests() []bigRequest {
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		done := s.started == len(s.log)
		log := append([]bigRequest(nil), s.log...)
		s.mu.Unlock()
		if done || time.Now().After(deadline) {
			return log
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// smallReceiveBuffer gives a client connections with a receive buffer of
// 1 MB, for a test that bounds what a source wrote before the client
// stopped reading. That count includes what the sockets buffered: the
// source's send buffer (at most tcp_wmem's maximum, 4 MB here) and the
// client's receive buffer, which Linux otherwise grows up to tcp_rmem's
// maximum (32 MB here) while the client reads slowly, as on a busy machine.
func smallReceiveBuffer(o *Options) {
	d := &net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1<<20)
		}); err != nil {
			return err
		}
		return serr
	}}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = d.DialContext
	o.HTTPClient = &http.Client{Transport: t}
}

// countingWriter counts what reached the connection.
type countingWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
	return n, err
}

func (s *bigSource) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.started++
	s.mu.Unlock()
	cw := &countingWriter{w: w}
	rec := bigRequest{Path: r.URL.Path}
	switch {
	case r.URL.Path == "/db/_changes":
		rec.Limit, _ = strconv.Atoi(r.URL.Query().Get("limit"))
		s.changes(w, cw, r, rec.Limit)
	case r.URL.Path == "/db/_bulk_get":
		var req struct {
			Docs []struct{ ID, Rev string } `json:"docs"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			break
		}
		rec.Asked = len(req.Docs)
		var idx []int
		for _, d := range req.Docs {
			i, err := strconv.Atoi(strings.TrimPrefix(d.ID, "d"))
			if err != nil || i < 0 || i >= s.n {
				continue
			}
			idx = append(idx, i)
		}
		if strings.HasPrefix(r.Header.Get("Accept"), "multipart/") {
			s.bulkMultipart(w, cw, idx)
		} else {
			s.bulkJSON(w, cw, idx)
		}
	case strings.HasPrefix(r.URL.Path, "/db/d"):
		i, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/db/d"))
		if err != nil || i < 0 || i >= s.n {
			http.NotFound(w, r)
			break
		}
		w.Header().Set("Content-Type", "application/json")
		cw.Write(s.doc(i))
	default:
		http.NotFound(w, r)
	}
	rec.Written, rec.Whole = cw.n, cw.err == nil
	s.mu.Lock()
	s.log = append(s.log, rec)
	s.mu.Unlock()
}

func (s *bigSource) changes(w http.ResponseWriter, cw *countingWriter, r *http.Request, limit int) {
	since, _ := strconv.Atoi(r.URL.Query().Get("since"))
	docs := r.URL.Query().Get("include_docs") == "true"
	if limit <= 0 {
		limit = s.n
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(cw, `{"results":[`)
	last := since
	for i := since; i < s.n && i < since+limit; i++ {
		if i > since {
			io.WriteString(cw, ",\n")
		}
		fmt.Fprintf(cw, `{"seq":%d,"id":%q,"changes":[{"rev":"1-a"}]`, i+1, s.id(i))
		if docs {
			io.WriteString(cw, `,"doc":`)
			cw.Write(s.doc(i))
		}
		io.WriteString(cw, "}")
		last = i + 1
		if cw.err != nil {
			return
		}
	}
	fmt.Fprintf(cw, "],\n"+`"last_seq":%d,"pending":%d}`+"\n", last, s.n-last)
}

func (s *bigSource) bulkJSON(w http.ResponseWriter, cw *countingWriter, idx []int) {
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(cw, `{"results":[`)
	for k, i := range idx {
		if k > 0 {
			io.WriteString(cw, ",")
		}
		fmt.Fprintf(cw, `{"id":%q,"docs":[{"ok":`, s.id(i))
		cw.Write(s.doc(i))
		io.WriteString(cw, `}]}`)
		if cw.err != nil {
			return
		}
	}
	io.WriteString(cw, `]}`)
}

func (s *bigSource) bulkMultipart(w http.ResponseWriter, cw *countingWriter, idx []int) {
	mw := multipart.NewWriter(cw)
	w.Header().Set("Content-Type", "multipart/mixed; boundary="+mw.Boundary())
	for _, i := range idx {
		p, err := mw.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/json"}})
		if err != nil {
			return
		}
		if _, err := p.Write(s.doc(i)); err != nil {
			return
		}
	}
	mw.Close()
}

// rowsFrom makes the feed rows of documents lo..hi-1, without bodies.
func (s *bigSource) rowsFrom(lo, hi int) []Row {
	var rows []Row
	for i := lo; i < hi; i++ {
		rows = append(rows, Row{Seq: json.RawMessage(strconv.Itoa(i + 1)), ID: s.id(i), Rev: "1-a"})
	}
	return rows
}

// docBytes sums the bodies the rows hold.
func docBytes(rows []Row) int64 {
	var n int64
	for _, r := range rows {
		n += int64(len(r.Doc))
	}
	return n
}

// checkBodies fails unless every row holds its document whole.
func (s *bigSource) checkBodies(t *testing.T, rows []Row) {
	t.Helper()
	for _, r := range rows {
		i, _ := strconv.Atoi(strings.TrimPrefix(r.ID, "d"))
		if !bytes.Equal(r.Doc, s.doc(i)) {
			t.Fatalf("row %s holds %d bytes, want its document (%d bytes)", r.ID, len(r.Doc), len(s.doc(i)))
		}
	}
}

// readToEnd reads c's feed from since until it is caught up, at most
// maxPages pages, fetching each page's bodies with FetchBatch when fetch is
// set. It hands every page to check, checks its bodies and counts its
// documents into seen (which may hold what the caller read before); at the
// end it fails the test unless seen holds the source's n documents, each
// once.
func (s *bigSource) readToEnd(t *testing.T, c *Client, since json.RawMessage, maxPages int, fetch bool, seen map[string]int, check func(page int, b *Batch)) {
	t.Helper()
	for page := 1; ; page++ {
		if page > maxPages {
			t.Fatalf("no end after %d pages", maxPages)
		}
		b, err := c.Changes(t.Context(), since, time.Second)
		if err != nil {
			t.Fatalf("Changes from %s: %v", since, err)
		}
		if fetch {
			if err := c.FetchBatch(t.Context(), b); err != nil {
				t.Fatalf("FetchBatch: %v", err)
			}
		}
		check(page, b)
		s.checkBodies(t, b.Rows)
		for _, r := range b.Rows {
			seen[r.ID]++
		}
		since = b.LastSeq
		if b.CaughtUp() {
			break
		}
	}
	if len(seen) != s.n {
		t.Errorf("read %d distinct documents, want %d", len(seen), s.n)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("document %s read %d times", id, n)
		}
	}
}
