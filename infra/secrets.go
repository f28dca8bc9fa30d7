package main

import (
	"fmt"
	"hash/crc32"

	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/jsii-runtime-go"

	"github.com/changes-worker/changes-worker/shared/config"
)

// secretGrants resolves the secret references of the configuration to
// secrets the functions may read: {"env": "NAME"} to a secret named
// <prefix>/NAME that the stack creates with a placeholder value, and
// {"secret": "name-or-ARN"} to the existing secret, imported by name or ARN.
// No secret value ever appears in the template.
type secretGrants struct {
	s        *changesStack
	env      map[string]awssecretsmanager.Secret
	existing map[string]awssecretsmanager.ISecret
}

// newSecretGrants creates one placeholder secret per distinct env reference.
func (s *changesStack) newSecretGrants() *secretGrants {
	g := &secretGrants{s: s, env: map[string]awssecretsmanager.Secret{}, existing: map[string]awssecretsmanager.ISecret{}}
	for _, name := range envSecretNames(s.in.sourceSecrets, s.in.outputSecrets) {
		secret := awssecretsmanager.NewSecret(s.stack, jsii.String("EnvSecret-"+name), &awssecretsmanager.SecretProps{
			SecretName: jsii.String(s.cfg.Stack.Prefix + "/" + name),
			Description: jsii.String(fmt.Sprintf(
				"changes-worker %s: the value of %s. Created with a random placeholder: put the real value here after deploy.",
				s.cfg.Stack.Prefix, name)),
			GenerateSecretString: &awssecretsmanager.SecretStringGenerator{
				PasswordLength:     jsii.Number(32),
				ExcludePunctuation: jsii.Bool(true),
			},
			RemovalPolicy: s.removalPolicy(),
		})
		s.suppress(secret, "AwsSolutions-SMG4",
			"The secret holds a credential issued by an external system (source database, output endpoint or database); its owner rotates it and updates this secret, there is no rotation Lambda to run.")
		g.env[name] = secret
	}
	return g
}

// grant lets role read the secrets refs point at.
func (g *secretGrants) grant(role awsiam.IRole, refs []config.SecretRef) {
	for _, r := range refs {
		if r.Env != "" {
			g.env[r.Env].GrantRead(role, nil)
			continue
		}
		g.lookup(r.Secret).GrantRead(role, nil)
	}
}

// lookup imports an existing secret once. Its name or ARN was checked by
// loadInput.
func (g *secretGrants) lookup(ref string) awssecretsmanager.ISecret {
	if s, ok := g.existing[ref]; ok {
		return s
	}
	id := jsii.String(fmt.Sprintf("Secret-%08x", crc32.ChecksumIEEE([]byte(ref))))
	kind, _ := classifySecret(ref)
	var secret awssecretsmanager.ISecret
	switch kind {
	case secretByCompleteARN:
		secret = awssecretsmanager.Secret_FromSecretCompleteArn(g.s.stack, id, jsii.String(ref))
	case secretByPartialARN:
		secret = awssecretsmanager.Secret_FromSecretPartialArn(g.s.stack, id, jsii.String(ref))
	default:
		secret = awssecretsmanager.Secret_FromSecretNameV2(g.s.stack, id, jsii.String(ref))
	}
	g.existing[ref] = secret
	return secret
}
