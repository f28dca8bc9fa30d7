#!/usr/bin/env bash
# Stops what localstack/up.sh started: the moto server and pouchdb-server (by
# their pid files in .local/run/) and the PostgreSQL cluster. A service that
# up.sh did not start (no pid file, e.g. a LocalStack container) is left alone.
# Idempotent: stopping something already stopped is not an error.
# In-memory state (moto's queues/tables/buckets, pouchdb-server's databases)
# is lost; PostgreSQL data stays on disk.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN="$ROOT/.local/run"
PG_VERSION="${PG_VERSION:-15}"
PG_CLUSTER="${PG_CLUSTER:-main}"

say() { printf 'down: %s\n' "$*" >&2; }

# stop NAME PIDFILE PATTERN stops the process in PIDFILE if its command line
# still contains PATTERN (so a recycled pid is never signalled).
stop() {
	local name="$1" file="$2" pattern="$3" pid i
	if [[ ! -f "$file" ]]; then
		say "$name: not started by up.sh (no $file)"
		return
	fi
	pid="$(cat "$file" 2>/dev/null || true)"
	if ! [[ "$pid" =~ ^[0-9]+$ ]] || ! kill -0 "$pid" 2>/dev/null ||
		! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$pattern"; then
		say "$name: not running (stale pid file removed)"
		rm -f "$file"
		return
	fi
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		say "$name: still running after 5s, sending SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$file"
	say "$name: stopped (pid $pid)"
}

stop "moto server" "$RUN/moto.pid" "moto[._]server"
stop "pouchdb-server" "$RUN/pouchdb-server.pid" pouchdb-server

if command -v pg_lsclusters >/dev/null && [[ -n "$(pg_lsclusters -h "$PG_VERSION" "$PG_CLUSTER" 2>/dev/null)" ]]; then
	read -r _ _ _ status _ <<<"$(pg_lsclusters -h "$PG_VERSION" "$PG_CLUSTER")"
	if [[ "$status" == online* ]]; then
		pg_ctlcluster "$PG_VERSION" "$PG_CLUSTER" stop >&2
		say "postgres: cluster $PG_VERSION $PG_CLUSTER stopped"
	else
		say "postgres: cluster $PG_VERSION $PG_CLUSTER not running"
	fi
else
	say "postgres: no cluster $PG_VERSION $PG_CLUSTER"
fi
