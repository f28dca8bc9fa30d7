package main

//lint:file-ignore SA1019 the Go CDK reads synthesis messages (errors, warnings, cdk-nag findings) only through cxapi.SynthesisMessage; its replacement is not published for Go.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"

	"github.com/changes-worker/changes-worker/shared/config"
)

// testConfig is the job configuration every test synthesizes.
const testConfig = "testdata/jobs.json"

// Synthesis through jsii takes seconds, so one synthesis of the test
// configuration per variant is shared by every test of this package.
var shared, sharedLocal struct {
	once sync.Once
	syn  *synthesis
	err  error
	root string
}

// synthesis is the outcome of synthesizing testConfig.
type synthesis struct {
	cfg          *config.File
	raw          []byte // the configuration file as it is
	templatePath string // the shared stack's CloudFormation template in the cloud assembly
	outdir       string // the cloud assembly directory
	// templates are every template of the app, the shared stack's and each
	// job's nested stack's, by path in the cloud assembly.
	templates map[string]map[string]any
	// jobTemplates are the paths of the nested stacks' templates, by job id.
	jobTemplates map[string]string
	// tmpl is one template holding the resources of every template (logical
	// ids are unique across the app), for checks that span the stacks.
	tmpl     map[string]any
	template assertions.Template
	messages []synthMessage
}

type synthMessage struct {
	level, path, text string
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, root := range []string{shared.root, sharedLocal.root} {
		if root != "" {
			os.RemoveAll(root)
		}
	}
	jsii.Close()
	os.Exit(code)
}

// synthesized returns the shared synthesis of the full stack, making it on
// first use.
func synthesized(t *testing.T) *synthesis {
	t.Helper()
	shared.once.Do(func() { shared.syn, shared.err = synthesizeShared(variantFull, &shared.root) })
	if shared.err != nil {
		t.Fatalf("synthesize %s: %v", testConfig, shared.err)
	}
	return shared.syn
}

// synthesizedLocal returns the shared synthesis of the local variant.
func synthesizedLocal(t *testing.T) *synthesis {
	t.Helper()
	synthesized(t) // one synthesis at a time through the jsii runtime
	sharedLocal.once.Do(func() { sharedLocal.syn, sharedLocal.err = synthesizeShared(variantLocal, &sharedLocal.root) })
	if sharedLocal.err != nil {
		t.Fatalf("synthesize %s (local variant): %v", testConfig, sharedLocal.err)
	}
	return sharedLocal.syn
}

// synthesizeShared synthesizes testConfig in variant v into a new temporary
// directory, which it names in rootOut for TestMain to remove.
func synthesizeShared(v variant, rootOut *string) (*synthesis, error) {
	root, err := os.MkdirTemp("", "changes-worker-infra-test-")
	if err != nil {
		return nil, err
	}
	*rootOut = root
	return synthesize(testConfig, v, root)
}

// synthesizeDoc writes doc as a job configuration into a new temporary
// directory and synthesizes its stacks in the full variant there.
func synthesizeDoc(t *testing.T, doc string) (*synthesis, error) {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "jobs.json")
	if err := os.WriteFile(cfgPath, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return synthesize(cfgPath, variantFull, dir)
}

// jsiiMu is held by every synthesis: the jsii runtime serves one caller at
// a time. Tests that synthesize after t.Parallel (TestScale) rely on it; the
// others synthesize and assert before the parallel tests start.
var jsiiMu sync.Mutex

