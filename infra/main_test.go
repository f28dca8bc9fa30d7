package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestResolveConfigPath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		context string
		env     map[string]string
		want    string
		wantErr string
	}{
		{name: "context", context: "prod/jobs.json", want: "prod/jobs.json"},
		{name: "environment", env: map[string]string{envConfig: "prod/jobs.json"}, want: "prod/jobs.json"},
		{name: "both the same file", context: "prod/jobs.json", env: map[string]string{envConfig: "./prod/jobs.json"}, want: "prod/jobs.json"},
		{name: "both, different files", context: "prod/jobs.json", env: map[string]string{envConfig: "localstack/jobs.json"}, wantErr: "two job configurations named"},
		{name: "none", wantErr: errNoConfig.Error()},
		{name: "empty environment", env: map[string]string{envConfig: ""}, wantErr: errNoConfig.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lookup := func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }
			got, err := resolveConfigPath(tt.context, lookup)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("resolveConfigPath error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("resolveConfigPath = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
	if _, err := resolveConfigPath("", func(string) (string, bool) { return "", false }); !errors.Is(err, errNoConfig) {
		t.Errorf("no configuration: error = %v, want errNoConfig", err)
	}
}

func TestParseVariant(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    variant
		wantErr bool
	}{
		{in: "", want: variantFull},
		{in: "full", want: variantFull},
		{in: "local", want: variantLocal},
		{in: "Local", wantErr: true},
		{in: "lite", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := parseVariant(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("parseVariant(%q) = %q, %v; want %q (error %v)", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// TestCDKJSONNamesNoConfig guards the default: cdk.json must not name a job
// configuration, or a bare `cdk deploy` would ship it.
func TestCDKJSONNamesNoConfig(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "cdk.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Context map[string]any `json:"context"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{contextConfig, contextVariant, contextBuildDir} {
		if v, ok := doc.Context[k]; ok {
			t.Errorf("cdk.json sets context %s = %v; it must be passed explicitly", k, v)
		}
	}
}

func TestParseSchedules(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in           string
		wantDisabled bool
		wantErr      bool
	}{
		{in: "", wantDisabled: false},
		{in: "enabled", wantDisabled: false},
		{in: "disabled", wantDisabled: true},
		{in: "off", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := parseSchedules(tt.in)
			if (err != nil) != tt.wantErr || got != tt.wantDisabled {
				t.Errorf("parseSchedules(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.wantDisabled, tt.wantErr)
			}
		})
	}
}
