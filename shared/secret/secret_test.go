package secret

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
)

type fakeSM struct {
	mu    sync.Mutex
	value string
	reads int
}

func (f *fakeSM) GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, _ ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	return &secretsmanager.GetSecretValueOutput{SecretString: aws.String(f.value)}, nil
}

func (f *fakeSM) set(v string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.value = v
}

// A cached secret is read again only after Refresh, and then no sooner than
// the floor after its previous read.
func TestRefreshRereadsAfterTheFloor(t *testing.T) {
	t.Parallel()
	sm := &fakeSM{value: "old"}
	c := clock.NewManual(time.Date(2026, 11, 26, 8, 0, 0, 0, time.UTC))
	r := &Resolver{SM: sm, Floor: 10 * time.Second, Now: c.Now}
	ref := config.SecretRef{Secret: "dsn"}
	steps := []struct {
		name      string
		advance   time.Duration
		refresh   bool
		value     string // the secret's value in Secrets Manager from now on
		want      string
		wantReads int
	}{
		{name: "first use reads", value: "old", want: "old", wantReads: 1},
		{name: "cached without refresh", advance: time.Minute, value: "new", want: "old", wantReads: 1},
		{name: "refresh reads again", refresh: true, value: "new", want: "new", wantReads: 2},
		{name: "refresh within the floor keeps the value", advance: 5 * time.Second, refresh: true, value: "newer", want: "new", wantReads: 2},
		{name: "past the floor reads again", advance: 5 * time.Second, value: "newer", want: "newer", wantReads: 3},
		{name: "read since the refresh is kept", advance: time.Minute, value: "newest", want: "newer", wantReads: 3},
	}
	for _, s := range steps {
		c.Advance(s.advance)
		sm.set(s.value)
		if s.refresh {
			r.Refresh()
		}
		got, err := r.Resolve(t.Context(), ref)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got != s.want || sm.reads != s.wantReads {
			t.Errorf("%s: got %q after %d reads, want %q after %d", s.name, got, sm.reads, s.want, s.wantReads)
		}
	}
}
