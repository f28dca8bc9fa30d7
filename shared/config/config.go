// Package config loads and validates the job configuration file: the jobs, their
// sources, feed options, outputs and the names of the AWS resources they use.
//
// The file is JSON with snake_case keys. Line (//) and block (/* */) comments are
// allowed so that a sample can explain itself; they are stripped before decoding.
//
// Parse checks what every component needs (Validate); ParseForDeploy adds
// what AWS would refuse, and is what the CDK app and changesctl validate
// run. The reference docs/configuration.md is generated from this package
// (reference.go, keydocs.go).
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
// Unknown keys are errors, so a misspelt setting is never silently ignored.
// The error reports every unknown key and every problem Validate finds.
func Parse(b []byte) (*File, error) {
	return parse(b, (*File).problems)
}

// ParseForDeploy is Parse with the checks a deploy makes on top: what AWS
// refuses of a file that is valid here (log retention, resource name
// lengths, secret ARNs). Its error reports the problems of both at once.
func ParseForDeploy(b []byte) (*File, error) {
	return parse(b, func(f *File) []error { return append(f.problems(), f.deployProblems()...) })
}

// parse decodes, defaults and checks b with check.
func parse(b []byte, check func(*File) []error) (*File, error) {
	b = StripComments(b)
	var doc any
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&doc); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	unknown := unknownKeys("", doc, reflect.TypeFor[File]())
	var f File
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&f); err != nil {
		return nil, errors.Join(append(unknown, fmt.Errorf("decode: %w", err))...)
	}
	f.SetDefaults()
	if err := errors.Join(append(unknown, check(&f)...)...); err != nil {
		return nil, err
	}
	return &f, nil
}

// StripComments removes // and /* */ comments that are outside JSON strings.
func StripComments(b []byte) []byte {
	out := make([]byte, 0, len(b))
	inString, escaped := false, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			out = append(out, c)
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		if c == '"' {
			inString = true
			out = append(out, c)
			continue
		}
		if c == '/' && i+1 < len(b) && b[i+1] == '/' {
			for i < len(b) && b[i] != '\n' {
				i++
			}
			out = append(out, '\n')
			continue
		}
		if c == '/' && i+1 < len(b) && b[i+1] == '*' {
			i += 2
			for i+1 < len(b) && !(b[i] == '*' && b[i+1] == '/') {
				i++
			}
			i++
			out = append(out, ' ')
			continue
		}
		out = append(out, c)
	}
	return out
}
