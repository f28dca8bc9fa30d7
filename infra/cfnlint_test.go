package main

import (
	"os/exec"
	"testing"
)

// cfnLintVersion is the cfn-lint the Makefile installs when it is missing.
const cfnLintVersion = "1.51.0"

// TestCfnLint runs cfn-lint over the synthesized templates, the shared
// stack's and every job's. Resource-level exceptions, each with its reason,
// travel in the template's cfn-lint metadata.
func TestCfnLint(t *testing.T) {
	cfnLint(t, synthesized(t))
}

// cfnLint runs cfn-lint over every template of syn in one process.
func cfnLint(t *testing.T, syn *synthesis) {
	t.Helper()
	bin, err := exec.LookPath("cfn-lint")
	if err != nil {
		t.Fatalf("cfn-lint is not installed: pip install cfn-lint==%s", cfnLintVersion)
	}
	args := []string{"--format", "parseable", "--"}
	for p := range syn.templates {
		args = append(args, p)
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("cfn-lint of %d templates: %v\n%s", len(syn.templates), err, out)
	}
}
