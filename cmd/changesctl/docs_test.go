package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocsCommandsParse: every changesctl command line in the code blocks
// of the documentation names a command, action and flags that exist, under
// their current names. Each is run with a configuration that cannot be
// read, so it stops before doing anything; a usage error or a deprecation
// warning fails the test. receiver and sample, which need no configuration
// and would serve or write, are left out.
func TestDocsCommandsParse(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"), filepath.Join(root, "events", "README.md"), filepath.Join(root, "localstack", "README.md"))
	missing := filepath.Join(t.TempDir(), "no-such-config.json")
	lookup := func(k string) (string, bool) {
		if k == envConfig {
			return missing, true
		}
		return noConfigLookup(k)
	}
	checked := 0
	for _, page := range pages {
		md, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range docCommands(string(md)) {
			args := shellWords(line)
			if len(args) < 2 || args[1] == "receiver" || args[1] == "sample" {
				continue
			}
			for i, a := range args {
				if a == "--config" && i+1 < len(args) {
					args[i+1] = missing
				}
			}
			var out, errb strings.Builder
			err := realMain(t.Context(), &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, lookup: lookup}, args[1:])
			var ue *usageError
			if errors.As(err, &ue) || strings.Contains(errb.String(), "deprecated") {
				t.Errorf("%s: %s\n  %v\n  %s", filepath.Base(page), line, err, errb.String())
			}
			checked++
		}
	}
	if checked < 50 {
		t.Errorf("checked %d changesctl command lines in the documentation; expected many more: is the extraction broken?", checked)
	}
}

// docCommands returns the changesctl command lines of the fenced code
// blocks of a Markdown page: continuation lines joined, a "$ " prompt, a
// comment and anything after a pipe left out.
func docCommands(md string) []string {
	var cmds []string
	in := false
	pending := ""
	for line := range strings.Lines(md) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			in = !in
			pending = ""
			continue
		}
		if !in {
			continue
		}
		if pending != "" {
			line = pending + " " + strings.TrimSpace(line)
			pending = ""
		}
		if strings.HasSuffix(line, "\\") {
			pending = strings.TrimSuffix(line, "\\")
			continue
		}
		l := strings.TrimPrefix(strings.TrimSpace(line), "$ ")
		if strings.HasPrefix(l, "changesctl ") {
			cmds = append(cmds, l)
		}
	}
	return cmds
}

// shellWords splits a command line as a POSIX shell would for the cases
// the documentation has: single and double quotes, words up to an unquoted
// "#" comment, "|" or ";".
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == '#' && !inWord, r == '|', r == ';':
			if inWord {
				words = append(words, cur.String())
			}
			return words
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}
