package testenv

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// SyncGatewayOptions configure a Sync Gateway process.
type SyncGatewayOptions struct {
	// CertFile and KeyFile, when both set, serve every interface over TLS
	// with this certificate (PEM files).
	CertFile, KeyFile string
	// RootCAs verifies the server's certificate when TLS is on. Nil means
	// the system roots.
	RootCAs *x509.CertPool
}

// SyncGateway is a Couchbase Sync Gateway process on free loopback ports,
// in legacy configuration mode with the in-memory walrus store, admin and
// metrics authentication off. Databases are created through its admin
// interface (CreateDB). Its methods are safe for concurrent use.
type SyncGateway struct {
	// PublicURL and AdminURL are the interfaces' base URLs (no trailing slash).
	PublicURL, AdminURL string
	// HTTP is a client that trusts the server's certificate.
	HTTP *http.Client

	cmd  *exec.Cmd
	done chan struct{}
	log  string
	dir  string
}

var buildSyncGateway sync.Mutex

// SyncGatewayBinary returns the path of the pinned Sync Gateway build
// (SYNC_GATEWAY_BIN, else .local/bin/sync_gateway at the repository root),
// running localstack/syncgateway.sh first if the binary is missing or not
// the pinned version. The script is idempotent and safe to run from several
// test processes at once.
func SyncGatewayBinary() (string, error) {
	buildSyncGateway.Lock()
	defer buildSyncGateway.Unlock()
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(root, "localstack", "syncgateway.sh")
	cmd := exec.Command("bash", script)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("install sync gateway (%s): %w\n%s", script, err, tailText(stderr.String(), 20))
	}
	bin := strings.TrimSpace(string(out))
	if bin == "" {
		return "", fmt.Errorf("install sync gateway: %s printed no path", script)
	}
	return bin, nil
}

// repoRoot finds the directory holding the repository's go.mod and
// localstack/, walking up from the working directory (a test runs in its
// package's directory).
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find repository root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "localstack", "syncgateway.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find repository root: no localstack/syncgateway.sh above the working directory")
		}
		dir = parent
	}
}

// StartSyncGateway starts a Sync Gateway for one test and stops it when the
// test ends. It fails the test when the server cannot start.
func StartSyncGateway(t testing.TB, o SyncGatewayOptions) *SyncGateway {
	t.Helper()
	sg, err := NewSyncGateway(t.Context(), o)
	if err != nil {
		t.Fatalf("start sync gateway: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sync gateway log (last lines):\n%s", sg.LogTail(40))
		}
		sg.Close()
	})
	return sg
}

