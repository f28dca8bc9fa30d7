#!/usr/bin/env bash
# Starts the local services the changes worker needs, installing whatever is
# missing, and prints what runs where. Idempotent: a service that already
# answers on its port is left alone, whoever started it.
#
#   AWS emulator      moto server (moto[server]==5.2.1)  127.0.0.1:4566
#                     via localstack/moto_server.py (DynamoDB serialized, SQS attributes on demand)
#   CouchDB source    pouchdb-server 4.2.0, in memory    127.0.0.1:5984
#   PostgreSQL        Debian cluster "15 main"           127.0.0.1:5432
#   Sync Gateway      3.1.0 built from its Go module     .local/bin/sync_gateway
#                     (installed only: tests start their own, on free ports)
#
# State (installs, pid files, logs) lives in .local/ at the repository root,
# which git ignores. localstack/down.sh stops what this script started.
#
# Environment knobs (defaults in brackets):
#   MOTO_PORT [4566]  COUCH_PORT [5984]  PG_VERSION [15]  PG_CLUSTER [main]
#   UP_TIMEOUT [60]   seconds to wait for a service to answer after starting it
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL="$ROOT/.local"
LOGS="$LOCAL/logs"
RUN="$LOCAL/run"

MOTO_VERSION=5.2.1
POUCHDB_SERVER_VERSION=4.2.0
MOTO_PORT="${MOTO_PORT:-4566}"
COUCH_PORT="${COUCH_PORT:-5984}"
PG_VERSION="${PG_VERSION:-15}"
PG_CLUSTER="${PG_CLUSTER:-main}"
PG_PORT=5432
UP_TIMEOUT="${UP_TIMEOUT:-60}"

MOTO_URL="http://127.0.0.1:$MOTO_PORT"
COUCH_URL_LOCAL="http://127.0.0.1:$COUCH_PORT"
PG_URL="postgres://changes:changes@127.0.0.1:$PG_PORT/changes"

mkdir -p "$LOGS" "$RUN"

say() { printf 'up: %s\n' "$*" >&2; }
die() { printf 'up: ERROR: %s\n' "$*" >&2; exit 1; }

# http_code URL prints the HTTP status of a GET, or 000 when nothing answers.
http_code() {
	curl -s -o /dev/null -w '%{http_code}' --connect-timeout 1 --max-time 3 "$1" 2>/dev/null || true
}

answers() { [[ "$(http_code "$1")" != 000 ]]; }

# port_open PORT is true when something accepts TCP connections on 127.0.0.1:PORT.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

