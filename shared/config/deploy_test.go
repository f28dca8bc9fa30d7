package config

import (
	"strings"
	"testing"
)

// TestParseForDeploy: ParseForDeploy reports Validate's problems and the
// deploy's own at once, each naming its key; Parse leaves the deploy's to
// the deploy.
func TestParseForDeploy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    []string // substrings of ParseForDeploy's error, each must appear
		parseOK bool     // Parse accepts in
	}{
		{
			name:    "retention",
			in:      `{"stack":{"log_retention_days":15},"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"outputs":[{"id":"s","type":"s3","s3":{}}]}]}`,
			want:    []string{"stack.log_retention_days: 15 is not one of [1 3 5"},
			parseOK: true,
		},
		{
			name: "names too long",
			in: `{"stack":{"prefix":"changes-worker-production-eu"},"jobs":[{"id":"catalog-of-every-product-we-sell","source":{"type":"couchdb","url":"http://h/db"},
				"outputs":[{"id":"s","type":"s3","s3":{}}]}]}`,
			want:    []string{"jobs[catalog-of-every-product-we-sell].id: the name changes-worker-production-eu-catalog-of-every-product-we-sell-poller is 68 characters, AWS allows 64"},
			parseOK: true,
		},
		{
			name: "secret ARNs, each by its key",
			in: `{"jobs":[{"id":"a","source":{"type":"sync_gateway","url":"https://h/db","auth":{"type":"basic","username":"u","password":{"secret":"arn:aws:ssm:us-east-1:123456789012:parameter/x"}}},
				"outputs":[{"id":"p","type":"postgres","postgres":{"dsn":{"secret":"arn:aws:secretsmanager:us-east-1:123456789012:secret:"}}},
				{"id":"h","type":"http","http":{"url":"https://x/{doc_id}","headers":{"X-Api-Key":{"secret":"arn:aws:s3:::bucket"}}}}]}]}`,
			want: []string{
				`jobs[a].source.auth.password.secret: "arn:aws:ssm:us-east-1:123456789012:parameter/x" is not a Secrets Manager secret ARN`,
				`jobs[a].outputs[p].postgres.dsn.secret: "arn:aws:secretsmanager:us-east-1:123456789012:secret:" is not a Secrets Manager secret ARN`,
				`jobs[a].outputs[h].http.headers[X-Api-Key].secret: "arn:aws:s3:::bucket" is not a Secrets Manager secret ARN`,
			},
			parseOK: true,
		},
		{
			name: "secret names Secrets Manager refuses, not quoted",
			in: `{"jobs":[{"id":"a","source":{"type":"sync_gateway","url":"https://h/db","auth":{"type":"basic","username":"u","password":{"secret":"pw 456"}}},
				"outputs":[{"id":"p","type":"postgres","postgres":{"dsn":{"secret":"orders/pg#dsn"}}}]}]}`,
			want: []string{
				"jobs[a].source.auth.password.secret: is not a Secrets Manager secret name: it holds a space; a name holds ASCII letters, digits and /_+=.@- only (the value is not shown)",
				"jobs[a].outputs[p].postgres.dsn.secret: is not a Secrets Manager secret name: it holds a character other than ASCII letters, digits and /_+=.@- (the value is not shown)",
			},
			parseOK: true,
		},
		{
			name: "the deploy's problems and Validate's together",
			in: `{"stack":{"log_retention_days":2},"jobs":[{"id":"a","source":{"type":"couchdb","url":"http://h/db"},"feed":{"limit":-1},
				"outputs":[{"id":"p","type":"postgres","postgres":{"dsn":{"secret":"arn:aws:iam::123456789012:role/x"}}}]}]}`,
			want: []string{"stack.log_retention_days: 2", "jobs[a].feed.limit: -1", `jobs[a].outputs[p].postgres.dsn.secret: "arn:aws:iam::123456789012:role/x" is not`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseForDeploy([]byte(tt.in))
			wantErrorWith(t, err, "ParseForDeploy succeeded, want errors", tt.want...)
			if _, err := Parse([]byte(tt.in)); tt.parseOK && err != nil {
				t.Errorf("Parse: %v, want the deploy's checks left to the deploy", err)
			}
		})
	}
}

func TestClassifySecret(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		ref     string
		want    SecretKind
		wantErr bool
	}{
		{name: "name", ref: "orders/pg-dsn", want: SecretByName},
		{name: "complete ARN", ref: "arn:aws:secretsmanager:eu-west-1:123456789012:secret:orders/pg-dsn-AbC123", want: SecretByCompleteARN},
		{name: "partial ARN", ref: "arn:aws:secretsmanager:eu-west-1:123456789012:secret:orders/pg-dsn", want: SecretByPartialARN},
		{name: "other partition", ref: "arn:aws-us-gov:secretsmanager:us-gov-west-1:123456789012:secret:x-AbC123", want: SecretByCompleteARN},
		{name: "not a secret ARN", ref: "arn:aws:ssm:eu-west-1:123456789012:parameter/x", wantErr: true},
		{name: "ARN without name", ref: "arn:aws:secretsmanager:eu-west-1:123456789012:secret:", wantErr: true},
		{name: "every character a name may hold", ref: "a-Z_0/9+=.@x", want: SecretByName},
		{name: "a secret AWS manages", ref: "rds!cluster-1a96bebc", want: SecretByName},
		{name: "name with a space", ref: "orders pg", wantErr: true},
		{name: "empty name", ref: "", wantErr: true},
		{name: "name too long", ref: strings.Repeat("n", 513), wantErr: true},
		{name: "ARN whose name has a space", ref: "arn:aws:secretsmanager:eu-west-1:123456789012:secret:orders pg", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ClassifySecret(tt.ref)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ClassifySecret(%q) error = %v, want error %v", tt.ref, err, tt.wantErr)
			}
			if err == nil && got != tt.want {
				t.Errorf("ClassifySecret(%q) = %v, want %v", tt.ref, got, tt.want)
			}
		})
	}
}
