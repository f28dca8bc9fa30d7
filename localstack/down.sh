#!/usr/bin/env bash
# Stops what localstack/up.sh started: LocalStack, moto (S3), DynamoDB Local
# and pouchdb-server (by their pid files in .local/run/), and the PostgreSQL
# cluster. A service that up.sh did not start (no pid file) is left alone.
# Idempotent: stopping something already stopped is not an error.
# LocalStack, moto, DynamoDB Local and pouchdb-server keep their state in memory:
# queues, buckets, tables and databases are gone. PostgreSQL data stays on disk.
#
# LocalStack, moto and DynamoDB Local run in process groups of their own (up.sh
# starts them with setsid): the whole group gets SIGTERM, then SIGKILL after
# STOP_TIMEOUT seconds [10].
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN="$ROOT/.local/run"
PG_VERSION="${PG_VERSION:-15}"
PG_CLUSTER="${PG_CLUSTER:-main}"
STOP_TIMEOUT="${STOP_TIMEOUT:-10}"

say() { printf 'down: %s\n' "$*" >&2; }

# group_alive PGID is true while any process of the group lives.
group_alive() { kill -0 -- "-$1" 2>/dev/null; }

# stop NAME PIDFILE PATTERN stops the process in PIDFILE, with its process
# group when it leads one, if its command line still contains PATTERN (so a
# recycled pid is never signalled).
stop() {
	local name="$1" file="$2" pattern="$3" pid target i
	if [[ ! -f "$file" ]]; then
		say "$name: not started by up.sh (no ${file#"$ROOT"/})"
		return
	fi
	pid="$(cat "$file" 2>/dev/null || true)"
	if ! [[ "$pid" =~ ^[0-9]+$ ]] || ! kill -0 "$pid" 2>/dev/null ||
		! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$pattern"; then
		say "$name: not running (stale pid file removed)"
		rm -f "$file"
		return
	fi
	# A process that leads its own group is stopped with everything it started.
	target="$pid"
	if [[ "$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')" == "$pid" ]]; then
		target="-$pid"
	fi
	kill -TERM -- "$target" 2>/dev/null || true
	for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
		if [[ "$target" == -* ]]; then group_alive "$pid" || break; else kill -0 "$pid" 2>/dev/null || break; fi
		sleep 0.1
	done
	if kill -0 -- "$target" 2>/dev/null; then
		say "$name: still running after ${STOP_TIMEOUT}s, sending SIGKILL"
		kill -KILL -- "$target" 2>/dev/null || true
	fi
	rm -f "$file"
	say "$name: stopped (pid $pid)"
}

stop LocalStack "$RUN/localstack.pid" localstack.runtime.main
stop "moto (S3)" "$RUN/moto-s3.pid" moto.server
stop "DynamoDB Local" "$RUN/dynamodb-local.pid" com.amazonaws.services.dynamodbv2.local.main.ServerRunner
stop pouchdb-server "$RUN/pouchdb-server.pid" pouchdb-server
# Earlier versions of up.sh ran moto's server as the AWS emulator.
[[ -f "$RUN/moto.pid" ]] && stop "moto server (started by an earlier up.sh)" "$RUN/moto.pid" "moto[._]server"

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
