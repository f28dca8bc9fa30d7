package pipeline_test

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

func TestLoad(t *testing.T) {
	t.Parallel()
	testenv.SetAWSEnv()
	dir := t.TempDir()
	good := filepath.Join(dir, "jobs.json")
	doc := `{"stack": {"prefix": "loadtest"},
		"jobs": [{"id": "orders", "source": {"type": "couchdb", "url": "http://127.0.0.1:5984/orders"},
			"outputs": [{"id": "s3", "type": "s3", "s3": {}}]}]}`
	if err := os.WriteFile(good, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	other := strings.Replace(doc, "loadtest", "othertest", 1)
	tests := []struct {
		name       string
		env        map[string]string
		wantBucket string
		wantErr    string
	}{
		{name: "the named file", env: map[string]string{pipeline.EnvConfigFile: good}, wantBucket: "loadtest-data"},
		{name: "the deployed bucket", env: map[string]string{pipeline.EnvConfigFile: good, pipeline.EnvBucket: "deployed-bucket"}, wantBucket: "deployed-bucket"},
		{name: "a missing file", env: map[string]string{pipeline.EnvConfigFile: filepath.Join(dir, "missing.json")}, wantErr: "missing.json"},
		// The stack names the file relative to the function's code, wherever
		// the code is unpacked (/var/task on AWS).
		{name: "relative to the task root", env: map[string]string{pipeline.EnvConfigFile: "jobs.json", pipeline.EnvTaskRoot: dir}, wantBucket: "loadtest-data"},
		{name: "an absolute path whatever the task root", env: map[string]string{pipeline.EnvConfigFile: good, pipeline.EnvTaskRoot: t.TempDir()}, wantBucket: "loadtest-data"},
		// The stack gives a job's functions its configuration in their
		// environment, and their code is the same for every job.
		{name: "in the environment", env: map[string]string{pipeline.EnvConfig: doc, pipeline.EnvTaskRoot: t.TempDir()}, wantBucket: "loadtest-data"},
		{name: "in the environment, the deployed bucket", env: map[string]string{pipeline.EnvConfig: doc, pipeline.EnvBucket: "deployed-bucket"}, wantBucket: "deployed-bucket"},
		{name: "a named file before the environment", env: map[string]string{pipeline.EnvConfigFile: good, pipeline.EnvConfig: other}, wantBucket: "loadtest-data"},
		{name: "an invalid configuration in the environment", env: map[string]string{pipeline.EnvConfig: `{"stack": {"prefix": "loadtest"}, "jobs": []}`}, wantErr: "config in " + pipeline.EnvConfig + ": "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lookup := func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }
			deps, err := pipeline.Load(t.Context(), lookup, slog.New(slog.DiscardHandler), io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Load = %v, want an error naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := deps.Config.Stack.Bucket; got != tt.wantBucket {
				t.Errorf("bucket %q, want %q", got, tt.wantBucket)
			}
			if got := deps.Config.Jobs[0].Outputs[0].S3.Bucket; got != tt.wantBucket {
				t.Errorf("s3 output bucket %q, want %q", got, tt.wantBucket)
			}
			if deps.DynamoDB == nil || deps.SQS == nil || deps.S3 == nil {
				t.Error("clients not built")
			}
		})
	}
}