APT_UPDATED=
apt_install() {
	command -v apt-get >/dev/null || die "apt-get not found; install $* by hand"
	if [[ -z "$APT_UPDATED" ]]; then
		say "apt-get update"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
		APT_UPDATED=1
	fi
	say "apt-get install $*"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

# pid_alive FILE PATTERN prints the pid in FILE if that process is alive and
# its command line contains PATTERN; a stale file is removed.
pid_alive() {
	local file="$1" pattern="$2" pid
	[[ -f "$file" ]] || return 1
	pid="$(cat "$file" 2>/dev/null || true)"
	if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null &&
		tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$pattern"; then
		echo "$pid"
		return 0
	fi
	rm -f "$file"
	return 1
}

# wait_http NAME URL PID LOG waits until URL answers, failing when the process
# dies or UP_TIMEOUT passes.
wait_http() {
	local name="$1" url="$2" pid="$3" log="$4" deadline=$((SECONDS + UP_TIMEOUT))
	until answers "$url"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -n 20 "$log" >&2 || true
			die "$name exited while starting; see $log"
		fi
		if ((SECONDS >= deadline)); then
			tail -n 20 "$log" >&2 || true
			die "$name did not answer at $url within ${UP_TIMEOUT}s; see $log (pid $pid still running)"
		fi
		sleep 0.2
	done
}

STATUS=()  # lines for the closing table

# ---------------------------------------------------------------- AWS emulator

# moto_python prints a python interpreter that has moto $MOTO_VERSION with its
# server extras, or fails.
moto_python() {
	local py
	for py in "$LOCAL/venv/bin/python3" "$(command -v python3 || true)"; do
		[[ -n "$py" && -x "$py" ]] || continue
		if "$py" - "$MOTO_VERSION" >/dev/null 2>&1 <<-'EOF'; then
			import sys, importlib.metadata as md
			import flask, flask_cors  # the [server] extras
			sys.exit(md.version("moto") != sys.argv[1])
		EOF
			echo "$py"
			return 0
		fi
	done
	return 1
}

install_moto() {
	local spec="moto[server]==$MOTO_VERSION"
	command -v python3 >/dev/null || apt_install python3 python3-venv python3-pip
	say "pip install '$spec'"
	if python3 -m pip install --quiet --disable-pip-version-check "$spec" >&2 2>"$LOGS/pip.log"; then
		return 0
	fi
	# Debian's own python refuses system-wide installs (PEP 668): use a venv.
	say "system pip refused (see $LOGS/pip.log); installing into $LOCAL/venv"
	if ! python3 -m venv "$LOCAL/venv" >&2 2>/dev/null; then
		apt_install python3-venv
		python3 -m venv "$LOCAL/venv" >&2
	fi
	"$LOCAL/venv/bin/python3" -m pip install --quiet --disable-pip-version-check "$spec" >&2 ||
		die "could not install $spec"
}

up_aws() {
	local pidfile="$RUN/moto.pid" log="$LOGS/moto.log" pid py
	if pid="$(pid_alive "$pidfile" "moto[._]server")" && answers "$MOTO_URL"; then
		STATUS+=("aws|$MOTO_URL|moto $MOTO_VERSION (pid $pid, started by up.sh)")
		return
	fi
	if answers "$MOTO_URL"; then
		if [[ "$(http_code "$MOTO_URL/_localstack/health")" == 200 ]]; then
			STATUS+=("aws|$MOTO_URL|LocalStack (already running, not managed by up.sh)")
		else
			STATUS+=("aws|$MOTO_URL|already running, not managed by up.sh")
		fi
		return
	fi
	port_open "$MOTO_PORT" && die "127.0.0.1:$MOTO_PORT is taken by something that does not speak HTTP"

	py="$(moto_python)" || { install_moto; py="$(moto_python)" || die "moto $MOTO_VERSION still not importable after install"; }
	# localstack/moto_server.py is moto's server with DynamoDB requests
	# serialized, so conditional writes (the lease) are atomic as on AWS.
	local server=(-m moto.server)
	[[ -f "$ROOT/localstack/moto_server.py" ]] && server=("$ROOT/localstack/moto_server.py")
	say "starting moto server on $MOTO_URL (log $log)"
	setsid "$py" "${server[@]}" -H 127.0.0.1 -p "$MOTO_PORT" </dev/null >>"$log" 2>&1 &
	pid=$!
	echo "$pid" >"$pidfile"
	wait_http "moto server" "$MOTO_URL/" "$pid" "$log"
	STATUS+=("aws|$MOTO_URL|moto $MOTO_VERSION (pid $pid, started now)")
}

# -------------------------------------------------------------- CouchDB source

POUCH_DIR="$LOCAL/pouchdb-server"
POUCH_BIN="$POUCH_DIR/node_modules/pouchdb-server/bin/pouchdb-server"

pouch_installed() {
	[[ -f "$POUCH_DIR/node_modules/pouchdb-server/package.json" ]] &&
		grep -q "\"version\": \"$POUCHDB_SERVER_VERSION\"" "$POUCH_DIR/node_modules/pouchdb-server/package.json"
}

install_pouch() {
	if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
		apt_install nodejs npm
	fi
	say "npm install pouchdb-server@$POUCHDB_SERVER_VERSION into $POUCH_DIR (takes about a minute)"
	mkdir -p "$POUCH_DIR"
	# --ignore-scripts: the in-memory adapter needs no native build, and
	# sqlite3's install script would try to download a prebuilt binary.
	npm install --prefix "$POUCH_DIR" --no-audit --no-fund --no-save --ignore-scripts \
		--loglevel=error "pouchdb-server@$POUCHDB_SERVER_VERSION" >"$LOGS/npm.log" 2>&1 ||
		{ tail -n 20 "$LOGS/npm.log" >&2; die "npm install pouchdb-server failed; see $LOGS/npm.log"; }
}

up_couch() {
	local pidfile="$RUN/pouchdb-server.pid" log="$LOGS/pouchdb-server.log" pid
	if pid="$(pid_alive "$pidfile" pouchdb-server)" && answers "$COUCH_URL_LOCAL/"; then
		STATUS+=("couch|$COUCH_URL_LOCAL|pouchdb-server $POUCHDB_SERVER_VERSION in memory (pid $pid, started by up.sh)")
		return
	fi
	if answers "$COUCH_URL_LOCAL/"; then
		STATUS+=("couch|$COUCH_URL_LOCAL|already running, not managed by up.sh")
		return
	fi
	port_open "$COUCH_PORT" && die "127.0.0.1:$COUCH_PORT is taken by something that does not speak HTTP"

	pouch_installed || install_pouch
	say "starting pouchdb-server on $COUCH_URL_LOCAL (log $log)"
	# pouchdb-server writes config.json and log.txt into its working
	# directory: run it from .local/pouchdb-server so they stay out of the repo.
	# No admin is configured (admin party), as in CouchDB 1.x: every request is
	# an admin, so tests can create and delete databases without credentials.
	(
		cd "$POUCH_DIR"
		exec setsid node "$POUCH_BIN" --in-memory --host 127.0.0.1 --port "$COUCH_PORT" \
			--config "$POUCH_DIR/config.json" --no-color
	) </dev/null >>"$log" 2>&1 &
	pid=$!
	echo "$pid" >"$pidfile"
	wait_http "pouchdb-server" "$COUCH_URL_LOCAL/" "$pid" "$log"
	STATUS+=("couch|$COUCH_URL_LOCAL|pouchdb-server $POUCHDB_SERVER_VERSION in memory (pid $pid, started now)")
}

# ------------------------------------------------------------------ PostgreSQL

as_postgres() { runuser -u postgres -- "$@"; }

up_postgres() {
	local bin="/usr/lib/postgresql/$PG_VERSION/bin/postgres" info status port how=running hba
	if [[ ! -x "$bin" ]] || ! command -v pg_ctlcluster >/dev/null; then
		apt_install postgresql
		[[ -x "$bin" ]] || die "PostgreSQL $PG_VERSION binaries not found after installing Debian's postgresql package; set PG_VERSION"
	fi
	info="$(pg_lsclusters -h "$PG_VERSION" "$PG_CLUSTER" 2>/dev/null || true)"
	if [[ -z "$info" ]]; then
		say "creating cluster $PG_VERSION $PG_CLUSTER on port $PG_PORT"
		pg_createcluster --port "$PG_PORT" "$PG_VERSION" "$PG_CLUSTER" >&2
		info="$(pg_lsclusters -h "$PG_VERSION" "$PG_CLUSTER")"
		how=created
	fi
	read -r _ _ port status _ <<<"$info"
	[[ "$port" == "$PG_PORT" ]] || die "cluster $PG_VERSION $PG_CLUSTER uses port $port, not $PG_PORT (pg_conftool $PG_VERSION $PG_CLUSTER set port $PG_PORT)"
	if [[ "$status" != online* ]]; then
		port_open "$PG_PORT" && die "127.0.0.1:$PG_PORT is taken by another server; stop it or use it instead"
		say "starting PostgreSQL cluster $PG_VERSION $PG_CLUSTER"
		pg_ctlcluster "$PG_VERSION" "$PG_CLUSTER" start >&2 ||
			die "pg_ctlcluster $PG_VERSION $PG_CLUSTER start failed; see /var/log/postgresql/postgresql-$PG_VERSION-$PG_CLUSTER.log"
		[[ "$how" == created ]] || how="started now"
	fi

	# Role and database, both idempotent. The password is set every time so a
	# changed one is put back.
	as_postgres psql -p "$PG_PORT" -X -q -v ON_ERROR_STOP=1 -d postgres >/dev/null <<-'SQL' ||
		DO $$
		BEGIN
		  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'changes') THEN
		    CREATE ROLE changes LOGIN SUPERUSER PASSWORD 'changes';
		  ELSE
		    ALTER ROLE changes LOGIN SUPERUSER PASSWORD 'changes';
		  END IF;
		END
		$$;
		SELECT 'CREATE DATABASE changes OWNER changes'
		 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'changes')\gexec
	SQL
		die "could not create role/database changes"

	# Password auth over TCP. Debian's pg_hba.conf allows scram-sha-256 from
	# 127.0.0.1; if a local edit broke that, put a rule for our role first.
	if ! PGPASSWORD=changes PGCONNECT_TIMEOUT=3 psql -X -q -At "$PG_URL?sslmode=disable" -c 'select 1' >/dev/null 2>"$LOGS/psql-check.log"; then
		hba="$(as_postgres psql -p "$PG_PORT" -X -At -d postgres -c 'show hba_file')"
		say "password login over TCP failed ($(head -n1 "$LOGS/psql-check.log")); adding a rule to $hba"
		sed -i '1i host changes changes 127.0.0.1/32 scram-sha-256 # added by localstack/up.sh' "$hba"
		pg_ctlcluster "$PG_VERSION" "$PG_CLUSTER" reload >&2
		PGPASSWORD=changes PGCONNECT_TIMEOUT=3 psql -X -q -At "$PG_URL?sslmode=disable" -c 'select 1' >/dev/null ||
			die "cannot log in as changes over TCP at 127.0.0.1:$PG_PORT"
	fi
	STATUS+=("postgres|127.0.0.1:$PG_PORT|PostgreSQL $PG_VERSION cluster $PG_CLUSTER ($how)")
}

