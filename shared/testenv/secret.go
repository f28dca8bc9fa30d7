package testenv

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
)

// Secret creates a Secrets Manager secret on the local emulator, named after
// label and unique, holding value; it is deleted when the test ends. put
// stores a new value, as an operator correcting or rotating it does.
func Secret(t testing.TB, label, value string) (name string, put func(value string)) {
	t.Helper()
	sm := secretsmanager.NewFromConfig(AWS(t))
	name = UniqueName(label)
	if _, err := sm.CreateSecret(t.Context(), &secretsmanager.CreateSecretInput{Name: &name, SecretString: &value}); err != nil {
		t.Fatalf("create secret %s: %v", name, err)
	}
	t.Cleanup(func() {
		_, _ = sm.DeleteSecret(context.Background(), &secretsmanager.DeleteSecretInput{SecretId: &name, ForceDeleteWithoutRecovery: aws.Bool(true)})
	})
	put = func(value string) {
		t.Helper()
		if _, err := sm.PutSecretValue(t.Context(), &secretsmanager.PutSecretValueInput{SecretId: &name, SecretString: &value}); err != nil {
			t.Fatalf("put secret %s: %v", name, err)
		}
	}
	return name, put
}
