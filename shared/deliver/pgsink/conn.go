package pgsink

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/config"
)

// ErrPlaintextFallback: the connection string leaves pgx free to connect
// without TLS when TLS fails or is refused (sslmode missing, prefer or
// allow), so a connection could go in clear text without anyone choosing it.
var ErrPlaintextFallback = errors.New("postgres dsn: its sslmode lets a connection fall back to clear text")

// PoolConfig parses dsn, a PostgreSQL output's connection string, into a
// pool configuration whose connections trust the certificate authorities of
// tls (when set, as the connection's sslrootcert, in place of any the
// string names). It refuses, with ErrPlaintextFallback, a string whose
// connections may go without TLS unless it says so with sslmode=disable:
// one without sslmode, or with prefer or allow. Its errors never show dsn,
// which holds the password.
func PoolConfig(dsn string, tls *config.TLS) (*pgxpool.Config, error) {
	if tls != nil {
		ca, err := caFile(tls)
		if err != nil {
			return nil, err
		}
		if dsn, err = withSetting(dsn, "sslrootcert", ca); err != nil {
			return nil, err
		}
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// The parse error can echo the DSN, password included: never wrap it.
		return nil, errors.New("parse postgres dsn: malformed connection string")
	}
	clear, encrypted := connectsInClear(&cfg.ConnConfig.Config)
	switch {
	case clear && encrypted:
		return nil, fmt.Errorf("%w: set sslmode=verify-full (postgres.tls names a private CA, such as the RDS CA bundle), or sslmode=disable to connect without TLS", ErrPlaintextFallback)
	case clear && tls != nil:
		return nil, errors.New("postgres dsn: sslmode=disable connects without TLS, yet postgres.tls names certificate authorities: set sslmode=verify-full")
	}
	return cfg, nil
}

// connectsInClear reports whether any of cfg's connection attempts (the
// first and its fallbacks) goes without TLS, and whether any goes with it.
func connectsInClear(cfg *pgconn.Config) (clear, encrypted bool) {
	attempt := func(tls bool) {
		clear = clear || !tls
		encrypted = encrypted || tls
	}
	attempt(cfg.TLSConfig != nil)
	for _, f := range cfg.Fallbacks {
		attempt(f.TLSConfig != nil)
	}
	return clear, encrypted
}

// caFile returns the path of the PEM bundle tls names: its ca_file, read to
// check it holds a certificate, or its ca_pem written once to a file of the
// temporary directory named after its content.
func caFile(tls *config.TLS) (string, error) {
	pem, path := []byte(tls.CAPEM), tls.CAFile
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("read postgres.tls.ca_file: %w", err)
		}
		pem = b
	}
	if !x509.NewCertPool().AppendCertsFromPEM(pem) {
		return "", errors.New("postgres.tls: the bundle holds no PEM certificate")
	}
	if path != "" {
		return path, nil
	}
	sum := sha256.Sum256(pem)
	path = filepath.Join(os.TempDir(), "changes-worker-pg-ca-"+hex.EncodeToString(sum[:12])+".pem")
	if b, err := os.ReadFile(path); err == nil && string(b) == tls.CAPEM {
		return path, nil
	}
	// Written beside and renamed, so that a pool opened at the same time
	// never reads half a bundle.
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return "", fmt.Errorf("write postgres.tls.ca_pem: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(pem); err != nil {
		tmp.Close()
		return "", fmt.Errorf("write postgres.tls.ca_pem: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("write postgres.tls.ca_pem: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("write postgres.tls.ca_pem: %w", err)
	}
	return path, nil
}

// withSetting returns dsn with the setting key set to value, in either of
// the forms pgx reads: a URL (postgres://...?key=value) or keyword=value
// pairs, where a later pair replaces an earlier one.
func withSetting(dsn, key, value string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", errors.New("parse postgres dsn: malformed connection string")
		}
		q := u.Query()
		q.Set(key, value)
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	quoted := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(value)
	return dsn + " " + key + "='" + quoted + "'", nil
}
