package syncgateway

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/feed"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// testCA is a certificate authority made for one test, and a server
// certificate it signed for 127.0.0.1.
type testCA struct {
	caPEM             []byte
	certFile, keyFile string
	pool              *x509.CertPool
	otherPEM          []byte // a CA that signed nothing here
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	dir := t.TempDir()
	// issue makes a key and a certificate for it from tmpl, signed by
	// parent's key (self-signed when parent is nil).
	issue := func(tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) ([]byte, *ecdsa.PrivateKey) {
		t.Helper()
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if parent == nil {
			parent, parentKey = tmpl, key
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, key
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "changes-worker test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, caKey := issue(caTmpl, nil, nil)
	caCert, _ := x509.ParseCertificate(caDER)
	srvDER, srvKey := issue(&x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "sync gateway"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, caCert, caKey)
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{
		caPEM:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		certFile: filepath.Join(dir, "server.pem"),
		keyFile:  filepath.Join(dir, "server.key"),
		pool:     x509.NewCertPool(),
	}
	ca.pool.AddCert(caCert)
	if err := os.WriteFile(ca.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca.keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	otherDER, _ := issue(caTmpl, nil, nil)
	ca.otherPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: otherDER})
	return ca
}

// TestTLSWithCABundle: a Sync Gateway serving https with a certificate from
// a private CA (the shape of Capella App Services) is read when the job
// names the CA bundle (source.tls), and refused, permanently, when not.
func TestTLSWithCABundle(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	tlsSG := testenv.StartSyncGateway(t, testenv.SyncGatewayOptions{CertFile: ca.certFile, KeyFile: ca.keyFile, RootCAs: ca.pool})
	if !strings.HasPrefix(tlsSG.PublicURL, "https://") {
		t.Fatalf("public URL %s is not https", tlsSG.PublicURL)
	}
	db := tlsSG.CreateDB(t, "")
	db.PutUser("alice", "alicepw", "orders")
	o1 := db.Put("o1", "", orders(1, "orders"))
	db.WaitCached()

	for _, fetch := range fetchModes {
		c := client(t, db.URL(), "alice", func(o *feed.Options) { o.CAPEM, o.Fetch = ca.caPEM, fetch })
		got, _, _, _ := readAll(t, c, nil)
		if got["o1"].Rev != o1 || got["o1"].Body == nil {
			t.Errorf("%s over TLS: %+v", fetch, got)
		}
	}

	for name, bundle := range map[string][]byte{"system roots only": nil, "another CA": ca.otherPEM} {
		c := client(t, db.URL(), "alice", func(o *feed.Options) { o.CAPEM = bundle })
		_, err := c.Changes(t.Context(), nil, 0)
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("%s: error %v, want a certificate error", name, err)
		}
		if feed.Transient(err) {
			t.Errorf("%s: Transient(%v) = true; an untrusted certificate needs a person", name, err)
		}
	}

	// The same through the job configuration, as the poller builds it.
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tlsCfg := range map[string]string{
		"ca_file": fmt.Sprintf(`{"ca_file": %q}`, caFile),
		"ca_pem":  fmt.Sprintf(`{"ca_pem": %q}`, ca.caPEM),
	} {
		cfg := loadConfig(t, fmt.Sprintf(`{"jobs":[{"id":"tls","source":{"type":"sync_gateway","url":%q,"tls":%s,
			"auth":{"type":"basic","username":"alice","password":{"env":"SG_TEST_PASSWORD"}}},
			"outputs":[{"id":"pg","type":"postgres","postgres":{"dsn":{"env":"SG_TEST_PG_DSN"}}}]}]}`, db.URL(), tlsCfg))
		deps := pipeline.New(cfg, testenv.AWS(t), func(k string) (string, bool) {
			if k == "SG_TEST_PASSWORD" {
				return "alicepw", true
			}
			return "", false
		}, slog.New(slog.DiscardHandler), io.Discard)
		t.Cleanup(deps.Close)
		c, err := deps.Feed(t.Context(), cfg.Jobs[0])
		if err != nil {
			t.Fatalf("%s: build the job's feed: %v", name, err)
		}
		if b, err := c.Changes(t.Context(), nil, 0); err != nil || len(b.Rows) == 0 {
			t.Errorf("%s: job feed over TLS: %v (%d rows)", name, err, len(b.Rows))
		}
	}
	if _, err := config.Parse([]byte(`{"jobs":[{"id":"tls","source":{"type":"sync_gateway","url":"http://h/db","tls":{"ca_pem":"x"}},
		"outputs":[{"id":"pg","type":"postgres","postgres":{"dsn":{"env":"X"}}}]}]}`)); err == nil ||
		!strings.Contains(err.Error(), "source.tls: needs an https source.url") || !strings.Contains(err.Error(), "ca_pem: holds no PEM certificate") {
		t.Errorf("config with tls on http and a bad bundle: %v", err)
	}
}

func loadConfig(t *testing.T, doc string) *config.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), "jobs.json")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("load config: %v", err)
	}
	return cfg
}

// TestBearerAuth: a job authenticating with a bearer token (a JWT that Sync
// Gateway verifies with a local_jwt provider) reads what its user may see;
// a token signed by another key is refused with a permanent 401.
func TestBearerAuth(t *testing.T) {
	t.Parallel()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	jwk := map[string]any{"kty": "RSA", "kid": "k1", "alg": "RS256", "use": "sig",
		"n": b64(key.N.Bytes()), "e": b64(big.NewInt(int64(key.E)).Bytes())}
	const issuer = "https://issuer.changes-worker.test"
	db := sg.CreateDBConfig(t, map[string]any{"local_jwt": map[string]any{"test": map[string]any{
		"issuer": issuer, "client_id": "changes-worker", "algorithms": []string{"RS256"},
		"keys": []any{jwk}, "username_claim": "sub", "register": false,
	}}})
	db.PutUser("alice", "alicepw", "orders")
	o1 := db.Put("o1", "", orders(1, "orders"))
	db.Put("e1", "", orders(2, "eu"))
	db.WaitCached()

	token := signJWT(t, key, map[string]any{"iss": issuer, "sub": "alice", "aud": "changes-worker",
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()})
	for _, fetch := range fetchModes {
		c := client(t, db.URL(), "", func(o *feed.Options) { o.Token, o.Fetch = token, fetch })
		got, _, _, _ := readAll(t, c, nil)
		if got["o1"].Rev != o1 || got["o1"].Body == nil || len(got) != 1 {
			t.Errorf("%s with a bearer token: %+v, want alice's o1 only", fetch, got)
		}
	}

	other, _ := rsa.GenerateKey(rand.Reader, 2048)
	bad := signJWT(t, other, map[string]any{"iss": issuer, "sub": "alice", "aud": "changes-worker",
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()})
	_, err = client(t, db.URL(), "", func(o *feed.Options) { o.Token = bad }).Changes(t.Context(), nil, 0)
	var se *feed.StatusError
	if !errors.As(err, &se) || se.Status != http.StatusUnauthorized || feed.Transient(err) {
		t.Errorf("a token signed by another key: %v, want a permanent 401", err)
	}
	if strings.Contains(fmt.Sprint(err), bad[:20]) {
		t.Errorf("error %v shows the token", err)
	}
}

// signJWT returns an RS256 JWT with kid k1.
func signJWT(t *testing.T, key *rsa.PrivateKey, claims map[string]any) string {
	t.Helper()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	signed := enc(map[string]any{"alg": "RS256", "typ": "JWT", "kid": "k1"}) + "." + enc(claims)
	sum := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}
