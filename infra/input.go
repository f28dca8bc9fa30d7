package main

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"

	"github.com/changes-worker/changes-worker/shared/config"
)

// Function names: each is built by `make build` into <build dir>/<name>/bootstrap.
const (
	fnPoller = config.FunctionPoller
	fnWriter = config.FunctionWriter
)

// functionKinds are the functions every job has. Each kind's code is one
// asset, its built bootstrap, shared by the functions of that kind of every
// job: the cloud assembly and a deploy carry it once, whatever the number of
// jobs.
var functionKinds = []string{fnPoller, fnWriter, fnVerify}

// bundledConfigName is the file name of the job configuration inside the
// code of a job whose configuration does not fit in its functions'
// environment; they find it through CHANGES_CONFIG_FILE.
const bundledConfigName = "jobs.json"

// maxEnvironmentBytes is the most Lambda takes of a function's environment
// variables: 4 KB, counted over their JSON object.
const maxEnvironmentBytes = 4096

// longestBucketName stands for the stack bucket's name, which is known only
// at deploy, in the size of an environment: S3 allows 63 characters.
var longestBucketName = strings.Repeat("b", 63)

// input is everything the stack is built from, read once before any construct
// is created, so that a bad configuration fails synth with one clear message.
type input struct {
	// cfg is the loaded, defaulted and validated job configuration.
	cfg *config.File
	// warnings are what the deploy takes of cfg but its operator should act on.
	warnings []config.Warning
	// bucketGiven reports whether stack.bucket was set in the file (an existing
	// bucket to import) rather than defaulted (a bucket the stack creates).
	bucketGiven bool
	// code maps a function kind to the directory holding its Lambda code:
	// the built bootstrap, shared by every job.
	code map[string]string
	// jobConfigs maps a job id to the configuration its functions get
	// (jobConfig, compact) in CHANGES_CONFIG.
	jobConfigs map[string]string
	// ownCode maps a job id and a function kind to the directory of code
	// of the job's own: the bootstrap plus the job's configuration as
	// jobs.json, for a job whose configuration does not fit in its
	// functions' environment (it has no entry in jobConfigs).
	ownCode map[string]map[string]string
	// sourceSecrets and outputSecrets are the secret references the poller
	// (sources) and the writer (outputs) resolve.
	sourceSecrets, outputSecrets []config.SecretRef
	// variant says whether the stack has its functions.
	variant variant
	// schedulesDisabled creates the schedule rules disabled.
	schedulesDisabled bool
	// awsCalls, when set, is the file the functions record their AWS
	// requests in (envAWSCalls).
	awsCalls string
	// arch is the functions' architecture, the one their bootstraps are
	// built for: arm64 from `make build`, this machine's for a local deploy.
	arch string
}

// loadInput reads the configuration at configPath and, for a variant with
// functions, stages each function kind's code from buildDir into stageDir,
// and decides where each job's functions find their configuration: in
// their environment, which holds awsCalls too when set, or, when it would
// not fit there, in code of the job's own.
func loadInput(configPath, buildDir, stageDir, awsCalls string, v variant) (*input, error) {
	if v == "" {
		v = variantFull
	}
	raw, err := os.ReadFile(configPath)
	if err != nil {
		return nil, fmt.Errorf("read job configuration: %w", err)
	}
	cfg, warnings, err := config.CheckForDeploy(raw)
	if err != nil {
		return nil, fmt.Errorf("job configuration %s: %w", configPath, err)
	}
	given, err := bucketGiven(raw)
	if err != nil {
		return nil, fmt.Errorf("job configuration %s: %w", configPath, err)
	}
	in := &input{cfg: cfg, warnings: warnings, bucketGiven: given, variant: v, awsCalls: awsCalls,
		code: map[string]string{}, jobConfigs: map[string]string{}, ownCode: map[string]map[string]string{}}
	in.sourceSecrets, in.outputSecrets = secretRefs(cfg)
	if !v.functions() {
		return in, nil
	}
	for _, fn := range functionKinds {
		dir, err := stageCode(filepath.Join(buildDir, fn), nil, filepath.Join(stageDir, "kinds", fn))
		if err != nil {
			return nil, err
		}
		in.code[fn] = dir
		arch, err := bootstrapArch(filepath.Join(dir, "bootstrap"))
		if err != nil {
			return nil, err
		}
		if in.arch != "" && arch != in.arch {
			return nil, fmt.Errorf("stage code: the bootstraps are built for %s and %s; build them all for one architecture", in.arch, arch)
		}
		in.arch = arch
	}
	for _, j := range cfg.Jobs {
		jobRaw, err := jobConfig(raw, j.ID)
		if err != nil {
			return nil, fmt.Errorf("job configuration %s: %w", configPath, err)
		}
		var doc bytes.Buffer
		if err := json.Compact(&doc, jobRaw); err != nil {
			return nil, fmt.Errorf("job configuration %s: job %s: %w", configPath, j.ID, err)
		}
		env := in.environment()
		env[envBucket] = longestBucketName
		env[envJobConfig] = doc.String()
		if environmentSize(env) <= maxEnvironmentBytes {
			in.jobConfigs[j.ID] = doc.String()
			continue
		}
		in.ownCode[j.ID] = map[string]string{}
		for _, fn := range functionKinds {
			dir, err := stageCode(filepath.Join(buildDir, fn), jobRaw, filepath.Join(stageDir, "jobs", j.ID, fn))
			if err != nil {
				return nil, err
			}
			in.ownCode[j.ID][fn] = dir
		}
	}
	return in, nil
}

