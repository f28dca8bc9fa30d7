#!/usr/bin/env bash
# Builds AWS's Lambda Runtime Interface Emulator into .local/bin/aws-lambda-rie
# from its Go module at the pinned version, and prints the binary's path.
# LocalStack, as localstack/up.sh starts it, runs each Lambda function under
# it (localstack/lambdahost) and looks for it as each function starts; the
# make targets that run functions (test, test-infra, bench,
# localstack-deploy, localstack-demo) run this script first.
#
# Idempotent: a binary whose embedded module version (go version -m) is the
# pinned one is kept; anything else is rebuilt. The first build downloads the
# module and compiles it (about two minutes on a cold Go cache); later runs
# take well under a second.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/.local/bin/aws-lambda-rie"
MODULE=github.com/aws/aws-lambda-runtime-interface-emulator
VERSION=v0.0.0-20261030222936-bef5c4ba774d

say() { printf 'lambda-rie: %s\n' "$*" >&2; }
die() { printf 'lambda-rie: ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "go not found on PATH"

# have prints the module version embedded in the binary, if any.
have() {
	[[ -x "$BIN" ]] || return 0
	go version -m "$BIN" 2>/dev/null | awk '$1 == "mod" { print $3; exit }'
}

if [[ "$(have)" == "$VERSION" ]]; then
	echo "$BIN"
	exit 0
fi
mkdir -p "$(dirname "$BIN")"
# One build at a time; whoever waited finds the binary built by the other.
exec 9>"$BIN.lock"
flock 9
if [[ "$(have)" == "$VERSION" ]]; then
	echo "$BIN"
	exit 0
fi
say "building $MODULE/cmd/aws-lambda-rie $VERSION into $BIN"
start=$SECONDS
# GOWORK=off: a go.work above the repository must not pull in other modules.
GOWORK=off CGO_ENABLED=0 GOBIN="$(dirname "$BIN")" go install -trimpath "$MODULE/cmd/aws-lambda-rie@$VERSION" ||
	die "go install $MODULE/cmd/aws-lambda-rie@$VERSION failed"
[[ "$(have)" == "$VERSION" ]] || die "built $BIN but it does not embed $MODULE $VERSION"
say "built in $((SECONDS - start))s"
echo "$BIN"
