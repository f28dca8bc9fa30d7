package main

import (
	"fmt"
	"hash/crc32"

	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/jsii-runtime-go"

	"github.com/changes-worker/changes-worker/shared/config"
)

// addEnvSecrets creates, in the shared stack, one secret per distinct
// {"env": "NAME"} reference of any job: <prefix>/NAME, with a random
// placeholder value. Jobs share a secret they both name. No secret value
// ever appears in the template.
func (s *changesStack) addEnvSecrets() {
	s.envSecrets = map[string]awssecretsmanager.Secret{}
	for _, name := range envSecretNames(s.in.sourceSecrets, s.in.outputSecrets) {
		secret := awssecretsmanager.NewSecret(s.stack, jsii.String("EnvSecret-"+name), &awssecretsmanager.SecretProps{
			SecretName: jsii.String(envSecretName(s.cfg, name)),
			Description: jsii.String(fmt.Sprintf(
				"changes-worker %s: the value of %s. Created with a random placeholder: put the real value here after deploy.",
				s.cfg.Stack.Prefix, name)),
			GenerateSecretString: &awssecretsmanager.SecretStringGenerator{
				PasswordLength:     jsii.Number(32),
				ExcludePunctuation: jsii.Bool(true),
			},
			RemovalPolicy: s.removalPolicy(),
		})
		suppress(secret, "AwsSolutions-SMG4",
			"The secret holds a credential issued by an external system (source database, output endpoint or database); its owner rotates it and updates this secret, there is no rotation Lambda to run.")
		s.envSecrets[name] = secret
	}
}

// envSecretName is the name of the secret of {"env": "NAME"}.
func envSecretName(cfg *config.File, name string) string { return cfg.Stack.Prefix + "/" + name }

// grantSecrets lets role read the secrets refs point at: a secret of an env
// reference by its name in the shared stack, an existing secret by its name
// or ARN. Each secret is imported into the job's stack once.
func (js *jobStack) grantSecrets(role awsiam.IRole, refs []config.SecretRef) {
	for _, r := range refs {
		js.secret(r).GrantRead(role, nil)
	}
}

// secret imports the secret ref names. An existing secret's name or ARN was
// checked by loadInput (config.ParseForDeploy).
func (js *jobStack) secret(r config.SecretRef) awssecretsmanager.ISecret {
	if r.Env != "" {
		return js.importOnce("EnvSecret-"+r.Env, func(id string) any {
			return awssecretsmanager.Secret_FromSecretNameV2(js.stack, jsii.String(id), jsii.String(envSecretName(js.cfg, r.Env)))
		}).(awssecretsmanager.ISecret)
	}
	id := fmt.Sprintf("Secret-%08x", crc32.ChecksumIEEE([]byte(r.Secret)))
	return js.importOnce(id, func(id string) any {
		kind, _ := config.ClassifySecret(r.Secret)
		switch kind {
		case config.SecretByCompleteARN:
			return awssecretsmanager.Secret_FromSecretCompleteArn(js.stack, jsii.String(id), jsii.String(r.Secret))
		case config.SecretByPartialARN:
			return awssecretsmanager.Secret_FromSecretPartialArn(js.stack, jsii.String(id), jsii.String(r.Secret))
		}
		return awssecretsmanager.Secret_FromSecretNameV2(js.stack, jsii.String(id), jsii.String(r.Secret))
	}).(awssecretsmanager.ISecret)
}