# ---------------------------------------------------------------- Sync Gateway

install_syncgateway() {
	local bin
	bin="$(bash "$ROOT/localstack/syncgateway.sh")" || die "could not build Sync Gateway; see above"
	STATUS+=("syncgw|${bin#"$ROOT"/}|Sync Gateway 3.1.0 (walrus); each test starts its own on free ports")
}

# ------------------------------------------------------------------------ main

up_aws
up_couch
up_postgres
install_syncgateway

inspect() {
	case "$1" in
	aws) echo "aws --endpoint-url $MOTO_URL sqs list-queues   (or $MOTO_URL/moto-api/)" ;;
	couch) echo "curl $COUCH_URL_LOCAL/_all_dbs" ;;
	postgres) echo "psql $PG_URL" ;;
	syncgw) echo "go version -m .local/bin/sync_gateway" ;;
	esac
}

printf '\n%-9s %-23s %s\n' SERVICE ADDRESS INSPECT
for line in "${STATUS[@]}"; do
	IFS='|' read -r svc addr what <<<"$line"
	printf '%-9s %-23s %s\n' "$svc" "$addr" "$(inspect "$svc")"
	printf '%-9s %-23s   %s\n' "" "" "$what"
done
printf '\nLogs: %s   Environment: source localstack/env.sh\n' "${LOGS#"$ROOT"/}"
