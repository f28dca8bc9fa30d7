// Package receiver is a reference receiver for HTTP outputs: it stores each
// document it is sent as a JSON file and, like any receiver should, applies a
// change only when its X-Changes-Version is newer than the one it holds. The
// demo and the tests use it as the REST endpoint.
package receiver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
)

// DefaultMaxBody is the largest body a Server takes: the most the poller
// reads of one source answer (config.DefaultMaxAnswerBytes), so no document
// body is larger.
const DefaultMaxBody = config.DefaultMaxAnswerBytes

// Server stores documents under Dir. Safe for concurrent use.
type Server struct {
	Dir string
	// MaxBody bounds the body of a request: a longer one is answered 413
	// once MaxBody bytes were read, and nothing is stored. Default
	// DefaultMaxBody.
	MaxBody int64

	mu       sync.Mutex
	versions map[string]change.Version
	puts     int
	deletes  int
	stale    int
	// Fail, when set, answers instead of storing (fault injection).
	fail func(r *http.Request) int
}

// New returns a server storing into dir, which is created.
func New(dir string) (*Server, error) {
	for _, d := range []string{dir, partialDir(dir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("create receiver dir: %w", err)
		}
	}
	return &Server{Dir: dir, versions: map[string]change.Version{}}, nil
}

// partialDir holds the documents being written, beside dir on the same file
// system, so that a document appears in dir whole, by a rename.
func partialDir(dir string) string {
	return filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".partial")
}

// store writes body as the file name in s.Dir, replacing it at once: a
// reader finds the old document or the new one, never part of one.
func (s *Server) store(name string, body []byte) error {
	f, err := os.CreateTemp(partialDir(s.Dir), name+".*")
	if err != nil {
		return err
	}
	if _, err := f.Write(body); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		os.Remove(f.Name())
		return err
	}
	return os.Rename(f.Name(), filepath.Join(s.Dir, name))
}

// FailWith makes the server answer status (when f returns non-zero) instead
// of storing.
func (s *Server) FailWith(f func(r *http.Request) int) {
	s.mu.Lock()
	s.fail = f
	s.mu.Unlock()
}

// Counts returns how many writes, deletes and stale (ignored) changes arrived.
func (s *Server) Counts() (puts, deletes, stale int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.puts, s.deletes, s.stale
}

// ServeHTTP handles PUT/POST/PATCH and DELETE on /docs/{id}.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw := strings.TrimPrefix(r.URL.EscapedPath(), "/docs/")
	id, err := url.PathUnescape(raw)
	if err != nil || raw == r.URL.EscapedPath() || id == "" {
		http.Error(w, "want /docs/{id}", http.StatusNotFound)
		return
	}
	v, err := parseVersion(r.Header.Get("X-Changes-Version"))
	if err != nil {
		http.Error(w, "bad X-Changes-Version", http.StatusBadRequest)
		return
	}
	var body []byte
	switch r.Method {
	case http.MethodPut, http.MethodPost, http.MethodPatch:
		// Read before taking the lock: a slow sender holds up no other.
		limit := s.MaxBody
		if limit <= 0 {
			limit = DefaultMaxBody
		}
		if body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, limit)); err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "read body", http.StatusBadRequest)
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		if code := s.fail(r); code != 0 {
			w.WriteHeader(code)
			return
		}
	}
	if cur, ok := s.versions[id]; ok && v.Compare(cur) <= 0 {
		s.stale++
		w.WriteHeader(http.StatusOK)
		return
	}
	path := filepath.Join(s.Dir, FileName(id))
	switch r.Method {
	case http.MethodPut, http.MethodPost, http.MethodPatch:
		if err := s.store(FileName(id), body); err != nil {
			http.Error(w, "store", http.StatusInternalServerError)
			return
		}
		s.puts++
	case http.MethodDelete:
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			http.Error(w, "delete", http.StatusInternalServerError)
			return
		}
		s.deletes++
	default:
		http.Error(w, "method", http.StatusMethodNotAllowed)
		return
	}
	s.versions[id] = v
	w.WriteHeader(http.StatusNoContent)
}

// Doc is a document the server holds.
type Doc struct {
	ID   string
	Rev  string          // the revision its body names (_rev)
	Body json.RawMessage // as the last change applied sent it
}

// Docs reads the documents the server holds from Dir, by id. It may run
// while the server stores: each document is read whole (see store), and
// one deleted meanwhile is left out.
func (s *Server) Docs() (map[string]Doc, error) {
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil, fmt.Errorf("read receiver dir: %w", err)
	}
	docs := make(map[string]Doc, len(entries))
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		id, err := url.PathUnescape(name)
		if !ok || err != nil || FileName(id) != e.Name() {
			continue // not a document's file
		}
		body, err := os.ReadFile(filepath.Join(s.Dir, e.Name()))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read document %q: %w", id, err)
		}
		var d struct {
			Rev string `json:"_rev"`
		}
		if err := json.Unmarshal(body, &d); err != nil {
			return nil, fmt.Errorf("decode document %q: %w", id, err)
		}
		docs[id] = Doc{ID: id, Rev: d.Rev, Body: body}
	}
	return docs, nil
}

// FileName is the file a document is stored in: its path-escaped id, which
// never contains a separator.
func FileName(id string) string {
	return strings.ReplaceAll(url.PathEscape(id), ".", "%2E") + ".json"
}

func parseVersion(s string) (change.Version, error) {
	g, c, ok := strings.Cut(s, ".")
	if !ok {
		return change.Version{}, fmt.Errorf("version %q", s)
	}
	gen, err1 := strconv.ParseInt(g, 10, 64)
	cnt, err2 := strconv.ParseInt(c, 10, 64)
	if err1 != nil || err2 != nil {
		return change.Version{}, fmt.Errorf("version %q", s)
	}
	return change.Version{Generation: gen, Counter: cnt}, nil
}
