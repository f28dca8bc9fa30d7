#!/usr/bin/env bash
# Builds Couchbase Sync Gateway 3.1.0 (Community Edition source) into
# .local/bin/sync_gateway from the Go module pinned in
# tests/tools/syncgateway/go.mod, and prints the binary's path.
#
# Idempotent: a binary whose embedded module version (go version -m) is the
# pinned one is kept; anything else is rebuilt. The first build downloads the
# module graph and compiles it (minutes on a cold cache); later runs take well
# under a second. Nothing is started: tests start their own Sync Gateway on
# free loopback ports (shared/testenv/syncgateway.go).
#
#   localstack/syncgateway.sh          build if needed, print the path
#   localstack/syncgateway.sh --check  exit 1 unless the pinned binary is there
#
# Environment: SYNC_GATEWAY_BIN [.local/bin/sync_gateway] where to put it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/tests/tools/syncgateway"
BIN="${SYNC_GATEWAY_BIN:-$ROOT/.local/bin/sync_gateway}"
MODULE=github.com/couchbase/sync_gateway

say() { printf 'syncgateway: %s\n' "$*" >&2; }
die() { printf 'syncgateway: ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "go not found on PATH"

# The version the tools module pins (its require line for the module).
want="$(awk -v m="$MODULE" '$1 == m { print $2; exit }' "$TOOLS/go.mod")"
[[ -n "$want" ]] || die "$TOOLS/go.mod does not require $MODULE"

# have prints the module version embedded in the binary, if any.
have() {
	[[ -x "$BIN" ]] || return 0
	go version -m "$BIN" 2>/dev/null | awk -v m="$MODULE" '($1 == "mod" || $1 == "dep") && $2 == m { print $3; exit }'
}

if [[ "$(have)" == "$want" ]]; then
	[[ "${1:-}" == --check ]] || echo "$BIN"
	exit 0
fi
[[ "${1:-}" == --check ]] && { say "$BIN is missing or not $MODULE $want"; exit 1; }

mkdir -p "$(dirname "$BIN")"
# One build at a time (test packages run in parallel processes); whoever
# waited finds the binary built by the other.
exec 9>"$BIN.lock"
flock 9
if [[ "$(have)" == "$want" ]]; then
	echo "$BIN"
	exit 0
fi
say "building $MODULE $want into $BIN (the first build takes a few minutes)"
start=$SECONDS
# -mod=readonly: go.mod and go.sum are complete, so nothing may change the
# pinned graph. GONOSUMDB: Sync Gateway replaces graphql-go with its own fork,
# whose hash go.sum already holds; the checksum database is not asked.
# GOWORK=off: a go.work above the repository must not pull in other modules.
(
	cd "$TOOLS"
	GOWORK=off GOFLAGS=-mod=readonly GONOSUMDB=github.com/couchbasedeps CGO_ENABLED=0 \
		go build -trimpath -o "$BIN.tmp" "$MODULE"
)
mv -f "$BIN.tmp" "$BIN"
[[ "$(have)" == "$want" ]] || die "built $BIN but it does not embed $MODULE $want"
say "built in $((SECONDS - start))s"
echo "$BIN"
