package faults

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// AttachmentFault is what a SourceProxy does to the downloads of one
// attachment.
type AttachmentFault struct {
	// Cut ends the first Cut downloads after CutAfter bytes (half the
	// content when 0), short of their Content-Length: a connection lost
	// mid-transfer.
	Cut      int
	CutAfter int64
	// BytesPerSecond, when above 0, is the rate at which the content is
	// sent, in chunks of a tenth of it every 100 ms.
	BytesPerSecond int
	// Stall sends the first bytes of every download, then nothing, the
	// connection staying open until the client gives up.
	Stall bool
}

// SourceProxy is an HTTP proxy in front of a CouchDB-compatible source
// that misbehaves on the downloads of chosen attachments (GET
// /{db}/{doc}/{name}) and may rewrite the source's other answers; every
// other request passes through unchanged. Safe for concurrent use.
type SourceProxy struct {
	srv    *httptest.Server
	path   string // the database's path at the target
	target *url.URL
	rp     *httputil.ReverseProxy

	mu        sync.Mutex
	faults    map[string]*AttachmentFault // by attachment name
	downloads map[string]int
	rewrites  [][2]string
}

// NewSourceProxy starts a proxy in front of the database at dbURL
// (http://host:port/db). Close it when done.
func NewSourceProxy(dbURL string) (*SourceProxy, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return nil, err
	}
	p := &SourceProxy{path: u.Path, target: &url.URL{Scheme: u.Scheme, Host: u.Host},
		faults: map[string]*AttachmentFault{}, downloads: map[string]int{}}
	p.rp = httputil.NewSingleHostReverseProxy(p.target)
	p.rp.ModifyResponse = p.rewrite
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	return p, nil
}

// URL is the database's URL through the proxy.
func (p *SourceProxy) URL() string { return p.srv.URL + p.path }

// Close stops the proxy.
func (p *SourceProxy) Close() { p.srv.Close() }

// Attachment sets what happens to the downloads of the attachments named
// name, in any document.
func (p *SourceProxy) Attachment(name string, f AttachmentFault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults[name] = &f
}

// Rewrite replaces old with new in every answer other than an attachment's
// download (the feed, the documents' bodies).
func (p *SourceProxy) Rewrite(old, new string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rewrites = append(p.rewrites, [2]string{old, new})
}

// Downloads returns how many downloads of the attachments named name began.
func (p *SourceProxy) Downloads(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.downloads[name]
}

func (p *SourceProxy) serve(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(r.URL.EscapedPath(), "/"), "/")
	if r.Method != http.MethodGet || len(parts) != 3 || strings.HasPrefix(parts[1], "_") {
		p.mu.Lock()
		rewriting := len(p.rewrites) > 0
		p.mu.Unlock()
		if rewriting {
			// Answers to rewrite are asked for whole, not compressed.
			r.Header.Del("Accept-Encoding")
		}
		p.rp.ServeHTTP(w, r)
		return
	}
	name, err := url.PathUnescape(parts[2])
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	f, faulty := p.faults[name]
	p.downloads[name]++
	var fault AttachmentFault
	if faulty {
		fault = *f
		if f.Cut > 0 {
			f.Cut--
		}
	}
	p.mu.Unlock()
	if !faulty {
		p.rp.ServeHTTP(w, r)
		return
	}
	content, status, header, err := p.fetch(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if status != http.StatusOK {
		w.WriteHeader(status)
		_, _ = w.Write(content)
		return
	}
	if ct := header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(content)))
	send := content
	if fault.Cut > 0 {
		n := fault.CutAfter
		if n <= 0 || n >= int64(len(content)) {
			n = int64(len(content)) / 2
		}
		send = content[:n]
	}
	if fault.Stall {
		send = content[:min(len(content), 16)]
	}
	chunk, every := len(send), time.Duration(0)
	if fault.BytesPerSecond > 0 {
		chunk, every = max(fault.BytesPerSecond/10, 1), 100*time.Millisecond
	}
	for len(send) > 0 {
		n := min(chunk, len(send))
		if _, err := w.Write(send[:n]); err != nil {
			return
		}
		w.(http.Flusher).Flush()
		send = send[n:]
		if every > 0 && len(send) > 0 {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(every):
			}
		}
	}
	switch {
	case fault.Stall:
		<-r.Context().Done()
	case fault.Cut > 0:
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
	}
}

// fetch reads the attachment whole from the source, as it stores it.
func (p *SourceProxy) fetch(r *http.Request) ([]byte, int, http.Header, error) {
	u := *r.URL
	u.Scheme, u.Host = p.target.Scheme, p.target.Host
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, 0, nil, err
	}
	req.Header = r.Header.Clone()
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return b, resp.StatusCode, resp.Header, err
}

// rewrite applies the rewrites to an answer as it streams (a long poll's
// answer comes when the source has something to say).
func (p *SourceProxy) rewrite(resp *http.Response) error {
	p.mu.Lock()
	rewrites := p.rewrites
	p.mu.Unlock()
	if len(rewrites) == 0 {
		return nil
	}
	resp.Body = &replacer{rc: resp.Body, rewrites: rewrites}
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
	resp.Header.Del("Content-Encoding")
	return nil
}

// replacer replaces the rewrites' old strings in a stream, holding back
// the bytes that may begin one until the next read.
type replacer struct {
	rc       io.ReadCloser
	rewrites [][2]string
	pending  []byte // read, not yet replaced
	out      []byte // replaced, not yet returned
	eof      bool
}

func (r *replacer) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.eof {
			if len(r.pending) == 0 {
				return 0, io.EOF
			}
			r.out, r.pending = r.replace(r.pending), nil
			break
		}
		buf := make([]byte, 32<<10)
		n, err := r.rc.Read(buf)
		r.pending = append(r.pending, buf[:n]...)
		if err == io.EOF {
			r.eof = true
		} else if err != nil {
			return 0, err
		}
		keep := 0
		for _, rw := range r.rewrites {
			keep = max(keep, len(rw[0])-1)
		}
		if !r.eof && len(r.pending) > keep {
			cut := len(r.pending) - keep
			// Never cut through an old string: a match that starts
			// before cut ends within pending, and moves cut to its end.
			for _, rw := range r.rewrites {
				old := []byte(rw[0])
				for i := max(0, cut-len(old)+1); i < cut; i++ {
					if bytes.HasPrefix(r.pending[i:], old) {
						cut = i + len(old)
					}
				}
			}
			done := r.replace(r.pending[:cut])
			r.out, r.pending = done, append([]byte(nil), r.pending[cut:]...)
		}
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

// replace applies the rewrites to b.
func (r *replacer) replace(b []byte) []byte {
	for _, rw := range r.rewrites {
		b = bytes.ReplaceAll(b, []byte(rw[0]), []byte(rw[1]))
	}
	return b
}

func (r *replacer) Close() error { return r.rc.Close() }
