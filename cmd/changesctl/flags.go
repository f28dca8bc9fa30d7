package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/pipeline"
)

// The conventions every command follows, through the helpers below:
//
//   - newFlags makes its flag set: -h prints the command's usage and flags
//     on stdout and exits 0; a refused command line exits 64, naming the
//     command (and the flag meant, for a near miss).
//   - scopeFlags defines --config (else CHANGESCTL_CONFIG), --job, --output.
//   - outputFlag defines -o table|json and --json, its shorthand, on every
//     command that prints a result.
//   - one name per idea: --wait (how long to wait for a handoff or an
//     outcome), --limit (at most this many messages), --samples (examples
//     shown per kind), --job (the jobs a command covers), --timeout (how
//     long the command itself may run); renamedFlag keeps a name a release
//     before 1.0.0 used, until 2.0.0.
//   - usagef for a command line that cannot be right (exit 64),
//     errUnsupported for a command that does not apply to what it was
//     pointed at (exit 3), exitError(exitDrift) for drift found (exit 2).

// Descriptions of --job and --output for commands that act on one job or
// one output and default to the only one.
const (
	helpOneJob    = "job `id` (default: the only job)"
	helpOneOutput = "output `id` (default: the job's only output)"
)

// refusalWriter is the output of a flag set: the flag package writes to it
// only when it refuses the command line, just before calling Usage.
type refusalWriter struct{ refused bool }

func (w *refusalWriter) Write(p []byte) (int, error) {
	w.refused = true
	return len(p), nil
}

// newFlags returns the flag set of a command (name: "status", "dlq list").
// Asked for help, it prints the command's usage and flags to stdout, and
// Parse returns flag.ErrHelp (exit status 0). When it refuses the command
// line it prints nothing and records itself in env.refused: realMain makes
// the error Parse returned a usage error.
func newFlags(env *cliEnv, name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	out := &refusalWriter{}
	fs.SetOutput(out)
	fs.Usage = func() {
		if out.refused {
			env.refused = fs
			return
		}
		fmt.Fprint(env.stdout, helpText(name))
		fmt.Fprintf(env.stdout, "\nflags of changesctl %s:\n", name)
		printFlags(env.stdout, fs)
	}
	return fs
}

// helpText is the usage of a command ("dlq" or "dlq list"): its own text
// when it has one, else its lines of the overview.
func helpText(name string) string {
	verb, _, _ := strings.Cut(name, " ")
	if t, ok := commandUsage[verb]; ok {
		return t
	}
	var b strings.Builder
	b.WriteString("usage:\n")
	in := false
	for line := range strings.Lines(usage) {
		switch {
		case strings.HasPrefix(line, "  changesctl "+verb+" ") || line == "  changesctl "+verb+"\n":
			in = true
		case strings.HasPrefix(line, "  changesctl ") || !strings.HasPrefix(line, "   "):
			in = false
		}
		if in {
			b.WriteString(line)
		}
	}
	return b.String()
}

// commandUsage holds the usage texts of the commands that have their own.
var commandUsage = map[string]string{
	"checkpoint": checkpointUsage,
	"dlq":        dlqUsage,
	"halt":       haltUsage,
	"invoke":     invokeUsage,
	"job":        jobUsage,
	"bucket":     bucketUsage,
	"docid":      docIDUsage,
}

// printFlags lists the flags of fs as the help shows them: --name and the
// kind of value, the description and the default, without the names
// renamedFlag keeps.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		if strings.HasPrefix(f.Usage, deprecatedUsage) {
			return
		}
		kind, text := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if len(f.Name) == 1 {
			line = "  -" + f.Name
		}
		if kind != "" {
			line += " " + kind
		}
		switch f.DefValue {
		case "", "0", "false", "0s", "[]":
		default:
			text += " (default " + f.DefValue + ")"
		}
		if len(line) <= 26 {
			fmt.Fprintf(w, "%-28s%s\n", line, text)
		} else {
			fmt.Fprintf(w, "%s\n%28s%s\n", line, "", text)
		}
	})
}

