package main

import (
	"os/exec"
	"testing"
)

// cfnLintVersion is the cfn-lint the Makefile installs when it is missing.
const cfnLintVersion = "1.51.0"

// TestCfnLint runs cfn-lint over the synthesized template. Resource-level
// exceptions, each with its reason, travel in the template's cfn-lint
// metadata.
func TestCfnLint(t *testing.T) {
	syn := synthesized(t)
	bin, err := exec.LookPath("cfn-lint")
	if err != nil {
		t.Fatalf("cfn-lint is not installed: pip install cfn-lint==%s", cfnLintVersion)
	}
	out, err := exec.Command(bin, "--format", "parseable", "--", syn.templatePath).CombinedOutput()
	if err != nil {
		t.Fatalf("cfn-lint %s: %v\n%s", syn.templatePath, err, out)
	}
}
