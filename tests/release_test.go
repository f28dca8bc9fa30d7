package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoRoot is the repository's top directory (the tests run in tests/).
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// semver is a release number as VERSION holds it.
var semver = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

// releaseVersion reads the release the repository builds from VERSION.
func releaseVersion(t testing.TB, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatalf("read the release number: %v", err)
	}
	v := strings.TrimSpace(string(b))
	if !semver.MatchString(v) {
		t.Fatalf("VERSION holds %q, want MAJOR.MINOR.PATCH", v)
	}
	return v
}

// currentChangesctl builds this checkout's changesctl as users do, with
// `make ctl` (its version stamped), into a directory of the test's.
func currentChangesctl(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "changesctl")
	cmd := exec.Command("make", "-s", "ctl", "CTL="+bin)
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make ctl: %v\n%s", err, out)
	}
	return bin
}

// TestMakeStampsVersion: `make ctl` stamps the release VERSION names into
// changesctl, which `changesctl version` prints, and `make build` gives the
// functions' bootstraps the same stamp.
func TestMakeStampsVersion(t *testing.T) {
	parallel(t)
	root := repoRoot(t)
	want := releaseVersion(t, root)
	out, err := exec.Command(currentChangesctl(t), "version").CombinedOutput()
	if err != nil {
		t.Fatalf("changesctl version: %v\n%s", err, out)
	}
	if f := strings.Fields(string(out)); len(f) < 2 || f[0] != "changesctl" || f[1] != want {
		t.Errorf("changesctl version printed %q, want it to start with \"changesctl %s\"", out, want)
	}
	dry := exec.Command("make", "-n", "build")
	dry.Dir = root
	script, err := dry.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n build: %v\n%s", err, script)
	}
	stamp := "-X github.com/changes-worker/changes-worker/shared/version.version=" + want
	if !strings.Contains(string(script), stamp) || !strings.Contains(string(script), "./functions/") {
		t.Errorf("make build does not build the functions with %q:\n%s", stamp, script)
	}
}