// NewSyncGateway starts a Sync Gateway and waits until both interfaces
// answer. Close stops it. ctx bounds only the start.
func NewSyncGateway(ctx context.Context, o SyncGatewayOptions) (*SyncGateway, error) {
	bin, err := SyncGatewayBinary()
	if err != nil {
		return nil, err
	}
	var lastErr error
	// A free port found by listening on :0 can be taken by another process
	// before Sync Gateway binds it; try again with new ports.
	for range 3 {
		sg, err := startSyncGateway(ctx, bin, o)
		if err == nil {
			return sg, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

func startSyncGateway(ctx context.Context, bin string, o SyncGatewayOptions) (*SyncGateway, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "syncgateway-")
	if err != nil {
		return nil, fmt.Errorf("sync gateway directory: %w", err)
	}
	scheme := "http"
	cfg := map[string]any{
		"disable_persistent_config":        true,
		"interface":                        fmt.Sprintf("127.0.0.1:%d", ports[0]),
		"adminInterface":                   fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"metricsInterface":                 fmt.Sprintf("127.0.0.1:%d", ports[2]),
		"admin_interface_authentication":   false,
		"metrics_interface_authentication": false,
		"logging": map[string]any{
			"log_file_path": filepath.Join(dir, "logs"),
			"console":       map[string]any{"log_level": "info", "log_keys": []string{"HTTP"}},
		},
		// Legacy mode takes its bootstrap server from the databases of
		// the file, so it needs one; the tests create theirs through the
		// admin interface.
		"databases": map[string]any{"boot": map[string]any{
			"server": "walrus:", "bucket": "boot", "num_index_replicas": 0,
			"enable_shared_bucket_access": false,
		}},
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	if o.CertFile != "" && o.KeyFile != "" {
		scheme = "https"
		cfg["SSLCert"], cfg["SSLKey"] = o.CertFile, o.KeyFile
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = &tls.Config{RootCAs: o.RootCAs, MinVersion: tls.VersionTLS12}
		hc.Transport = t
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("sync gateway config: %w", err)
	}
	cfgPath := filepath.Join(dir, "sg-config.json")
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return nil, fmt.Errorf("sync gateway logs: %w", err)
	}
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		return nil, fmt.Errorf("sync gateway config: %w", err)
	}
	logPath := filepath.Join(dir, "console.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("sync gateway log: %w", err)
	}
	cmd := exec.Command(bin, cfgPath)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	sg := &SyncGateway{
		PublicURL: fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[0]),
		AdminURL:  fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[1]),
		HTTP:      hc,
		cmd:       cmd,
		done:      make(chan struct{}),
		log:       logPath,
		dir:       dir,
	}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(sg.done)
	}()
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if sg.answers(ctx, sg.PublicURL+"/") && sg.answers(ctx, sg.AdminURL+"/") {
			return sg, nil
		}
		select {
		case <-sg.done:
			tailLog := sg.LogTail(15)
			sg.Close()
			return nil, fmt.Errorf("sync gateway exited while starting:\n%s", tailLog)
		case <-deadline.C:
			tailLog := sg.LogTail(15)
			sg.Close()
			return nil, fmt.Errorf("sync gateway did not answer within 60s:\n%s", tailLog)
		case <-ctx.Done():
			sg.Close()
			return nil, fmt.Errorf("start sync gateway: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

func (sg *SyncGateway) answers(ctx context.Context, u string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false
	}
	resp, err := sg.HTTP.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Close stops the process (SIGTERM, then SIGKILL after 10 seconds) and
// removes its directory. It is idempotent.
func (sg *SyncGateway) Close() {
	select {
	case <-sg.done:
	default:
		_ = sg.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-sg.done:
		case <-time.After(10 * time.Second):
			_ = sg.cmd.Process.Kill()
			<-sg.done
		}
	}
	_ = os.RemoveAll(sg.dir)
}

// LogTail returns the last n lines of the server's console log.
func (sg *SyncGateway) LogTail(n int) string {
	b, err := os.ReadFile(sg.log)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	return tailText(string(b), n)
}

func tailText(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// SGDatabase is one database on a SyncGateway, for one test.
type SGDatabase struct {
	sg   *SyncGateway
	t    testing.TB
	Name string

	mu        sync.Mutex
	markerRev string
}

// DefaultSyncFunction routes every document to the channels its "channels"
// property lists.
const DefaultSyncFunction = `function(doc, oldDoc){ channel(doc.channels); }`

// CreateDB creates a database named after the test on the walrus store with
// the given sync function (DefaultSyncFunction when empty).
func (sg *SyncGateway) CreateDB(t testing.TB, syncFn string) *SGDatabase {
	t.Helper()
	return sg.CreateDBConfig(t, map[string]any{"sync": syncFn})
}

// CreateDBConfig is CreateDB with more database settings (say, local_jwt);
// an empty "sync" means DefaultSyncFunction.
func (sg *SyncGateway) CreateDBConfig(t testing.TB, extra map[string]any) *SGDatabase {
	t.Helper()
	name := strings.ReplaceAll(Name(t), "-", "_")
	db := &SGDatabase{sg: sg, t: t, Name: name}
	cfg := map[string]any{
		"server": "walrus:", "bucket": name, "num_index_replicas": 0,
		"enable_shared_bucket_access": false, "sync": DefaultSyncFunction,
	}
	for k, v := range extra {
		cfg[k] = v
	}
	if cfg["sync"] == "" {
		cfg["sync"] = DefaultSyncFunction
	}
	db.Admin(http.MethodPut, "/", cfg, http.StatusCreated)
	// The database is not deleted when the test ends: Sync Gateway 3.1.0
	// stops the whole process ("Accessing closed Walrus bucket") when a
	// database is deleted while a feed with revocations=true is still being
	// built for it. It lives in memory until the server stops.
	return db
}

// URL is the database's public URL.
func (db *SGDatabase) URL() string { return db.sg.PublicURL + "/" + db.Name }

// Admin sends a request to the database's admin endpoint path (below
// /{db}), failing the test unless the status is one of want (any 2xx when
// want is empty), and returns the decoded JSON answer (nil when empty).
func (db *SGDatabase) Admin(method, path string, body any, want ...int) map[string]any {
	db.t.Helper()
	status, out := db.do(db.sg.AdminURL+"/"+db.Name+path, method, body, "", "")
	ok := status/100 == 2
	if len(want) > 0 {
		ok = false
		for _, w := range want {
			ok = ok || status == w
		}
	}
	if !ok {
		db.t.Fatalf("admin %s /%s%s: status %d: %s", method, db.Name, path, status, out)
	}
	var m map[string]any
	if len(bytes.TrimSpace(out)) > 0 {
		if err := json.Unmarshal(out, &m); err != nil {
			db.t.Fatalf("admin %s /%s%s: decode %q: %v", method, db.Name, path, out, err)
		}
	}
	return m
}

// Public sends a request to the public interface as user:password and
// returns the status and raw answer.
func (db *SGDatabase) Public(method, path, user, password string, body any) (int, []byte) {
	db.t.Helper()
	return db.do(db.URL()+path, method, body, user, password)
}

func (db *SGDatabase) do(u, method string, body any, user, password string) (int, []byte) {
	db.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			db.t.Fatalf("encode request: %v", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		db.t.Fatalf("build request: %v", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := db.sg.HTTP.Do(req)
	if err != nil {
		db.t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		db.t.Fatalf("%s %s: read answer: %v", method, u, err)
	}
	return resp.StatusCode, out
}

// PutUser creates or updates a user with a password and admin channels.
func (db *SGDatabase) PutUser(name, password string, channels ...string) {
	db.t.Helper()
	if channels == nil {
		channels = []string{}
	}
	db.Admin(http.MethodPut, "/_user/"+url.PathEscape(name),
		map[string]any{"name": name, "password": password, "admin_channels": channels})
}

// SetChannels replaces a user's admin channels (a grant or a revocation).
func (db *SGDatabase) SetChannels(name string, channels ...string) {
	db.t.Helper()
	if channels == nil {
		channels = []string{}
	}
	db.Admin(http.MethodPut, "/_user/"+url.PathEscape(name), map[string]any{"admin_channels": channels})
}

// Put writes a document through the admin interface (at rev when it is not
// empty) and returns its new revision.
func (db *SGDatabase) Put(id, rev string, body map[string]any) string {
	db.t.Helper()
	path := "/" + docSegment(id)
	if rev != "" {
		path += "?rev=" + url.QueryEscape(rev)
	}
	out := db.Admin(http.MethodPut, path, body, http.StatusCreated, http.StatusOK)
	r, _ := out["rev"].(string)
	if r == "" {
		db.t.Fatalf("put %q: no rev in %v", id, out)
	}
	return r
}

// Delete deletes a document at rev and returns the tombstone's revision.
func (db *SGDatabase) Delete(id, rev string) string {
	db.t.Helper()
	out := db.Admin(http.MethodDelete, "/"+docSegment(id)+"?rev="+url.QueryEscape(rev), nil)
	r, _ := out["rev"].(string)
	if r == "" {
		db.t.Fatalf("delete %q: no rev in %v", id, out)
	}
	return r
}

// docSegment escapes a document id as one path segment ('+' too).
func docSegment(id string) string {
	return strings.ReplaceAll(url.PathEscape(id), "+", "%2B")
}

// WaitCached waits until the database's changes cache holds every write
// made so far, so that a user's feed read next sees them (writes reach the
// cache asynchronously). It writes a marker document in no channel and waits
// for the admin feed to show it: the cache takes sequences in order, so the
// writes before the marker (principal updates too, which the admin feed
// does not list) are in by then. Only the admin feed shows the marker.
func (db *SGDatabase) WaitCached() {
	db.t.Helper()
	db.mu.Lock()
	defer db.mu.Unlock()
	// The marker's sequence is above the one the database reports before
	// the write. The one it reports after the write is no bound to wait
	// for: it counts the sequences Sync Gateway reserved and released
	// unused, which no feed ever lists.
	info := db.Admin(http.MethodGet, "/", nil)
	before, _ := info["update_seq"].(float64)
	db.markerRev = db.Put(cacheMarker, db.markerRev, map[string]any{"channels": []string{}})
	deadline := time.Now().Add(20 * time.Second)
	for {
		out := db.Admin(http.MethodGet, fmt.Sprintf("/_changes?feed=normal&since=%d", int64(before)), nil)
		if markerListed(out, db.markerRev) {
			return
		}
		if time.Now().After(deadline) {
			db.t.Fatalf("changes cache of %s did not list the marker %s (rev %s, written after update_seq %v) within 20s (last_seq %v)",
				db.Name, cacheMarker, db.markerRev, before, out["last_seq"])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// markerListed reports whether an admin changes feed lists the cache marker
// at revision rev.
func markerListed(feed map[string]any, rev string) bool {
	results, _ := feed["results"].([]any)
	for _, r := range results {
		entry, _ := r.(map[string]any)
		if entry["id"] != cacheMarker {
			continue
		}
		changes, _ := entry["changes"].([]any)
		for _, c := range changes {
			if change, _ := c.(map[string]any); change["rev"] == rev {
				return true
			}
		}
	}
	return false
}

// cacheMarker is the document WaitCached writes.
const cacheMarker = "zz-cache-marker"

// Visible returns doc id → rev of every live document user can read, from
// the public _all_docs: what the user's outputs must end up holding.
func (db *SGDatabase) Visible(user, password string) map[string]string {
	db.t.Helper()
	status, body := db.Public(http.MethodGet, "/_all_docs", user, password, nil)
	if status != http.StatusOK {
		db.t.Fatalf("%s _all_docs: %d %s", user, status, body)
	}
	var all AllDocs
	if err := json.Unmarshal(body, &all); err != nil {
		db.t.Fatalf("decode _all_docs: %v", err)
	}
	return all.Winners()
}
