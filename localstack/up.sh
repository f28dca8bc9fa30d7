#!/usr/bin/env bash
# Starts the local services the changes worker needs, installing whatever is
# missing, and prints what runs where. Idempotent: a service that already
# answers on its port is left alone, whoever started it.
#
#   AWS (SQS, ...)      LocalStack 2026.3.0 on the host (PyPI)   127.0.0.1:4566
#   S3                  moto's server 5.2.1 (PyPI)               127.0.0.1:4567
#   DynamoDB            DynamoDB Local 2.6.1 (Maven Central)     127.0.0.1:8000
#   CouchDB source      pouchdb-server 4.2.0, in memory (npm)    127.0.0.1:5984
#   PostgreSQL          Debian cluster "15 main"                 127.0.0.1:5432
#
# LocalStack runs from a virtualenv made with Python 3.13 (pyenv's, or
# python3.13 on PATH) and installed from localstack/requirements.txt with
# every package pinned; moto's server, likewise from
# localstack/moto-requirements.txt, serves S3. DynamoDB Local runs on the JDK
# (17 or later) from the jars localstack/dynamodb-local.pom.xml names.
# localstack/README.md says why S3 and DynamoDB are separate servers. All
# three keep their state in memory.
#
# State (installs, pid files, logs) lives in .local/ at the repository root,
# which git ignores. localstack/down.sh stops what this script started.
#
# Environment knobs (defaults in brackets):
#   LOCALSTACK_PORT [4566]  S3_PORT [4567]  DYNAMODB_PORT [8000]  COUCH_PORT [5984]
#   PG_VERSION [15]  PG_CLUSTER [main]
#   LOCALSTACK_PYTHON [pyenv's 3.13]  interpreter for LocalStack's virtualenv
#   DYNAMODB_HEAP [512m]  DynamoDB Local's Java heap limit
#   UP_TIMEOUT [60]  seconds to wait for a service to answer after starting it
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL="$ROOT/.local"
LOGS="$LOCAL/logs"
RUN="$LOCAL/run"

LOCALSTACK_VERSION=2026.3.0
DYNAMODB_LOCAL_VERSION=2.6.1
MOTO_VERSION=5.2.1
POUCHDB_SERVER_VERSION=4.2.0
LOCALSTACK_PORT="${LOCALSTACK_PORT:-4566}"
DYNAMODB_PORT="${DYNAMODB_PORT:-8000}"
S3_PORT="${S3_PORT:-4567}"
DYNAMODB_HEAP="${DYNAMODB_HEAP:-512m}"
COUCH_PORT="${COUCH_PORT:-5984}"
PG_VERSION="${PG_VERSION:-15}"
PG_CLUSTER="${PG_CLUSTER:-main}"
PG_PORT=5432
UP_TIMEOUT="${UP_TIMEOUT:-60}"

LOCALSTACK_URL="http://127.0.0.1:$LOCALSTACK_PORT"
DYNAMODB_URL="http://127.0.0.1:$DYNAMODB_PORT"
S3_URL="http://127.0.0.1:$S3_PORT"
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

# wait_until NAME PID LOG CHECK... runs CHECK until it succeeds, failing when
# the process dies or UP_TIMEOUT passes.
wait_until() {
	local name="$1" pid="$2" log="$3" deadline=$((SECONDS + UP_TIMEOUT))
	shift 3
	until "$@"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -n 20 "$log" >&2 || true
			die "$name exited while starting; see $log"
		fi
		if ((SECONDS >= deadline)); then
			tail -n 20 "$log" >&2 || true
			die "$name was not ready within ${UP_TIMEOUT}s; see $log (pid $pid still running)"
		fi
		sleep 0.2
	done
}

# wait_http NAME URL PID LOG waits until URL answers.
wait_http() { wait_until "$1" "$3" "$4" answers "$2"; }

# stop_group PID stops a process group that this script just started and
# that failed its checks.
stop_group() {
	kill -TERM -- "-$1" 2>/dev/null || true
	sleep 2
	kill -KILL -- "-$1" 2>/dev/null || true
}

STATUS=()  # lines for the closing table

# ------------------------------------------------------------------ LocalStack

LS_DIR="$LOCAL/localstack"
LS_VENV="$LS_DIR/venv"
LS_REQUIREMENTS="$ROOT/localstack/requirements.txt"
LS_STAMP="$LS_VENV/.requirements.sha256"

