package pgsink

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/changes-worker/changes-worker/shared/config"
)

// testCA is a certificate authority and a server certificate it signed for
// 127.0.0.1.
type testCA struct {
	pem    string // the CA certificate
	server tls.Certificate
}

func newTestCA(t *testing.T) testCA {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey, srvKey := key(), key()
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{
		pem:    string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})),
		server: tls.Certificate{Certificate: [][]byte{srvDER}, PrivateKey: srvKey},
	}
}

// tlsServer is the start of a PostgreSQL server: it answers the client's
// SSLRequest with 'S', reads the startup message over TLS with cert if the
// client accepts it, and closes. handshakes receives each connection's
// result: nil when the startup message came.
func tlsServer(t *testing.T, cert tls.Certificate) (addr string, handshakes <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	results := make(chan error, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				var req [8]byte
				if _, err := io.ReadFull(c, req[:]); err != nil {
					results <- fmt.Errorf("read ssl request: %w", err)
					return
				}
				if code := binary.BigEndian.Uint32(req[4:]); code != 80877103 {
					results <- fmt.Errorf("the client did not ask for TLS (code %d)", code)
					return
				}
				if _, err := c.Write([]byte{'S'}); err != nil {
					results <- err
					return
				}
				// The startup message comes only once the client has
				// accepted the server's certificate.
				tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}})
				var startup [8]byte
				if _, err := io.ReadFull(tc, startup[:]); err != nil {
					results <- fmt.Errorf("read startup message over TLS: %w", err)
					return
				}
				results <- nil
			}()
		}
	}()
	return ln.Addr().String(), results
}

// TestPoolConfigTrustsPostgresTLS: with postgres.tls (ca_pem or ca_file) a
// connection with sslmode=verify-full verifies the server against that CA
// and completes its TLS handshake; without it the same server is refused.
func TestPoolConfigTrustsPostgresTLS(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	t.Setenv("PGSSLROOTCERT", "")
	ca := newTestCA(t)
	caPath := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caPath, []byte(ca.pem), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		dsn    string // ADDR, HOST and PORT stand for the server's
		tls    *config.TLS
		accept bool
	}{
		{name: "ca_pem, url", dsn: "postgres://u:pw-456@ADDR/db?sslmode=verify-full&connect_timeout=5", tls: &config.TLS{CAPEM: ca.pem}, accept: true},
		{name: "ca_file, keywords", dsn: "host=HOST port=PORT user=u password=pw-456 dbname=db sslmode=verify-full connect_timeout=5", tls: &config.TLS{CAFile: caPath}, accept: true},
		{name: "ca_pem replaces the dsn's sslrootcert", dsn: "postgres://u:pw-456@ADDR/db?sslmode=verify-full&connect_timeout=5&sslrootcert=/nonexistent.pem", tls: &config.TLS{CAPEM: ca.pem}, accept: true},
		{name: "no postgres.tls", dsn: "postgres://u:pw-456@ADDR/db?sslmode=verify-full&connect_timeout=5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, handshakes := tlsServer(t, ca.server)
			host, port, _ := net.SplitHostPort(addr)
			dsn := strings.NewReplacer("ADDR", addr, "HOST", host, "PORT", port).Replace(tt.dsn)
			cfg, err := PoolConfig(dsn, tt.tls)
			if err != nil {
				t.Fatalf("PoolConfig: %v", err)
			}
			_, connErr := pgconn.ConnectConfig(t.Context(), &cfg.ConnConfig.Config)
			if connErr == nil {
				t.Fatal("connected to a server that closes after the handshake")
			}
			var handshake error
			select {
			case handshake = <-handshakes:
			case <-time.After(10 * time.Second):
				t.Fatal("no connection reached the server")
			}
			if tt.accept && handshake != nil {
				t.Errorf("server: %v (client: %v), want the server verified by the configured CA", handshake, connErr)
			}
			if !tt.accept && (handshake == nil || !strings.Contains(connErr.Error(), "certificate")) {
				t.Errorf("server: %v, client: %v: want the server's certificate refused", handshake, connErr)
			}
			if strings.Contains(connErr.Error(), "pw-456") {
				t.Errorf("error shows the password: %v", connErr)
			}
		})
	}
}

// TestPoolConfigRefuses: connection strings that may go without TLS, and
// certificate authorities that cannot be used, are refused by name, without
// showing the connection string.
func TestPoolConfigRefuses(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	ca := newTestCA(t)
	tests := []struct {
		name string
		dsn  string
		tls  *config.TLS
		want string
		is   error
	}{
		{name: "prefer with a CA", dsn: "postgres://u:pw-456@127.0.0.1:1/db", tls: &config.TLS{CAPEM: ca.pem}, is: ErrPlaintextFallback, want: "sslmode=verify-full"},
		{name: "disable with a CA", dsn: "postgres://u:pw-456@127.0.0.1:1/db?sslmode=disable", tls: &config.TLS{CAPEM: ca.pem}, want: "sslmode=disable connects without TLS"},
		{name: "ca_file missing", dsn: "postgres://u:pw-456@127.0.0.1:1/db?sslmode=verify-full", tls: &config.TLS{CAFile: filepath.Join(t.TempDir(), "none.pem")}, want: "read postgres.tls.ca_file"},
		{name: "ca_pem not a certificate", dsn: "postgres://u:pw-456@127.0.0.1:1/db?sslmode=verify-full", tls: &config.TLS{CAPEM: "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"}, want: "holds no PEM certificate"},
		{name: "malformed", dsn: "postgres://u:pw-456@127.0.0.1:port/db", want: "malformed connection string"},
		{name: "malformed, with a CA", dsn: "postgres://u:pw-456@127.0.0.1:port/db", tls: &config.TLS{CAPEM: ca.pem}, want: "malformed connection string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := PoolConfig(tt.dsn, tt.tls)
			if err == nil || !strings.Contains(err.Error(), tt.want) || (tt.is != nil && !errors.Is(err, tt.is)) {
				t.Fatalf("PoolConfig error = %v, want one containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "pw-456") {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}
}
