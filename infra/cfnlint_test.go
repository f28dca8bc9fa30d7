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
	syn := synthesized(t)
	// cfn-lint runs out of this process, beside the other parallel tests.
	t.Parallel()
	cfnLint(t, syn, len(syn.jobTemplates))
}

// cfnLint runs cfn-lint, in one process, over the shared stack's template
// of syn and the templates of its first jobs, up to jobs of them.
func cfnLint(t *testing.T, syn *synthesis, jobs int) {
	t.Helper()
	bin, err := exec.LookPath("cfn-lint")
	if err != nil {
		t.Fatalf("cfn-lint is not installed: pip install cfn-lint==%s", cfnLintVersion)
	}
	args := []string{"--format", "parseable", "--", syn.templatePath}
	for _, j := range syn.cfg.Jobs[:min(jobs, len(syn.cfg.Jobs))] {
		args = append(args, syn.jobTemplates[j.ID])
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("cfn-lint of %d templates: %v\n%s", len(args)-3, err, out)
	}
}
