package config

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// deployProblems are what a deploy refuses of a file Validate accepts:
// settings and names AWS does not take. Each names its key.
func (f *File) deployProblems() []error {
	var errs []error
	if !slices.Contains(logRetentionDays, f.Stack.LogRetentionDays) {
		errs = append(errs, fmt.Errorf("stack.log_retention_days: %d is not one of %v", f.Stack.LogRetentionDays, logRetentionDays))
	}
	for i, j := range f.Jobs {
		if j == nil {
			continue
		}
		p := item("jobs", i, j.ID)
		for _, name := range []string{f.FunctionName(j, FunctionPoller), f.FunctionName(j, FunctionWriter), f.FunctionName(j, FunctionVerify), f.ScheduleName(j)} {
			if len(name) > maxNameLength {
				errs = append(errs, fmt.Errorf("%s.id: the name %s is %d characters, AWS allows %d: shorten the job's id or stack.prefix",
					p, name, len(name), maxNameLength))
				break
			}
		}
		for _, s := range append(j.SourceSecrets(), j.OutputSecrets()...) {
			if s.Ref.Secret == "" {
				continue
			}
			if _, err := ClassifySecret(s.Ref.Secret); err != nil {
				if strings.HasPrefix(s.Ref.Secret, "arn:") {
					errs = append(errs, fmt.Errorf("%s.%s.secret: %q is %w", p, s.Key, s.Ref.Secret, err))
				} else {
					// A name Secrets Manager refuses may be the secret
					// itself, pasted in the wrong place.
					errs = append(errs, fmt.Errorf("%s.%s.secret: is %w (the value is not shown)", p, s.Key, err))
				}
			}
		}
	}
	return errs
}

// logRetentionDays are the values CloudWatch Logs accepts for a log group's
// retention, and so for stack.log_retention_days.
var logRetentionDays = []int{1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653}

// maxNameLength is the longest name Lambda allows a function and
// EventBridge a rule.
const maxNameLength = 64

// KeyedSecret is a secret reference of a job with the key it is set at,
// below the job ("source.auth.password", "outputs[pg].postgres.dsn").
type KeyedSecret struct {
	Key string
	Ref *SecretRef
}

// SourceSecrets returns the secret references of the job's source, which
// its poller resolves.
func (j *Job) SourceSecrets() []KeyedSecret {
	return authSecrets(nil, "source.auth", j.Source.Auth)
}

// OutputSecrets returns the secret references of the job's outputs, which
// its writer resolves: in output order, an HTTP output's headers by name.
func (j *Job) OutputSecrets() []KeyedSecret {
	var refs []KeyedSecret
	for i, o := range j.Outputs {
		if o == nil {
			continue
		}
		p := item("outputs", i, o.ID)
		switch {
		case o.Postgres != nil:
			refs = append(refs, KeyedSecret{p + ".postgres.dsn", &o.Postgres.DSN})
		case o.HTTP != nil:
			refs = authSecrets(refs, p+".http.auth", o.HTTP.Auth)
			if o.HTTP.URLSecret != nil {
				refs = append(refs, KeyedSecret{p + ".http.url_secret", o.HTTP.URLSecret})
			}
			for _, name := range slices.Sorted(maps.Keys(o.HTTP.Headers)) {
				if r := o.HTTP.Headers[name].Ref; r != nil {
					refs = append(refs, KeyedSecret{fmt.Sprintf("%s.http.headers[%s]", p, name), r})
				}
			}
		}
	}
	return refs
}

// authSecrets appends the secret references of a, at key p, to refs.
func authSecrets(refs []KeyedSecret, p string, a *Auth) []KeyedSecret {
	if a == nil {
		return refs
	}
	if a.Password != nil {
		refs = append(refs, KeyedSecret{p + ".password", a.Password})
	}
	if a.Token != nil {
		refs = append(refs, KeyedSecret{p + ".token", a.Token})
	}
	return refs
}

// SecretKind says how a {"secret": ...} reference names its secret.
type SecretKind int

// Secret kinds.
const (
	SecretByName        SecretKind = iota // a plain name
	SecretByCompleteARN                   // an ARN with the 6-character suffix Secrets Manager adds
	SecretByPartialARN                    // an ARN without that suffix
)

var completeSecretARN = regexp.MustCompile(`^arn:[a-z0-9-]+:secretsmanager:[a-z0-9-]+:\d{12}:secret:.+-[A-Za-z0-9]{6}$`)

// ClassifySecret tells how ref names its secret. An ARN that is neither a
// complete nor a well-formed partial Secrets Manager ARN is an error, and
// so is a name, or an ARN's name, that Secrets Manager does not allow.
func ClassifySecret(ref string) (SecretKind, error) {
	if !strings.HasPrefix(ref, "arn:") {
		return SecretByName, checkSecretName(ref)
	}
	errARN := errors.New("not a Secrets Manager secret ARN (arn:PARTITION:secretsmanager:REGION:ACCOUNT:secret:NAME)")
	parts := strings.SplitN(ref, ":", 7)
	if len(parts) < 7 || parts[2] != "secretsmanager" || parts[5] != "secret" || parts[6] == "" {
		return 0, errARN
	}
	if checkSecretName(parts[6]) != nil {
		return 0, errARN
	}
	if completeSecretARN.MatchString(ref) {
		return SecretByCompleteARN, nil
	}
	return SecretByPartialARN, nil
}

// maxSecretName is the longest name Secrets Manager allows a secret.
const maxSecretName = 512

// checkSecretName refuses a name Secrets Manager does not allow a secret:
// 1 to 512 of ASCII letters, digits and /_+=.@-, or '!' in the names of
// the secrets AWS services manage ("rds!cluster-...").
func checkSecretName(name string) error {
	const allowed = "/_+=.@-!"
	switch {
	case name == "":
		return errors.New("not a Secrets Manager secret name: it is empty")
	case len(name) > maxSecretName:
		return fmt.Errorf("not a Secrets Manager secret name: it is longer than %d characters", maxSecretName)
	case strings.Contains(name, " "):
		return errors.New("not a Secrets Manager secret name: it holds a space; a name holds ASCII letters, digits and /_+=.@- only")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(allowed, c) >= 0) {
			return errors.New("not a Secrets Manager secret name: it holds a character other than ASCII letters, digits and /_+=.@-")
		}
	}
	return nil
}