# find_python prints an interpreter for LocalStack's virtualenv: Python 3.13,
# the version localstack/requirements.txt was resolved for.
find_python() {
	local py candidates=()
	if [[ -n "${LOCALSTACK_PYTHON:-}" ]]; then
		candidates=("$LOCALSTACK_PYTHON")
	else
		local root
		root="$(pyenv root 2>/dev/null || true)"
		[[ -n "$root" ]] || root="${PYENV_ROOT:-$HOME/.pyenv}"
		# The newest 3.13.x that pyenv has.
		while IFS= read -r py; do candidates+=("$py"); done < <(
			printf '%s\n' "$root"/versions/3.13.*/bin/python3 | sort -rV)
		candidates+=(/root/.pyenv/versions/3.13.0/bin/python3 "$(command -v python3.13 || true)")
	fi
	for py in "${candidates[@]}"; do
		[[ -n "$py" && -x "$py" ]] || continue
		if "$py" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 13))' 2>/dev/null; then
			echo "$py"
			return 0
		fi
	done
	return 1
}

localstack_installed() {
	[[ -x "$LS_VENV/bin/python" && -f "$LS_STAMP" ]] &&
		[[ "$(cat "$LS_STAMP")" == "$(sha256sum "$LS_REQUIREMENTS" | cut -d' ' -f1)" ]]
}

install_localstack() {
	local py log="$LOGS/pip-localstack.log"
	py="$(find_python)" || die "LocalStack $LOCALSTACK_VERSION needs Python 3.13 and none was found \
(looked in \$(pyenv root)/versions/3.13.*, /root/.pyenv/versions/3.13.0 and python3.13 on PATH). \
Install one (pyenv install 3.13) or set LOCALSTACK_PYTHON=/path/to/python3.13"
	say "installing LocalStack $LOCALSTACK_VERSION into ${LS_VENV#"$ROOT"/} with $py (pinned, takes 1-2 minutes; log ${log#"$ROOT"/})"
	rm -rf "$LS_VENV"
	"$py" -m venv "$LS_VENV" >"$log" 2>&1 || { tail -n 20 "$log" >&2; die "python -m venv failed; see $log"; }
	# --no-deps: pip installs exactly the pinned set and resolves nothing else.
	"$LS_VENV/bin/python" -m pip install --no-deps --no-input --disable-pip-version-check \
		-r "$LS_REQUIREMENTS" >>"$log" 2>&1 ||
		{ tail -n 20 "$log" >&2; die "pip install -r localstack/requirements.txt failed; see $log"; }
	"$LS_VENV/bin/python" - "$LOCALSTACK_VERSION" >>"$log" 2>&1 <<-'EOF' ||
		import sys, importlib.metadata as md
		import localstack.runtime.main  # noqa: F401
		got = md.version("localstack-core")
		sys.exit(f"localstack-core {got} installed, want {sys.argv[1]}" if got != sys.argv[1] else 0)
	EOF
		{ tail -n 20 "$log" >&2; die "LocalStack does not import after the install; see $log"; }
	sha256sum "$LS_REQUIREMENTS" | cut -d' ' -f1 >"$LS_STAMP"
}

# localstack_ready URL is true when LocalStack's health endpoint reports SQS
# and S3 ready ("available" until first used, then "running").
localstack_ready() {
	local body
	body="$(curl -s --connect-timeout 1 --max-time 3 "$1/_localstack/health" 2>/dev/null)" || return 1
	python3 -c '
import json, sys
try:
    s = json.loads(sys.argv[1]).get("services", {})
except Exception:
    sys.exit(1)
sys.exit(0 if all(s.get(n) in ("available", "running") for n in ("sqs", "s3")) else 1)
' "$body" 2>/dev/null
}

localstack_version() {
	curl -s --connect-timeout 1 --max-time 3 "$1/_localstack/health" 2>/dev/null |
		python3 -c 'import json, sys; print(json.load(sys.stdin).get("version", "?"))' 2>/dev/null || echo "?"
}

# front_dynamodb_local makes LocalStack's DynamoDB (which CloudFormation uses
# to create a stack's table) forward to the DynamoDB Local that up_dynamodb
# runs. LocalStack would download DynamoDB Local and a Java 21 of its own at
# the first DynamoDB call, which no package registry serves; it skips both
# when they are already in its library folder, then starts the server with
# that java and talks to it on DYNAMODB_LOCAL_PORT. So the folder gets an
# empty placeholder jar and a "java" that only waits (LocalStack stops it with
# itself), and DYNAMODB_LOCAL_PORT names the port of the real DynamoDB Local.
# Tables created through either endpoint are the same tables.
front_dynamodb_local() {
	local lib="$LS_DIR/filesystem/var/lib/localstack/lib"
	mkdir -p "$lib/dynamodb-local/2" "$lib/java/21/bin"
	[[ -f "$lib/dynamodb-local/2/DynamoDBLocal.jar" ]] || : >"$lib/dynamodb-local/2/DynamoDBLocal.jar"
	printf '#!/bin/sh\n# placeholder: DynamoDB Local runs on its own (localstack/up.sh, up_dynamodb)\nexec sleep infinity\n' >"$lib/java/21/bin/java"
	chmod +x "$lib/java/21/bin/java"
}

