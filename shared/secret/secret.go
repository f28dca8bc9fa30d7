// Package secret resolves secret references (environment variables or Secrets
// Manager secrets) to their values. Values are never logged or put in errors.
package secret

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
)

// SecretsManager is the part of the Secrets Manager client the resolver calls.
type SecretsManager interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, optFns ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

// ErrNotSet is returned when a referenced environment variable or secret is empty.
var ErrNotSet = errors.New("secret not set")

// DefaultFloor is the least time between two reads of one secret from
// Secrets Manager after a Refresh, when Resolver.Floor is zero.
const DefaultFloor = 10 * time.Second

// Resolver resolves references. It caches Secrets Manager values for the life
// of the process (one Lambda instance) until Refresh: after it, each value is
// read again on its next use, though never sooner than Floor after its
// previous read. Safe for concurrent use.
type Resolver struct {
	Lookup func(string) (string, bool) // environment lookup, os.LookupEnv in production
	SM     SecretsManager              // may be nil when no reference names a secret
	// EnvSecretPrefix, when set, resolves an env reference whose variable is
	// unset from the secret named prefix+NAME. A deployed stack sets it, so
	// the same configuration file serves local runs and AWS.
	EnvSecretPrefix string
	// Floor is the least time between two reads of one secret; zero:
	// DefaultFloor.
	Floor time.Duration
	// Now is the clock of Floor; zero: the system clock.
	Now clock.Clock

	mu        sync.Mutex
	cache     map[string]cached
	refreshed time.Time // the last Refresh
}

// cached is a secret's value and when it was read.
type cached struct {
	value string
	at    time.Time
}

// Refresh marks every cached value to be read again on its next use, no
// sooner than Floor after it was read: a caller that failed with a secret
// (an output or source refused it, or it could not be parsed) calls it, so
// that a corrected or rotated secret takes effect without a cold start.
func (r *Resolver) Refresh() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refreshed = r.Now.Now()
}

// Resolve returns the value a reference points at.
func (r *Resolver) Resolve(ctx context.Context, ref config.SecretRef) (string, error) {
	if ref.Env != "" {
		v, ok := r.Lookup(ref.Env)
		if ok && v != "" {
			return v, nil
		}
		if r.EnvSecretPrefix == "" {
			return "", fmt.Errorf("resolve env %s: %w", ref.Env, ErrNotSet)
		}
		return r.secret(ctx, r.EnvSecretPrefix+ref.Env)
	}
	raw, err := r.secret(ctx, ref.Secret)
	if err != nil {
		return "", err
	}
	if ref.JSONKey == "" {
		return raw, nil
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return "", fmt.Errorf("resolve secret %s: value is not a JSON object", ref.Secret)
	}
	v, ok := m[ref.JSONKey]
	if !ok {
		return "", fmt.Errorf("resolve secret %s key %s: %w", ref.Secret, ref.JSONKey, ErrNotSet)
	}
	if s, ok := v.(string); ok {
		return s, nil
	}
	return fmt.Sprint(v), nil
}

func (r *Resolver) secret(ctx context.Context, id string) (string, error) {
	now := r.Now.Now()
	floor := r.Floor
	if floor == 0 {
		floor = DefaultFloor
	}
	r.mu.Lock()
	c, ok := r.cache[id]
	fresh := ok && (c.at.After(r.refreshed) || now.Sub(c.at) < floor)
	r.mu.Unlock()
	if fresh {
		return c.value, nil
	}
	if r.SM == nil {
		return "", fmt.Errorf("resolve secret %s: no Secrets Manager client", id)
	}
	out, err := r.SM.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: &id})
	if err != nil {
		return "", fmt.Errorf("resolve secret %s: %w", id, err)
	}
	if out.SecretString == nil || *out.SecretString == "" {
		return "", fmt.Errorf("resolve secret %s: %w", id, ErrNotSet)
	}
	r.mu.Lock()
	if r.cache == nil {
		r.cache = map[string]cached{}
	}
	r.cache[id] = cached{value: *out.SecretString, at: now}
	r.mu.Unlock()
	return *out.SecretString, nil
}
