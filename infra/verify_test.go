package main

import (
	"strings"
	"testing"
)

// TestVerifyGrants checks the role of each job's verify function statement
// by statement: it reads and takes the job's lease (its item only), reads
// the depth of and sends to the job's work queues (never a DLQ, never
// receives), writes claim checks under the job's prefix, reads its S3
// outputs' prefixes and nothing else of a bucket, and reads the job's
// source secrets and its PostgreSQL outputs' DSNs, never an HTTP output's
// secret. The poller's and writer's roles are checked as they were
// (TestGrants, TestSecrets).
func TestVerifyGrants(t *testing.T) {
	syn := synthesized(t)
	const (
		catalogToken = ":secret:cwtest/CATALOG_SOURCE_TOKEN-??????"
		crmToken     = ":secret:cwtest/CRM_TOKEN-??????"
		sgwPassword  = ":secret:orders/sgw-password-??????"
		pgDSN        = "arn:aws:secretsmanager:us-east-1:123456789012:secret:orders/pg-dsn-AbCdEf"
	)
	for _, c := range []struct {
		job     string
		secrets []string
		s3      []string
		objects []string
		list    string
	}{
		{"orders", []string{sgwPassword, pgDSN}, []string{"s3:GetObject", "s3:ListBucket", "s3:PutObject"},
			[]string{"/claim-check/orders/cwtest/*", "/archive/orders/*"}, `"s3:prefix":["archive/orders/*"]`},
		{"catalog", []string{catalogToken}, []string{"s3:GetObject", "s3:ListBucket", "s3:PutObject"},
			[]string{"/claim-check/catalog/cwtest/*", ":s3:::partner-exports/catalog/*"}, `"s3:prefix":["catalog/*"]`},
	} {
		t.Run(c.job, func(t *testing.T) {
			j := syn.cfg.Job(c.job)
			who := functionName(syn.cfg, j, fnVerify)
			sts := statementsOf(rolePolicy(t, syn, who))
			for _, st := range sts {
				for _, a := range strs(st["Action"]) {
					if service, _, _ := strings.Cut(a, ":"); !contains([]string{"dynamodb", "sqs", "s3", "secretsmanager", "logs", "ec2"}, service) {
						t.Errorf("%s may call %s", who, a)
					}
				}
			}

			wantActions(t, who, sts, "dynamodb:", []string{"dynamodb:GetItem", "dynamodb:UpdateItem"})
			for _, st := range sts {
				if !hasPrefixAny(strs(st["Action"])[0], "dynamodb:") {
					continue
				}
				if !strings.Contains(compact(st["Resource"]), ":table/cwtest-state") {
					t.Errorf("%s dynamodb resource = %s, want the table only", who, compact(st["Resource"]))
				}
				if want := `{"ForAllValues:StringLike":{"dynamodb:LeadingKeys":["` + j.ID + `"]}}`; compact(st["Condition"]) != want {
					t.Errorf("%s dynamodb condition = %s, want %s", who, compact(st["Condition"]), want)
				}
			}

			wantActions(t, who, sts, "sqs:", []string{"sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:SendMessage"})
			workQueue := func(q map[string]any) bool {
				name := q["QueueName"].(string)
				return strings.HasPrefix(name, "cwtest-"+j.ID+"-") && !strings.Contains(name, "-dlq")
			}
			for _, a := range []string{"sqs:GetQueueUrl", "sqs:GetQueueAttributes", "sqs:SendMessage"} {
				wantResources(t, syn, who, sts, a, workQueue)
			}

			wantActions(t, who, sts, "s3:", c.s3)
			var objects []string
			for _, st := range sts {
				acts := strs(st["Action"])
				if contains(acts, "s3:GetObject") || contains(acts, "s3:PutObject") {
					objects = append(objects, compact(st["Resource"]))
				}
				if contains(acts, "s3:PutObject") && !strings.Contains(compact(st["Resource"]), "/claim-check/"+j.ID+"/cwtest/*") {
					t.Errorf("%s writes %s, want only the job's claim checks", who, compact(st["Resource"]))
				}
				if contains(acts, "s3:ListBucket") && !strings.Contains(compact(st["Condition"]), c.list) {
					t.Errorf("%s lists the bucket beyond its outputs' prefixes: %s", who, compact(st))
				}
			}
			for _, res := range objects {
				if !hasAny(res, c.objects...) {
					t.Errorf("%s object grant on %s", who, res)
				}
			}
			for _, w := range c.objects {
				if !strings.Contains(strings.Join(objects, " "), w) {
					t.Errorf("%s has no object grant on %s: %v", who, w, objects)
				}
			}

			for _, secret := range []string{catalogToken, crmToken, sgwPassword, pgDSN} {
				got := false
				for _, st := range sts {
					got = got || (contains(strs(st["Action"]), "secretsmanager:GetSecretValue") && strings.Contains(compact(st["Resource"]), secret))
				}
				if want := contains(c.secrets, secret); got != want {
					t.Errorf("%s reads %s = %v, want %v", who, secret, got, want)
				}
			}
		})
	}
}
