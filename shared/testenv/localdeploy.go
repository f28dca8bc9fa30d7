package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/changes-worker/changes-worker/shared/awsconf"
)

// LocalDeploy is one run of localstack/deploy.sh (`make localstack-deploy`).
type LocalDeploy struct {
	// ConfigPath is the job configuration to deploy.
	ConfigPath string
	// BuildDir receives changesctl and the functions' bootstraps, built for
	// this machine.
	BuildDir string
	// AssemblyDir receives the cloud assembly: deploys running side by side
	// each need their own.
	AssemblyDir string
	// Env is added to this process's environment: the values of the
	// stack's secrets ({"env": NAME} references), say.
	Env []string
	// AWSCalls, when set, is the file the deployed functions record every
	// AWS request they make in (awsconf.EnvCalls).
	AWSCalls string
}

// DeployLocal deploys the full stack of d.ConfigPath to the local AWS with
// localstack/deploy.sh, its functions run by LocalStack on this machine and
// its schedule rules left disabled: the caller invokes the pollers. The
// stack is deployed when it returns nil, its functions Active; the error
// holds the end of what deploy.sh printed.
func DeployLocal(ctx context.Context, d LocalDeploy) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	// deploy.sh runs at the repository root.
	for _, p := range []*string{&d.ConfigPath, &d.BuildDir, &d.AssemblyDir} {
		if *p, err = filepath.Abs(*p); err != nil {
			return fmt.Errorf("deploy locally: %w", err)
		}
	}
	ctl := filepath.Join(d.BuildDir, "changesctl")
	build := exec.CommandContext(ctx, "go", "build", "-o", ctl, "./cmd/changesctl")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build changesctl: %w\n%s", err, out)
	}
	cmd := exec.CommandContext(ctx, "bash", "localstack/deploy.sh", ctl, d.ConfigPath)
	cmd.Dir = root
	cmd.Env = append(append(os.Environ(), "SCHEDULES=disabled", "BUILD_DIR="+d.BuildDir, "CDK_OUT="+d.AssemblyDir,
		awsconf.EnvCalls+"="+d.AWSCalls), d.Env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("localstack/deploy.sh %s: %w\n%s\n(LocalStack runs Lambda functions only with the host runtime executor: make down && make up)",
			d.ConfigPath, err, tailText(string(out), 60))
	}
	return nil
}
