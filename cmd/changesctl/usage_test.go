package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// TestUsageListsEveryCommand checks that the usage text has a line for
// every command realMain runs.
func TestUsageListsEveryCommand(t *testing.T) {
	t.Parallel()
	for _, c := range commands() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			line := regexp.MustCompile(`(?m)^  changesctl ` + regexp.QuoteMeta(c.name) + `\b`)
			if !line.MatchString(usage) {
				t.Errorf("usage has no line for %q:\n%s", c.name, usage)
			}
		})
	}
}

// TestArgumentErrors covers the argument errors that need no services:
// among them, each action of a command takes its own flags only, and a
// flag of another action is refused before anything is loaded.
func TestArgumentErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"dlq no action", []string{"dlq"}, "want list, show, redrive or purge"},
		{"dlq unknown action", []string{"dlq", "drain"}, `unknown action "drain"`},
		{"dlq no config", []string{"dlq", "list"}, "--config is required"},
		{"dlq purge", []string{"dlq", "purge", "--limit", "3"}, "flag provided but not defined: -limit"},
		{"dlq purge samples", []string{"dlq", "purge", "--samples", "2"}, "flag provided but not defined: -samples"},
		{"dlq list", []string{"dlq", "list", "--yes"}, "flag provided but not defined: -yes"},
		{"dlq show", []string{"dlq", "show", "--mode", "copy"}, "flag provided but not defined: -mode"},
		{"dlq redrive", []string{"dlq", "redrive", "--samples", "2"}, "flag provided but not defined: -samples"},
		{"halt show", []string{"halt", "show", "--wait", "1s"}, "flag provided but not defined: -wait"},
		{"halt retry", []string{"halt", "retry", "--yes"}, "flag provided but not defined: -yes"},
		{"halt clear", []string{"halt", "clear", "--body"}, "flag provided but not defined: -body"},
		{"checkpoint get", []string{"checkpoint", "get", "--force"}, "flag provided but not defined: -force"},
		{"checkpoint set", []string{"checkpoint", "set", "--from", "now"}, "flag provided but not defined: -from"},
		{"checkpoint reset", []string{"checkpoint", "reset", "--seq", "1"}, "flag provided but not defined: -seq"},
		{"halt no action", []string{"halt"}, "want show, retry, skip or clear"},
		{"checkpoint unknown action", []string{"checkpoint", "move"}, `unknown action "move" (want get, set or reset)`},
		{"verify argument", []string{"verify", "pg"}, `verify: unexpected argument "pg"`},
		{"verify negative sample", []string{"verify", "--samples", "-1"}, `verify: --samples -1 is negative`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out, errb strings.Builder
			err := realMain(t.Context(), &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, lookup: testenv.Lookup}, tt.args)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%v: error %v, want %q", tt.args, err, tt.want)
			}
		})
	}
}