up_localstack() {
	local pidfile="$RUN/localstack.pid" log="$LOGS/localstack.log" pid
	if pid="$(pid_alive "$pidfile" localstack.runtime.main)"; then
		localstack_ready "$LOCALSTACK_URL" ||
			die "LocalStack started by up.sh (pid $pid) does not answer on $LOCALSTACK_URL (another LOCALSTACK_PORT?); run localstack/down.sh first"
		STATUS+=("aws|$LOCALSTACK_URL|LocalStack $LOCALSTACK_VERSION (pid $pid, started by up.sh)")
		return
	fi
	if localstack_ready "$LOCALSTACK_URL"; then
		STATUS+=("aws|$LOCALSTACK_URL|LocalStack $(localstack_version "$LOCALSTACK_URL") (already running, not managed by up.sh)")
		return
	fi
	# LocalStack does not stop when its port is taken (it logs the error and
	# keeps running), so a busy port is refused here.
	if port_open "$LOCALSTACK_PORT"; then
		local moto
		if moto="$(pid_alive "$RUN/moto.pid" "moto[._]server")"; then
			die "127.0.0.1:$LOCALSTACK_PORT is held by the moto server an earlier localstack/up.sh started (pid $moto); run \`make down\` to stop it, then \`make up\`"
		fi
		die "127.0.0.1:$LOCALSTACK_PORT is taken by something that is not LocalStack; stop it or set LOCALSTACK_PORT (and AWS_ENDPOINT_URL)"
	fi

	localstack_installed || install_localstack
	mkdir -p "$LS_DIR/filesystem" "$LS_DIR/tmp"
	front_dynamodb_local
	say "starting LocalStack on $LOCALSTACK_URL (log ${log#"$ROOT"/})"
	# OVERRIDE_IN_DOCKER=0: this host can look like a container to LocalStack,
	# which would then use system directories. Every directory it writes is
	# under .local/localstack (FILESYSTEM_ROOT, and TMPDIR for its temporary
	# folder). DNS_ADDRESS=0: no DNS server. SQS_ENDPOINT_STRATEGY=path and
	# LOCALSTACK_HOST: queue URLs http://127.0.0.1:PORT/queue/REGION/ACCOUNT/NAME,
	# which resolve without LocalStack's DNS name. No certificate download, no
	# analytics events.
	(
		cd "$LS_DIR"
		exec env OVERRIDE_IN_DOCKER=0 \
			GATEWAY_LISTEN="127.0.0.1:$LOCALSTACK_PORT" \
			LOCALSTACK_HOST="127.0.0.1:$LOCALSTACK_PORT" \
			SQS_ENDPOINT_STRATEGY=path \
			DNS_ADDRESS=0 \
			FILESYSTEM_ROOT="$LS_DIR/filesystem" \
			TMPDIR="$LS_DIR/tmp" \
			SKIP_SSL_CERT_DOWNLOAD=1 \
			DISABLE_EVENTS=1 \
			DYNAMODB_LOCAL_PORT="$DYNAMODB_PORT" \
			setsid "$LS_VENV/bin/python" -m localstack.runtime.main
	) </dev/null >>"$log" 2>&1 &
	pid=$!
	echo "$pid" >"$pidfile"
	wait_until LocalStack "$pid" "$log" localstack_ready "$LOCALSTACK_URL"
	STATUS+=("aws|$LOCALSTACK_URL|LocalStack $LOCALSTACK_VERSION (pid $pid, started now)")
}

# ------------------------------------------------------------------ S3 (moto)

MOTO_DIR="$LOCAL/moto"
MOTO_VENV="$MOTO_DIR/venv"
MOTO_REQUIREMENTS="$ROOT/localstack/moto-requirements.txt"
MOTO_STAMP="$MOTO_VENV/.requirements.sha256"

moto_installed() {
	[[ -x "$MOTO_VENV/bin/python" && -f "$MOTO_STAMP" ]] &&
		[[ "$(cat "$MOTO_STAMP")" == "$(sha256sum "$MOTO_REQUIREMENTS" | cut -d' ' -f1)" ]]
}