// environment is what every function's environment holds but the stack
// bucket's name, known at deploy, and the job's configuration or the file
// that holds it.
func (in *input) environment() map[string]string {
	env := map[string]string{envSecretPrefix: in.cfg.Stack.Prefix + "/"}
	if in.awsCalls != "" {
		env[envAWSCalls] = in.awsCalls
	}
	return env
}

// environmentSize is the size of env as Lambda counts it: its JSON object.
func environmentSize(env map[string]string) int {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(env) // a map of strings always encodes
	return b.Len() - 1  // the newline Encode adds
}

// Lambda architectures.
const (
	archARM64 = "arm64"
	archX8664 = "x86_64"
)

// architecture returns the functions' architecture.
func (in *input) architecture() awslambda.Architecture {
	if in.arch == archX8664 {
		return awslambda.Architecture_X86_64()
	}
	return awslambda.Architecture_ARM_64()
}

// bootstrapArch returns the Lambda architecture an executable is built for,
// read from its ELF header; a file that is not ELF (a script) counts as
// arm64, the architecture of `make build`.
func bootstrapArch(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("read bootstrap architecture: %w", err)
	}
	defer f.Close()
	var h [20]byte
	if _, err := io.ReadFull(f, h[:]); err != nil || string(h[:4]) != "\x7fELF" {
		return archARM64, nil
	}
	order := binary.ByteOrder(binary.LittleEndian)
	if h[5] == 2 {
		order = binary.BigEndian
	}
	switch m := elf.Machine(order.Uint16(h[18:20])); m {
	case elf.EM_AARCH64:
		return archARM64, nil
	case elf.EM_X86_64:
		return archX8664, nil
	default:
		return "", fmt.Errorf("read bootstrap architecture: %s is built for %s, which Lambda does not run", path, m)
	}
}

// jobConfig returns the configuration a job's functions get: the file
// without its comments and with that job alone in "jobs", every other
// top-level key as it is. A change to another job leaves it unchanged, and
// with it this job's functions.
func jobConfig(raw []byte, jobID string) ([]byte, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(config.StripComments(raw), &doc); err != nil {
		return nil, fmt.Errorf("decode configuration: %w", err)
	}
	var jobs []json.RawMessage
	if err := json.Unmarshal(doc["jobs"], &jobs); err != nil {
		return nil, fmt.Errorf("decode jobs: %w", err)
	}
	for _, j := range jobs {
		var id struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(j, &id); err != nil {
			return nil, fmt.Errorf("decode jobs: %w", err)
		}
		if id.ID != jobID {
			continue
		}
		one, err := json.Marshal([]json.RawMessage{j})
		if err != nil {
			return nil, fmt.Errorf("encode job %s: %w", jobID, err)
		}
		doc["jobs"] = one
		out, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			return nil, fmt.Errorf("encode job %s: %w", jobID, err)
		}
		return append(out, '\n'), nil
	}
	return nil, fmt.Errorf("no job %q", jobID)
}