// synthesize synthesizes the stack of the configuration at configPath in
// variant v, with stand-ins for the functions' code, into directory root.
func synthesize(configPath string, v variant, root string) (*synthesis, error) {
	jsiiMu.Lock()
	defer jsiiMu.Unlock()
	// Stand-ins for `make build`: the stack only packages the files. The
	// local variant has no function code and must not need a build.
	buildDir := filepath.Join(root, "build")
	if v.functions() {
		for _, fn := range functionKinds {
			if err := os.MkdirAll(filepath.Join(buildDir, fn), 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(buildDir, fn, "bootstrap"), []byte("#!/bin/sh\n# "+fn+"\n"), 0o755); err != nil {
				return nil, err
			}
		}
	}
	ctx, err := cdkContext()
	if err != nil {
		return nil, err
	}
	outdir := filepath.Join(root, "cdk.out")
	app := awscdk.NewApp(&awscdk.AppProps{Context: &ctx, Outdir: jsii.String(outdir)})
	stack, err := buildApp(app, appOptions{
		configPath: configPath,
		buildDir:   buildDir,
		stageDir:   filepath.Join(root, "staging"),
		variant:    v,
	})
	if err != nil {
		return nil, err
	}
	asm, err := synth(app)
	if err != nil {
		return nil, err
	}
	art := asm.GetStackArtifact(stack.stack.ArtifactId())
	syn := &synthesis{cfg: stack.cfg, templatePath: *art.TemplateFullPath(), outdir: outdir,
		templates: map[string]map[string]any{}, jobTemplates: map[string]string{}}
	if syn.raw, err = os.ReadFile(configPath); err != nil {
		return nil, err
	}
	paths := []string{syn.templatePath}
	for _, js := range stack.jobs {
		p := filepath.Join(outdir, *js.stack.TemplateFile())
		syn.jobTemplates[js.job.ID] = p
		paths = append(paths, p)
	}
	merged := map[string]any{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var tmpl map[string]any
		if err := json.Unmarshal(b, &tmpl); err != nil {
			return nil, err
		}
		syn.templates[p] = tmpl
		for id, r := range tmpl["Resources"].(map[string]any) {
			if _, dup := merged[id]; dup {
				return nil, fmt.Errorf("logical id %s is in two templates", id)
			}
			merged[id] = r
		}
	}
	syn.tmpl = map[string]any{"Resources": merged, "Outputs": syn.templates[syn.templatePath]["Outputs"]}
	syn.template = assertions.Template_FromJSON(&syn.tmpl, nil)
	for _, m := range *art.Messages() {
		text := fmt.Sprint(m.Entry.Data)
		if s, ok := m.Entry.Data.(string); ok {
			text = s
		}
		syn.messages = append(syn.messages, synthMessage{level: string(m.Level), path: *m.Id, text: text})
	}
	return syn, nil
}

// cdkContext is the context of cdk.json (feature flags included), so tests
// synthesize what `cdk deploy` would.
func cdkContext() (map[string]any, error) {
	b, err := os.ReadFile(filepath.Join("..", "cdk.json"))
	if err != nil {
		return nil, fmt.Errorf("read cdk.json: %w", err)
	}
	var doc struct {
		Context map[string]any `json:"context"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("decode cdk.json: %w", err)
	}
	return doc.Context, nil
}

// assert runs a CDK assertion, turning its panic into a test error.
func assert(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("%s: %v", what, r)
		}
	}()
	f()
}

// resources returns the template's resources of type typ by logical id.
func (s *synthesis) resources(typ string) map[string]map[string]any {
	out := map[string]map[string]any{}
	for id, r := range s.tmpl["Resources"].(map[string]any) {
		r := r.(map[string]any)
		if r["Type"] == typ {
			out[id] = r
		}
	}
	return out
}

// resource returns the resource of type typ whose property key equals value.
func (s *synthesis) resource(t *testing.T, typ, key string, value any) (string, map[string]any) {
	t.Helper()
	for id, r := range s.resources(typ) {
		if props(r)[key] == value {
			return id, r
		}
	}
	t.Fatalf("no %s with %s = %v", typ, key, value)
	return "", nil
}

func props(r map[string]any) map[string]any {
	p, _ := r["Properties"].(map[string]any)
	return p
}

// getAtt returns the logical id a {"Fn::GetAtt": [id, attr]} or {"Ref": id} names.
func refID(v any) string {
	m, ok := v.(map[string]any)
	if !ok {
		return ""
	}
	if r, ok := m["Ref"].(string); ok {
		return r
	}
	if g, ok := m["Fn::GetAtt"].([]any); ok && len(g) > 0 {
		s, _ := g[0].(string)
		return s
	}
	return ""
}

// strs flattens a string or a list of strings.
func strs(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, e := range v {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// compact renders v as one line of JSON for messages and substring checks.
func compact(v any) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	return strings.TrimSuffix(b.String(), "\n")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

func hasPrefixAny(s string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
