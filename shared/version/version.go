// Package version says which release a binary was built from. The release
// and the commit are stamped at build time by the linker:
//
//	-ldflags "-X github.com/changes-worker/changes-worker/shared/version.version=1.0.0
//	          -X github.com/changes-worker/changes-worker/shared/version.commit=<git commit>"
//
// `make build`, `make ctl` and localstack/deploy.sh stamp the release named
// in the repository's VERSION file. A binary built otherwise (go run, go
// test, a plain go build) says Devel.
package version

import "runtime"

// Devel is the version of a binary built without a stamped release.
const Devel = "devel"

// Stamped by the linker; empty when the build did not stamp them.
var (
	version string
	commit  string
)

// String returns the release the binary was built from ("1.0.0"), or Devel.
func String() string {
	if version == "" {
		return Devel
	}
	return version
}

// Commit returns the commit the binary was built from, or "" when the build
// did not stamp one.
func Commit() string { return commit }

// Long describes the build on one line: the release, the commit when
// stamped, the Go toolchain and the platform, as in
// "1.0.0 (commit 8df98482f5c1, go1.26.8, linux/arm64)".
func Long() string {
	s := String() + " ("
	if commit != "" {
		s += "commit " + commit + ", "
	}
	return s + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")"
}
