// Command infra is the CDK app that deploys changes-worker: the state table,
// the bucket, one work queue and DLQ per (job, output), the poller and writer
// functions with their schedules and event sources, alarms and a dashboard,
// all built from the job configuration file.
//
// Run it through the CDK CLI from the repository root (cdk.json names it):
//
//	cdk synth -c config=path/to/jobs.json
//
// Context values: config (the job configuration, default localstack/jobs.json)
// and build_dir (where `make build` put <function>/bootstrap, default build).
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
)

const (
	defaultConfigPath = "localstack/jobs.json"
	defaultBuildDir   = "build"
)

func main() {
	err := realMain()
	jsii.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "infra:", err)
		os.Exit(1)
	}
}

func realMain() error {
	app := awscdk.NewApp(nil)
	stageDir := filepath.Join(*app.Outdir(), "staging")
	// The CDK copies each function's code into the cloud assembly when the
	// function is created; the staged copy is not needed after synth.
	defer os.RemoveAll(stageDir)
	if _, err := buildApp(app, appOptions{
		configPath: contextString(app, "config", defaultConfigPath),
		buildDir:   contextString(app, "build_dir", defaultBuildDir),
		stageDir:   stageDir,
	}); err != nil {
		return err
	}
	app.Synth(nil)
	return nil
}

// appOptions locate the inputs of a synth.
type appOptions struct {
	configPath string
	buildDir   string
	// stageDir receives each function's code plus the configuration before
	// the CDK copies it into the cloud assembly. Default: "staging" inside
	// the app's output directory.
	stageDir string
	// stackProps are passed to the stack (tests turn analytics off, say).
	stackProps *awscdk.StackProps
}

// buildApp adds the stack and the cdk-nag checks to app.
func buildApp(app awscdk.App, o appOptions) (*changesStack, error) {
	if o.stageDir == "" {
		o.stageDir = filepath.Join(*app.Outdir(), "staging")
	}
	in, err := loadInput(o.configPath, o.buildDir, o.stageDir)
	if err != nil {
		return nil, err
	}
	s := newStack(app, in, o.stackProps)
	addChecks(app)
	return s, nil
}

func contextString(app awscdk.App, key, def string) string {
	if v, ok := app.Node().TryGetContext(jsii.String(key)).(string); ok && v != "" {
		return v
	}
	return def
}