install_moto() {
	local py log="$LOGS/pip-moto.log"
	py="$(find_python)" || die "moto's server is installed with Python 3.13 and none was found; set LOCALSTACK_PYTHON=/path/to/python3.13"
	say "installing moto $MOTO_VERSION (S3 only) into ${MOTO_VENV#"$ROOT"/} (pinned; log ${log#"$ROOT"/})"
	rm -rf "$MOTO_VENV"
	"$py" -m venv "$MOTO_VENV" >"$log" 2>&1 || { tail -n 20 "$log" >&2; die "python -m venv failed; see $log"; }
	"$MOTO_VENV/bin/python" -m pip install --no-deps --no-input --disable-pip-version-check \
		-r "$MOTO_REQUIREMENTS" >>"$log" 2>&1 ||
		{ tail -n 20 "$log" >&2; die "pip install -r localstack/moto-requirements.txt failed; see $log"; }
	"$MOTO_VENV/bin/python" -c 'import moto.server' >>"$log" 2>&1 ||
		{ tail -n 20 "$log" >&2; die "moto does not import after the install; see $log"; }
	sha256sum "$MOTO_REQUIREMENTS" | cut -d' ' -f1 >"$MOTO_STAMP"
}

# s3_ready URL is true when URL answers an S3 ListBuckets call (moto checks
# no signature).
s3_ready() {
	curl -s --connect-timeout 1 --max-time 3 \
		-H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0' \
		"$1/" 2>/dev/null | grep -q ListAllMyBucketsResult
}

up_s3() {
	local pidfile="$RUN/moto-s3.pid" log="$LOGS/moto-s3.log" pid
	if pid="$(pid_alive "$pidfile" moto.server)"; then
		s3_ready "$S3_URL" ||
			die "moto (S3) started by up.sh (pid $pid) does not answer on $S3_URL (another S3_PORT?); run localstack/down.sh first"
		STATUS+=("s3|$S3_URL|moto $MOTO_VERSION, S3 only (pid $pid, started by up.sh)")
		return
	fi
	if s3_ready "$S3_URL"; then
		STATUS+=("s3|$S3_URL|S3 (already running, not managed by up.sh)")
		return
	fi
	port_open "$S3_PORT" && die "127.0.0.1:$S3_PORT is taken by something that does not answer S3 calls; stop it or set S3_PORT (and AWS_ENDPOINT_URL_S3)"
	moto_installed || install_moto
	say "starting moto's server for S3 on $S3_URL (log ${log#"$ROOT"/})"
	(
		cd "$MOTO_DIR"
		exec setsid "$MOTO_VENV/bin/python" -m moto.server -H 127.0.0.1 -p "$S3_PORT"
	) </dev/null >>"$log" 2>&1 &
	pid=$!
	echo "$pid" >"$pidfile"
	wait_until "moto (S3)" "$pid" "$log" s3_ready "$S3_URL"
	STATUS+=("s3|$S3_URL|moto $MOTO_VERSION, S3 only (pid $pid, started now)")
}

# ---------------------------------------------------------------- DynamoDB Local

DDB_DIR="$LOCAL/dynamodb-local"
DDB_POM="$ROOT/localstack/dynamodb-local.pom.xml"
DDB_STAMP="$DDB_DIR/lib/.pom.sha256"
DDB_MAIN=com.amazonaws.services.dynamodbv2.local.main.ServerRunner

# java_major prints the major version of `java` on PATH, or 0.
java_major() {
	local v
	v="$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)"
	echo "${v:-0}"
}

dynamodb_installed() {
	[[ -f "$DDB_STAMP" ]] && [[ "$(cat "$DDB_STAMP")" == "$(sha256sum "$DDB_POM" | cut -d' ' -f1)" ]]
}

install_dynamodb() {
	local log="$LOGS/mvn-dynamodb-local.log"
	command -v mvn >/dev/null || apt_install maven
	say "fetching DynamoDB Local $DYNAMODB_LOCAL_VERSION with Maven into ${DDB_DIR#"$ROOT"/}/lib (takes under a minute; log ${log#"$ROOT"/})"
	rm -rf "$DDB_DIR/lib.new"
	# Maven's own repository stays under .local too.
	mvn -B -q -f "$DDB_POM" -Dmaven.repo.local="$LOCAL/m2" dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory="$DDB_DIR/lib.new" >"$log" 2>&1 ||
		{ tail -n 20 "$log" >&2; die "mvn dependency:copy-dependencies failed; see $log"; }
	ls "$DDB_DIR/lib.new"/DynamoDBLocal-*.jar "$DDB_DIR/lib.new"/libsqlite4java-linux-amd64-*.so >/dev/null 2>&1 ||
		die "Maven did not fetch DynamoDBLocal and its native library; see $log"
	rm -rf "${DDB_DIR:?}/lib"
	mv "$DDB_DIR/lib.new" "$DDB_DIR/lib"
	sha256sum "$DDB_POM" | cut -d' ' -f1 >"$DDB_STAMP"
}

