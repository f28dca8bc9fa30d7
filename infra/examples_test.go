package main

//lint:file-ignore SA1019 the Go CDK reads synthesis messages (errors, warnings, cdk-nag findings) only through cxapi.SynthesisMessage; its replacement is not published for Go.

import (
	"os"
	"path/filepath"
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
	synthesized(t) // one synthesis at a time through the jsii runtime
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
