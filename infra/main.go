// Command infra is the CDK app that deploys changes-worker: a stack of what
// the jobs share (the state table, the bucket, the alarm topic) and, nested
// in it, a stack per job with its work queues and DLQs, its own poller and
// writer functions with their schedule and event sources, its alarms and its
// dashboard, all built from the job configuration file.
//
// Run it through the CDK CLI from the repository root (cdk.json names it):
//
//	cdk synth -c config=path/to/jobs.json
//
// The job configuration must be named: there is no default, so that no
// deploy ever picks up a configuration nobody chose (the demo's
// localstack/jobs.json included). Name it with the context value config
// (-c config=PATH) or, failing that, the environment variable
// CHANGES_CDK_CONFIG. Other context values: build_dir (where `make build`
// put <function>/bootstrap, default build), variant (full, the default,
// or local: everything but the functions, see variant.go) and schedules
// (enabled, the default, or disabled: the rules that start the poller are
// created disabled, for a local deploy that enables them once the secrets
// and bucket are in place) and aws_calls (an absolute path: the functions
// record every AWS request they make in that file, CHANGES_AWS_CALLS, which
// only a local deploy whose functions run on this machine can read; the
// tests use it to check each request against the function's role).
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/cxapi"
	"github.com/aws/jsii-runtime-go"
)

// Context keys and the environment the app reads.
const (
	contextConfig   = "config"
	contextBuildDir = "build_dir"
	contextVariant  = "variant"
	contextSchedule = "schedules"
	contextAWSCalls = "aws_calls"
	// envConfig names the job configuration when the context does not.
	envConfig       = "CHANGES_CDK_CONFIG"
	defaultBuildDir = "build"
)

// errNoConfig is returned when neither the context nor the environment names
// the job configuration.
var errNoConfig = errors.New("no job configuration named: pass -c " + contextConfig + "=PATH to the CDK CLI " +
	"(make synth|diff|deploy|destroy CDK_CONFIG=PATH) or set " + envConfig + "=PATH; " +
	"there is no default, so that a deploy never ships a configuration nobody chose")

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
	configPath, err := resolveConfigPath(contextString(app, contextConfig), os.LookupEnv)
	if err != nil {
		return err
	}
	v, err := parseVariant(contextString(app, contextVariant))
	if err != nil {
		return err
	}
	schedulesDisabled, err := parseSchedules(contextString(app, contextSchedule))
	if err != nil {
		return err
	}
	awsCalls := contextString(app, contextAWSCalls)
	if awsCalls != "" && !filepath.IsAbs(awsCalls) {
		return fmt.Errorf("context %s=%q: want an absolute path", contextAWSCalls, awsCalls)
	}
	buildDir := contextString(app, contextBuildDir)
	if buildDir == "" {
		buildDir = defaultBuildDir
	}
	stageDir := filepath.Join(*app.Outdir(), "staging")
	// The CDK copies each function's code into the cloud assembly when the
	// function is created; the staged copy is not needed after synth.
	defer os.RemoveAll(stageDir)
	if _, err := buildApp(app, appOptions{
		configPath: configPath,
		buildDir:   buildDir,
		stageDir:   stageDir,
		variant:    v,

		schedulesDisabled: schedulesDisabled,
		awsCalls:          awsCalls,
	}); err != nil {
		return err
	}
	_, err = synth(app)
	return err
}

// synth synthesizes app into its cloud assembly. The CDK reports what fails
// at synth (a stack over CloudFormation's limits, an invalid construct) by
// throwing, which jsii turns into a panic: synth returns it as an error.
func synth(app awscdk.App) (asm cxapi.CloudAssembly, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("synthesize: %v", r)
		}
	}()
	return app.Synth(nil), nil
}

// resolveConfigPath returns the job configuration named by the context value
// (fromContext) or, when that is empty, by CHANGES_CDK_CONFIG. Naming two
// different files is an error, as is naming none.
func resolveConfigPath(fromContext string, lookup func(string) (string, bool)) (string, error) {
	fromEnv, _ := lookup(envConfig)
	switch {
	case fromContext != "" && fromEnv != "" && filepath.Clean(fromContext) != filepath.Clean(fromEnv):
		return "", fmt.Errorf("two job configurations named: -c %s=%s and %s=%s; name one", contextConfig, fromContext, envConfig, fromEnv)
	case fromContext != "":
		return fromContext, nil
	case fromEnv != "":
		return fromEnv, nil
	}
	return "", errNoConfig
}

// appOptions locate the inputs of a synth.
type appOptions struct {
	configPath string
	buildDir   string
	// stageDir receives each function's code plus the configuration before
	// the CDK copies it into the cloud assembly. Default: "staging" inside
	// the app's output directory.
	stageDir string
	// variant selects the full stack or its local variant. Default full.
	variant variant
	// schedulesDisabled creates the schedule rules disabled.
	schedulesDisabled bool
	// awsCalls, when set, is the file the functions record their AWS
	// requests in.
	awsCalls string
	// stackProps are passed to the stack (tests turn analytics off, say).
	stackProps *awscdk.StackProps
}

// buildApp adds the stack and the cdk-nag checks to app.
func buildApp(app awscdk.App, o appOptions) (*changesStack, error) {
	if o.stageDir == "" {
		o.stageDir = filepath.Join(*app.Outdir(), "staging")
	}
	in, err := loadInput(o.configPath, o.buildDir, o.stageDir, o.variant)
	if err != nil {
		return nil, err
	}
	in.schedulesDisabled = o.schedulesDisabled
	in.awsCalls = o.awsCalls
	s := newStack(app, in, o.stackProps)
	addChecks(app)
	return s, nil
}

// parseSchedules reads the context value schedules: whether the rules are
// created disabled.
func parseSchedules(s string) (disabled bool, err error) {
	switch s {
	case "", "enabled":
		return false, nil
	case "disabled":
		return true, nil
	}
	return false, fmt.Errorf("context %s=%q: want enabled or disabled", contextSchedule, s)
}

// contextString returns the context value key as a string, "" when unset.
func contextString(app awscdk.App, key string) string {
	v, _ := app.Node().TryGetContext(jsii.String(key)).(string)
	return v
}