# dynamodb_ready URL is true when URL answers a DynamoDB ListTables call.
# DynamoDB Local checks that a request names credentials, not the signature.
dynamodb_ready() {
	[[ "$(curl -s -o /dev/null -w '%{http_code}' --connect-timeout 1 --max-time 3 -X POST \
		-H 'Content-Type: application/x-amz-json-1.0' -H 'X-Amz-Target: DynamoDB_20120810.ListTables' \
		-H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0' \
		-d '{}' "$1/" 2>/dev/null)" == 200 ]]
}

up_dynamodb() {
	local pidfile="$RUN/dynamodb-local.pid" log="$LOGS/dynamodb-local.log" pid
	if pid="$(pid_alive "$pidfile" "$DDB_MAIN")"; then
		dynamodb_ready "$DYNAMODB_URL" ||
			die "DynamoDB Local started by up.sh (pid $pid) does not answer on $DYNAMODB_URL (another DYNAMODB_PORT?); run localstack/down.sh first"
		STATUS+=("dynamodb|$DYNAMODB_URL|DynamoDB Local $DYNAMODB_LOCAL_VERSION in memory (pid $pid, started by up.sh)")
		return
	fi
	if dynamodb_ready "$DYNAMODB_URL"; then
		STATUS+=("dynamodb|$DYNAMODB_URL|DynamoDB (already running, not managed by up.sh)")
		return
	fi
	port_open "$DYNAMODB_PORT" && die "127.0.0.1:$DYNAMODB_PORT is taken by something that does not answer DynamoDB calls; stop it or set DYNAMODB_PORT (and AWS_ENDPOINT_URL_DYNAMODB)"

	[[ "$(uname -m)" == x86_64 ]] || die "DynamoDB Local's native SQLite library is fetched for linux/amd64 only, and this machine is $(uname -m)"
	if (("$(java_major)" < 17)); then
		apt_install openjdk-17-jre-headless
		(("$(java_major)" >= 17)) || die "DynamoDB Local $DYNAMODB_LOCAL_VERSION needs Java 17 or later; \`java -version\` says $(java -version 2>&1 | head -n1)"
	fi
	dynamodb_installed || install_dynamodb
	say "starting DynamoDB Local on $DYNAMODB_URL (log ${log#"$ROOT"/})"
	# -inMemory: state goes with the process, as LocalStack's. -sharedDb: one
	# database whatever the credentials and region of a request. It listens
	# on every interface: DynamoDB Local has no option to bind one address.
	(
		cd "$DDB_DIR"
		exec setsid java "-Xmx$DYNAMODB_HEAP" -Djava.library.path="$DDB_DIR/lib" -cp "$DDB_DIR/lib/*" "$DDB_MAIN" \
			-port "$DYNAMODB_PORT" -inMemory -sharedDb -disableTelemetry
	) </dev/null >>"$log" 2>&1 &
	pid=$!
	echo "$pid" >"$pidfile"
	wait_until "DynamoDB Local" "$pid" "$log" dynamodb_ready "$DYNAMODB_URL"
	STATUS+=("dynamodb|$DYNAMODB_URL|DynamoDB Local $DYNAMODB_LOCAL_VERSION in memory (pid $pid, started now)")
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

# ------------------------------------------------------------------------ main

up_dynamodb
up_localstack
up_s3
up_couch
up_postgres

inspect() {
	case "$1" in
	aws) echo "curl $LOCALSTACK_URL/_localstack/health" ;;
	s3) echo "aws --endpoint-url $S3_URL s3 ls" ;;
	dynamodb) echo "aws --endpoint-url $DYNAMODB_URL dynamodb list-tables" ;;
	couch) echo "curl $COUCH_URL_LOCAL/_all_dbs" ;;
	postgres) echo "psql $PG_URL" ;;
	esac
}

printf '\n%-9s %-23s %s\n' SERVICE ADDRESS INSPECT
for line in "${STATUS[@]}"; do
	IFS='|' read -r svc addr what <<<"$line"
	printf '%-9s %-23s %s\n' "$svc" "$addr" "$(inspect "$svc")"
	printf '%-9s %-23s   %s\n' "" "" "$what"
done
printf '\nLogs: %s   Environment: source localstack/env.sh\n' "${LOGS#"$ROOT"/}"