// bucketGiven reports whether the raw file sets stack.bucket. Defaults fill the
// field in, so the loaded File cannot tell.
func bucketGiven(raw []byte) (bool, error) {
	var doc struct {
		Stack struct {
			Bucket string `json:"bucket"`
		} `json:"stack"`
	}
	if err := json.Unmarshal(config.StripComments(raw), &doc); err != nil {
		return false, fmt.Errorf("decode stack.bucket: %w", err)
	}
	return doc.Stack.Bucket != "", nil
}

// stageCode copies the built function in src and, when not nil, the
// configuration as jobs.json into dst, replacing whatever dst held.
func stageCode(src string, rawConfig []byte, dst string) (string, error) {
	bootstrap := filepath.Join(src, "bootstrap")
	if st, err := os.Stat(bootstrap); err != nil || st.IsDir() {
		return "", fmt.Errorf("stage %s code: %s is missing: run make build first", filepath.Base(src), bootstrap)
	}
	if err := os.RemoveAll(dst); err != nil {
		return "", fmt.Errorf("stage %s code: %w", filepath.Base(src), err)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return "", fmt.Errorf("stage %s code: %w", filepath.Base(src), err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return "", fmt.Errorf("stage %s code: %w", filepath.Base(src), err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == bundledConfigName {
			continue
		}
		if err := linkOrCopy(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return "", fmt.Errorf("stage %s code: %w", filepath.Base(src), err)
		}
	}
	if rawConfig == nil {
		return dst, nil
	}
	if err := os.WriteFile(filepath.Join(dst, bundledConfigName), rawConfig, 0o644); err != nil {
		return "", fmt.Errorf("stage %s code: %w", filepath.Base(src), err)
	}
	return dst, nil
}

// linkOrCopy links dst to src or, where a link cannot be made (another file
// system), copies src: every job's functions stage the same bootstrap.
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	return copyFile(src, dst)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, st.Mode().Perm()|0o444)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// secretRefs collects the distinct secret references of the sources (read by
// the pollers) and of the outputs (read by the writers) of every job, in a
// stable order.
func secretRefs(cfg *config.File) (sources, outputs []config.SecretRef) {
	var src, out refSet
	for _, j := range cfg.Jobs {
		src.addJobSources(j)
		out.addJobOutputs(j)
	}
	return src.sorted(), out.sorted()
}

// jobSecretRefs are the distinct secret references of job j: its source's
// (read by its poller) and its outputs' (read by its writer).
func jobSecretRefs(j *config.Job) (sources, outputs []config.SecretRef) {
	var src, out refSet
	src.addJobSources(j)
	out.addJobOutputs(j)
	return src.sorted(), out.sorted()
}

func (s *refSet) addJobSources(j *config.Job) { s.addAll(j.SourceSecrets()) }

func (s *refSet) addJobOutputs(j *config.Job) { s.addAll(j.OutputSecrets()) }

type refSet map[config.SecretRef]bool

func (s *refSet) addAll(refs []config.KeyedSecret) {
	for _, r := range refs {
		s.add(r.Ref)
	}
}

func (s *refSet) add(r *config.SecretRef) {
	if r == nil || (r.Env == "" && r.Secret == "") {
		return
	}
	if *s == nil {
		*s = refSet{}
	}
	// The JSON key selects part of a value; access is granted on the whole secret.
	(*s)[config.SecretRef{Env: r.Env, Secret: r.Secret}] = true
}

func (s refSet) sorted() []config.SecretRef {
	refs := make([]config.SecretRef, 0, len(s))
	for r := range s {
		refs = append(refs, r)
	}
	sort.Slice(refs, func(i, j int) bool {
		if refs[i].Env != refs[j].Env {
			return refs[i].Env < refs[j].Env
		}
		return refs[i].Secret < refs[j].Secret
	})
	return refs
}

// envSecretNames returns the distinct environment-variable names referenced by refs.
func envSecretNames(refs ...[]config.SecretRef) []string {
	seen := map[string]bool{}
	var names []string
	for _, list := range refs {
		for _, r := range list {
			if r.Env != "" && !seen[r.Env] {
				seen[r.Env] = true
				names = append(names, r.Env)
			}
		}
	}
	sort.Strings(names)
	return names
}