// refusedFlags makes the error of a flag set's Parse a usage error naming
// the command and, for a flag it does not have, the one probably meant.
func refusedFlags(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		var names []string
		fs.VisitAll(func(f *flag.Flag) {
			if !strings.HasPrefix(f.Usage, deprecatedUsage) {
				names = append(names, f.Name)
			}
		})
		if hint := didYouMean(strings.TrimPrefix(name, "-"), names, "--"); hint != "" {
			return usagef("%s: %s%s", fs.Name(), msg, hint)
		}
	}
	return usagef("%s: %s (changesctl %s -h lists its flags)", fs.Name(), msg, fs.Name())
}

// didYouMean returns " (did you mean PREFIXNAME?)" for the one of names
// word most likely mistypes (a letter or two off, two letters swapped, or
// the start of only that name), or "" when none is close.
func didYouMean(word string, names []string, prefix string) string {
	best, bestD := "", 3
	allowed := 1
	if len([]rune(word)) > 5 {
		allowed = 2
	}
	var starts []string
	for _, n := range names {
		if d := editDistance(word, n); d <= allowed && d < bestD {
			best, bestD = n, d
		}
		if len(word) >= 3 && strings.HasPrefix(n, word) {
			starts = append(starts, n)
		}
	}
	if best == "" && len(starts) == 1 {
		best = starts[0]
	}
	if best == "" {
		return ""
	}
	return " (did you mean " + prefix + best + "?)"
}

