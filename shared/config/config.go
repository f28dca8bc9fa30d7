// Package config loads and validates the job configuration file: the jobs, their
// sources, feed options, outputs and the names of the AWS resources they use.
//
// The file is JSON with snake_case keys. Line (//) and block (/* */) comments are
// allowed so that a sample can explain itself; they are blanked out before
// decoding, so that a problem's line and column are the file's.
//
// Parse checks what every component needs (Validate); ParseForDeploy adds
// what AWS would refuse; CheckForDeploy, which the CDK app and changesctl
// validate run, also returns the deploy's warnings. The reference
// docs/configuration.md is generated from this package (reference.go,
// keydocs.go).
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
)

// Load reads, decodes, defaults and validates the file at path.
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	f, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return f, nil
}

// Parse decodes, defaults and validates a configuration document.
// Unknown keys are errors, so a misspelt setting is never silently ignored;
// so are keys in another case and keys given twice. The error reports every
// problem at once, each under its key as the file writes it: values of the
// wrong type, unknown keys and every problem Validate finds. A file that is
// not JSON is reported at the line and column where it breaks.
func Parse(b []byte) (*File, error) {
	f, _, err := parse(b, (*File).problems)
	return f, err
}

// ParseForDeploy is Parse with the checks a deploy makes on top: what AWS
// refuses of a file that is valid here (log retention, resource name
// lengths, secret names and ARNs). Its error reports the problems of both
// at once.
func ParseForDeploy(b []byte) (*File, error) {
	f, _, err := CheckForDeploy(b)
	return f, err
}

// CheckForDeploy is ParseForDeploy that also returns, for a file it
// accepts, what a deploy of it would take but its operator should act on
// (see Warning).
func CheckForDeploy(b []byte) (*File, []Warning, error) {
	return parse(b, func(f *File) []error { return append(f.problems(), f.deployProblems()...) })
}

// parse reads, decodes, defaults and checks b with check.
func parse(b []byte, check func(*File) []error) (*File, []Warning, error) {
	src, err := newSource(b)
	if err != nil {
		return nil, nil, err
	}
	doc, err := src.read()
	if err != nil {
		return nil, nil, err
	}
	var c checker
	if _, ok := doc.(*object); !ok {
		c.wrong("", doc, "an object")
		return nil, nil, errors.Join(c.problems...)
	}
	c.value("", []int{}, doc, reflect.TypeFor[File]())
	text := src.json
	if len(c.problems) > 0 {
		// What is left once the problems are dropped, to be checked for
		// the rest.
		if text, err = json.Marshal(doc); err != nil {
			return nil, nil, fmt.Errorf("decode: %w", err)
		}
	}
	var f File
	if err := json.NewDecoder(bytes.NewReader(text)).Decode(&f); err != nil {
		return nil, nil, errors.Join(append(c.problems, fmt.Errorf("decode: %w", err))...)
	}
	bucketGiven := f.Stack.Bucket != ""
	f.SetDefaults()
	problems := append(c.problems, c.zeroProblems(&f)...)
	for _, err := range check(&f) {
		if !c.covers(err) {
			problems = append(problems, err)
		}
	}
	if len(problems) > 0 {
		return nil, nil, errors.Join(problems...)
	}
	return &f, f.warnings(bucketGiven), nil
}

// StripComments blanks out the // and /* */ comments that are outside JSON
// strings: each of their characters but a newline becomes a space, so that
// every line and column stays where it was.
func StripComments(b []byte) []byte {
	out, _ := stripComments(b)
	return out
}

// stripComments is StripComments, and the offset of a /* comment that is
// never closed, or -1.
func stripComments(b []byte) ([]byte, int) {
	out := bytes.Clone(b)
	blank := func(from, to int) {
		for i := from; i < to; i++ {
			if out[i] != '\n' {
				out[i] = ' '
			}
		}
	}
	inString, escaped := false, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '/' && i+1 < len(b) && b[i+1] == '/':
			end := bytes.IndexByte(b[i:], '\n')
			if end < 0 {
				end = len(b) - i
			}
			blank(i, i+end)
			i += end
		case c == '/' && i+1 < len(b) && b[i+1] == '*':
			end := bytes.Index(b[i+2:], []byte("*/"))
			if end < 0 {
				blank(i, len(b))
				return out, i
			}
			blank(i, i+2+end+2)
			i += 2 + end + 1
		}
	}
	return out, -1
}
