package main

//lint:file-ignore SA1019 the Go CDK reads synthesis messages (errors, warnings, cdk-nag findings) only through cxapi.SynthesisMessage; its replacement is not published for Go.

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2/cxapi"

	"github.com/changes-worker/changes-worker/shared/config"
)

// examplesDir holds the sample configurations the documentation offers.
const examplesDir = "../docs/examples"

// TestExamples: every sample configuration passes the deploy's checks (those
// changesctl validate runs) and synthesizes, cdk-nag's AwsSolutions pack
// included, with no error.
func TestExamples(t *testing.T) {
	synthesized(t) // the shared synthesis first, before the parallel tests
	t.Parallel()   // its own syntheses beside them, one at a time (jsiiMu)
	paths, err := filepath.Glob(filepath.Join(examplesDir, "*"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no sample configuration under %s: %v", examplesDir, err)
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := config.ParseForDeploy(raw); err != nil {
				t.Fatalf("check %s as a deploy does:\n%v", path, err)
			}
			syn, err := synthesize(path, variantFull, t.TempDir())
			if err != nil {
				t.Fatalf("synthesize %s: %v", path, err)
			}
			for _, m := range syn.messages {
				if m.level == string(cxapi.SynthesisMessageLevel_ERROR) {
					t.Errorf("%s: %s", m.path, firstLine(m.text))
				}
			}
			if n := checkSuppressions(t, syn); n == 0 {
				t.Errorf("no cdk-nag suppression metadata found: were the checks applied?")
			}
		})
	}
}

// TestExamplesNameSecrets: the sample configurations, and every whole
// configuration docs/deploy.md shows, name their Secrets Manager secrets by
// name, granted as NAME-?????? in the region deployed to. An ARN copied
// into them carries a region and a suffix of its own: pasted with another
// region's, or with the placeholder suffix left in, it fails only at run
// time (not found, or AccessDenied).
func TestExamplesNameSecrets(t *testing.T) {
	t.Parallel()
	docs := map[string][]byte{}
	paths, err := filepath.Glob(filepath.Join(examplesDir, "*"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no sample configuration under %s: %v", examplesDir, err)
	}
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs[p] = raw
	}
	deploy, err := os.ReadFile(filepath.Join("..", "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range regexp.MustCompile("(?s)```json\n(.*?)```").FindAllSubmatch(deploy, -1) {
		if bytes.Contains(m[1], []byte(`"jobs"`)) {
			docs[fmt.Sprintf("docs/deploy.md, configuration %d", i+1)] = m[1]
		}
	}
	for where, raw := range docs {
		cfg, err := config.ParseForDeploy(raw)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		for _, j := range cfg.Jobs {
			for _, s := range append(j.SourceSecrets(), j.OutputSecrets()...) {
				if s.Ref == nil || s.Ref.Secret == "" {
					continue
				}
				if kind, _ := config.ClassifySecret(s.Ref.Secret); kind != config.SecretByName {
					t.Errorf("%s: jobs[%s].%s names its secret by ARN (%s); name it by its name", where, j.ID, s.Key, s.Ref.Secret)
				}
			}
		}
	}
}