// editDistance is the optimal string alignment distance of a and b: the
// insertions, deletions, substitutions and swaps of adjacent letters that
// make one the other.
func editDistance(a, b string) int {
	x, y := []rune(a), []rune(b)
	d := make([][]int, len(x)+1)
	for i := range d {
		d[i] = make([]int, len(y)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(x); i++ {
		for j := 1; j <= len(y); j++ {
			cost := 1
			if x[i-1] == y[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && x[i-1] == y[j-2] && x[i-2] == y[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(x)][len(y)]
}

// deprecatedUsage starts the description of a flag's name from before 1.0.0.
const deprecatedUsage = "deprecated: use --"

// oldName is a flag name from before 1.0.0 for a flag that has another now:
// it sets the same value and warns.
type oldName struct {
	flag.Value
	warn func()
}

func (o *oldName) Set(s string) error {
	o.warn()
	return o.Value.Set(s)
}

// renamedFlag keeps old, the name a release before 1.0.0 gave the flag now
// called name (defined on fs before), for command lines written then: it
// sets the same value, warns on stderr that it is deprecated, and is left
// out of the help. A minor release removes no flag (docs/versioning.md): it
// goes in 2.0.0. Not for boolean flags.
func renamedFlag(env *cliEnv, fs *flag.FlagSet, old, name string) {
	f := fs.Lookup(name)
	fs.Var(&oldName{Value: f.Value, warn: func() {
		fmt.Fprintf(env.stderr, "changesctl: %s: --%s is deprecated, use --%s (--%s goes in 2.0.0)\n", fs.Name(), old, name, old)
	}}, old, deprecatedUsage+name)
}

// outputFlag defines -o (table, the default, or json) and --json, its
// shorthand, on the flag set of a command that prints a result; the result
// says whether JSON was asked for.
func outputFlag(fs *flag.FlagSet) *bool { return formatFlag(fs, false) }

// formatFlag is outputFlag with JSON as the default when defJSON.
func formatFlag(fs *flag.FlagSet, defJSON bool) *bool {
	asJSON := new(bool)
	*asJSON = defJSON
	def := "table"
	if defJSON {
		def = "json"
	}
	fs.Func("o", "output `format`: table or json (default "+def+")", func(s string) error {
		switch s {
		case "table":
			*asJSON = false
		case "json":
			*asJSON = true
		default:
			return errors.New("want json or table")
		}
		return nil
	})
	fs.BoolFunc("json", "short for -o json", func(s string) error {
		v, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		*asJSON = v
		return nil
	})
	return asJSON
}

// parseAll parses the flags of fs wherever they stand among args ("docid
// hash ID -o json"), up to a "--", and returns the other arguments in
// order.
func parseAll(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		left := fs.Args()
		if n := len(args) - len(left); n > 0 && args[n-1] == "--" || len(left) == 0 {
			return append(rest, left...), nil
		}
		rest, args = append(rest, left[0]), left[1:]
	}
}

// runAction runs the action that starts the arguments of a command with
// actions (`dlq list`, `halt show`...) on the arguments after it; each
// action defines and parses its own flags. -h prints the command's usage.
// A missing action prints it to stderr; both it and an unknown action are
// usage errors naming the actions there are.
func runAction(ctx context.Context, env *cliEnv, cmd, usage string, args []string, actions ...command) error {
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Fprint(env.stdout, usage)
		return flag.ErrHelp
	}
	names := make([]string, len(actions))
	for i, a := range actions {
		if len(args) > 0 && a.name == args[0] {
			return a.run(ctx, env, args[1:])
		}
		names[i] = a.name
	}
	want := "want " + oneOf(names)
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(env.stderr, usage)
		return usagef("%s: %s", cmd, want)
	}
	return usagef("%s: unknown action %q (%s)%s", cmd, args[0], want, didYouMean(args[0], names, ""))
}

// oneOf lists words as "a, b or c".
func oneOf(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// envConfig names the configuration file of a command without --config.
const envConfig = "CHANGESCTL_CONFIG"

// scope is what a command's --config, --job and --output flags name.
type scope struct {
	path, job, output *string
}

// scopeFlags defines --config on fs, and --job and --output with these
// descriptions; an empty description leaves that flag out.
func scopeFlags(fs *flag.FlagSet, jobHelp, outputHelp string) *scope {
	s := &scope{path: fs.String("config", "", "the job configuration `file` (default: $"+envConfig+")"), job: new(string), output: new(string)}
	if jobHelp != "" {
		s.job = fs.String("job", "", jobHelp)
	}
	if outputHelp != "" {
		s.output = fs.String("output", "", outputHelp)
	}
	return s
}

// configFile is the configuration file a command reads: --config, else
// CHANGESCTL_CONFIG (as KUBECONFIG is kubectl's). from names where it came
// from, for errors.
type configFile struct{ path, from string }

// configFile returns the file --config names, else the one CHANGESCTL_CONFIG
// names; neither is a usage error.
func (s *scope) configFile(env *cliEnv) (configFile, error) { return findConfig(env, *s.path) }

// findConfig returns the file path names (--config), else the one
// CHANGESCTL_CONFIG names; neither is a usage error.
func findConfig(env *cliEnv, path string) (configFile, error) {
	if path != "" {
		return configFile{path, "--config"}, nil
	}
	if v, ok := env.lookup(envConfig); ok && v != "" {
		return configFile{v, envConfig}, nil
	}
	return configFile{}, usagef("--config is required (or set %s)", envConfig)
}

// wrap names the variable a configuration file came from in an error
// about it; --config needs no naming: the file's name is in the error.
func (c configFile) wrap(err error) error {
	if err == nil || c.from != envConfig {
		return err
	}
	return fmt.Errorf("%s=%s: %w", envConfig, c.path, err)
}

// load reads the configuration file and builds the dependencies.
func (s *scope) load(ctx context.Context, env *cliEnv, verbose bool) (*pipeline.Deps, error) {
	return load(ctx, env, *s.path, env.stderr, verbose)
}

// openJob loads the dependencies and finds the job; cmd prefixes a failure
// to find it. The caller closes the dependencies.
func (s *scope) openJob(ctx context.Context, env *cliEnv, cmd string) (*pipeline.Deps, *config.Job, error) {
	deps, err := s.load(ctx, env, false)
	if err != nil {
		return nil, nil, err
	}
	j, err := pickJob(deps.Config, *s.job)
	if err != nil {
		deps.Close()
		return nil, nil, fmt.Errorf("%s: %w", cmd, err)
	}
	return deps, j, nil
}

// openOutput loads the dependencies and finds the job and the output; cmd
// prefixes a failure to find them. The caller closes the dependencies.
func (s *scope) openOutput(ctx context.Context, env *cliEnv, cmd string) (*pipeline.Deps, *config.Job, *config.Output, error) {
	deps, err := s.load(ctx, env, false)
	if err != nil {
		return nil, nil, nil, err
	}
	j, o, err := route(deps.Config, *s.job, *s.output)
	if err != nil {
		deps.Close()
		return nil, nil, nil, fmt.Errorf("%s: %w", cmd, err)
	}
	return deps, j, o, nil
}
