#!/usr/bin/env bash
# Starts the local services the changes worker needs, installing whatever is
# missing, and prints what runs where. Idempotent: a service that already
# answers on its port is left alone, whoever started it.
#
#   AWS (SQS, ...)      LocalStack 2026.3.0 on the host (PyPI)   127.0.0.1:4566
#                       with the runtime executor in localstack/lambdahost,
#                       which runs Lambda functions under aws-lambda-rie
#   S3                  moto's server 5.2.1 (PyPI)               127.0.0.1:4567
#   DynamoDB            DynamoDB Local 2.6.1 (Maven Central)     127.0.0.1:8000
#   CouchDB source      pouchdb-server 4.2.0, in memory (npm)    127.0.0.1:5984
#   PostgreSQL          Debian cluster "15 main"                 127.0.0.1:5432
#
# Tools that only some targets need have scripts of their own, which those
# make targets run: aws-lambda-rie (lambda-rie.sh), without which LocalStack
# runs no Lambda function, and Sync Gateway (syncgateway.sh) for the tests.
#
# First, up.sh installs with one apt-get the Debian packages that the
# services it must start lack (maven and openjdk-17-jre-headless for
# DynamoDB Local, nodejs and npm for pouchdb-server, postgresql), which needs
# root, as setting up the PostgreSQL cluster does. DynamoDB Local's native
# library is fetched for linux/amd64 only: on another architecture up.sh
# stops before installing anything, unless a DynamoDB answers on
# DYNAMODB_PORT already. Then it installs the services it must start, all at
# once (each waits mostly on its downloads), and starts them.
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
# which git ignores; pip, npm and Maven keep their download caches where
# they always do (Maven's in ~/.m2). localstack/down.sh stops what this
# script started.
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
PG_BIN="/usr/lib/postgresql/$PG_VERSION/bin/postgres"
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

# need_root WHAT fails unless this script runs as root, which WHAT needs.
need_root() {
	[[ "$(id -u)" == 0 ]] || die "$1 needs root, and up.sh runs as $(id -un): run make up as root, or do that by hand first"
}

# apt_install PACKAGE... installs Debian packages (one apt-get for all).
apt_install() {
	command -v apt-get >/dev/null || die "apt-get not found; install $* by hand"
	need_root "installing the Debian packages $*"
	say "apt-get update"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
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

# stop_group PID stops a process group that this script just started and
# that failed its checks.
stop_group() {
	kill -TERM -- "-$1" 2>/dev/null || true
	sleep 2
	kill -KILL -- "-$1" 2>/dev/null || true
}

# die_log LOG MESSAGE shows the end of LOG and fails with MESSAGE.
die_log() {
	tail -n 20 "$1" >&2 || true
	die "$2"
}

# stamp_matches STAMP FILE is true when STAMP holds FILE's checksum: what was
# installed from FILE is still what FILE asks for.
stamp_matches() {
	[[ -f "$1" ]] && [[ "$(cat "$1")" == "$(sha256sum "$2" | cut -d' ' -f1)" ]]
}

# write_stamp STAMP FILE records FILE's checksum in STAMP.
write_stamp() { sha256sum "$2" | cut -d' ' -f1 >"$1"; }

# The closing table: for each service's key, "ADDRESS|WHAT".
declare -A STATUS=()

# started_before NAME KEY URL PORTVAR PIDFILE PATTERN READY WHAT is true,
# with the service's status line recorded, when this script started it
# earlier: the pid in PIDFILE is alive with PATTERN in its command line. Such
# a process that does not pass READY URL is an error (it listens on another
# port than PORTVAR says).
started_before() {
	local name="$1" key="$2" url="$3" pid
	pid="$(pid_alive "$5" "$6")" || return 1
	"$7" "$url" || die "$name started by up.sh (pid $pid) does not answer on $url (another $4?); run localstack/down.sh first"
	STATUS[$key]="$url|$8 (pid $pid, started by up.sh)"
}

# start_service NAME KEY URL DIR PIDFILE LOG WHAT READY -- COMMAND... runs
# COMMAND in DIR in a session of its own (so that down.sh stops all it
# starts), logging to LOG, records its pid in PIDFILE, waits until READY URL
# passes and records the service's status line.
start_service() {
	local name="$1" key="$2" url="$3" dir="$4" pidfile="$5" log="$6" what="$7" ready="$8" pid
	[[ "${9:-}" == -- ]] || die "start_service $name: want -- before the command"
	shift 9
	say "starting $name on $url (log ${log#"$ROOT"/})"
	(
		cd "$dir"
		exec setsid "$@"
	) </dev/null >>"$log" 2>&1 &
	pid=$!
	echo "$pid" >"$pidfile"
	wait_until "$name" "$pid" "$log" "$ready" "$url"
	STATUS[$key]="$url|$what (pid $pid, started now)"
}

# install_venv VENV REQUIREMENTS LOG installs the pinned REQUIREMENTS into
# a new virtualenv VENV made with Python 3.13, logging to LOG. The caller
# checks the result and writes the stamp.
install_venv() {
	local venv="$1" requirements="$2" log="$3" py
	py="$(find_python)" || no_python
	say "installing ${requirements#"$ROOT"/} into ${venv#"$ROOT"/} with $py (pinned; log ${log#"$ROOT"/})"
	rm -rf "$venv"
	"$py" -m venv "$venv" >"$log" 2>&1 || die_log "$log" "python -m venv failed; see $log"
	# --no-deps: pip installs exactly the pinned set and resolves nothing else.
	# --no-compile: Python compiles a module when it is first imported, a few
	# hundred of them when LocalStack starts, where pip would compile all of
	# them (over 11,000 for LocalStack, half of its install time).
	"$venv/bin/python" -m pip install --no-deps --no-compile --no-input --disable-pip-version-check \
		-r "$requirements" >>"$log" 2>&1 ||
		die_log "$log" "pip install -r ${requirements#"$ROOT"/} failed; see $log"
}

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

# The runtime executor (localstack/lambdahost) goes into LocalStack's
# virtualenv; the stamp holds the checksum of its files. It runs the
# aws-lambda-rie that localstack/lambda-rie.sh builds, once there is one.
LH_SRC="$ROOT/localstack/lambdahost"
LH_STAMP="$LS_VENV/.lambdahost.sha256"
RIE_BIN="$LOCAL/bin/aws-lambda-rie"

# no_python fails, saying where find_python looked.
no_python() {
	die "no Python 3.13 found for the virtualenvs of LocalStack and moto \
(looked in \$(pyenv root)/versions/3.13.*, /root/.pyenv/versions/3.13.0 and python3.13 on PATH). \
Install one (pyenv install 3.13) or set LOCALSTACK_PYTHON=/path/to/python3.13"
}

localstack_installed() {
	[[ -x "$LS_VENV/bin/python" ]] && stamp_matches "$LS_STAMP" "$LS_REQUIREMENTS" && lambdahost_installed
}

install_localstack() {
	local log="$LOGS/pip-localstack.log"
	if ! [[ -x "$LS_VENV/bin/python" ]] || ! stamp_matches "$LS_STAMP" "$LS_REQUIREMENTS"; then
		install_venv "$LS_VENV" "$LS_REQUIREMENTS" "$log"
		"$LS_VENV/bin/python" - "$LOCALSTACK_VERSION" >>"$log" 2>&1 <<-'EOF' ||
			import sys, importlib.metadata as md
			import localstack.runtime.main  # noqa: F401
			got = md.version("localstack-core")
			sys.exit(f"localstack-core {got} installed, want {sys.argv[1]}" if got != sys.argv[1] else 0)
		EOF
			die_log "$log" "LocalStack does not import after the install; see $log"
		write_stamp "$LS_STAMP" "$LS_REQUIREMENTS"
	fi
	install_lambdahost
}

lambdahost_sum() {
	(cd "$LH_SRC" && sha256sum pyproject.toml changes_lambda_host/*.py) | sha256sum | cut -d' ' -f1
}

lambdahost_installed() { [[ -f "$LH_STAMP" && "$(cat "$LH_STAMP")" == "$(lambdahost_sum)" ]]; }

install_lambdahost() {
	lambdahost_installed && return
	local log="$LOGS/pip-lambdahost.log" build
	say "installing the Lambda runtime executor ${LH_SRC#"$ROOT"/} into ${LS_VENV#"$ROOT"/}"
	# Built from a copy: the build leaves its files beside the sources.
	build="$(mktemp -d)"
	cp -r "$LH_SRC/pyproject.toml" "$LH_SRC/changes_lambda_host" "$build/"
	"$LS_VENV/bin/python" -m pip install --no-deps --no-build-isolation --no-input \
		--disable-pip-version-check --force-reinstall "$build" >"$log" 2>&1 ||
		{ rm -rf "$build"; die_log "$log" "pip install ${LH_SRC#"$ROOT"/} failed; see $log"; }
	rm -rf "$build"
	lambdahost_sum >"$LH_STAMP"
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
# to create a stack's table) forward to the DynamoDB Local that start_dynamodb
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
	printf '#!/bin/sh\n# placeholder: DynamoDB Local runs on its own (localstack/up.sh, start_dynamodb)\nexec sleep infinity\n' >"$lib/java/21/bin/java"
	chmod +x "$lib/java/21/bin/java"
}

# localstack_answers is true, with the status line recorded, when
# LocalStack answers on its port; false when it is to be started; it fails
# when something else holds the port.
localstack_answers() {
	local pidfile="$RUN/localstack.pid"
	if started_before LocalStack aws "$LOCALSTACK_URL" LOCALSTACK_PORT "$pidfile" localstack.runtime.main localstack_ready "LocalStack $LOCALSTACK_VERSION"; then
		# Started by an up.sh from before the runtime executor, it cannot run
		# Lambda functions (make localstack-deploy, the deployed-stack tests).
		if ! tr '\0' '\n' <"/proc/$(cat "$pidfile")/environ" 2>/dev/null | grep -qx LAMBDA_RUNTIME_EXECUTOR=host; then
			say "LocalStack (pid $(cat "$pidfile")) was started without the host Lambda executor and cannot run Lambda functions: run make down && make up"
		fi
		return 0
	fi
	if localstack_ready "$LOCALSTACK_URL"; then
		STATUS[aws]="$LOCALSTACK_URL|LocalStack $(localstack_version "$LOCALSTACK_URL") (already running, not managed by up.sh)"
		return 0
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
	return 1
}

start_localstack() {
	local pidfile="$RUN/localstack.pid" log="$LOGS/localstack.log"
	mkdir -p "$LS_DIR/filesystem" "$LS_DIR/tmp"
	front_dynamodb_local
	# OVERRIDE_IN_DOCKER=0: this host can look like a container to LocalStack,
	# which would then use system directories. Every directory it writes is
	# under .local/localstack (FILESYSTEM_ROOT, and TMPDIR for its temporary
	# folder). DNS_ADDRESS=0: no DNS server. SQS_ENDPOINT_STRATEGY=path and
	# LOCALSTACK_HOST: queue URLs http://127.0.0.1:PORT/queue/REGION/ACCOUNT/NAME,
	# which resolve without LocalStack's DNS name. No certificate download, no
	# analytics events. SQS_CALL_METRICS=0 (localstack/lambdahost's hook):
	# LocalStack's SQS publishes every queue's depths each
	# SQS_CLOUDWATCH_METRICS_REPORT_INTERVAL seconds, which the stack's DLQ
	# alarms read, but not a metric per call as well, which it would send
	# through its own API from three threads, a core of this machine's two
	# for minutes after a benchmark.
	# SQS_ENABLE_MESSAGE_RETENTION_PERIOD=1: its SQS deletes a message once
	# its queue's retention has passed, as AWS does (it keeps them for ever
	# otherwise), so the DLQ archive is tested against a retention that
	# runs out.
	# LAMBDA_RUNTIME_EXECUTOR=host: Lambda functions run on the host under
	# aws-lambda-rie (LAMBDA_HOST_RIE, looked for as each function starts),
	# with the SDK's S3 and DynamoDB endpoints of this machine
	# (LAMBDA_HOST_ENV), as the tools have them.
	start_service LocalStack aws "$LOCALSTACK_URL" "$LS_DIR" "$pidfile" "$log" "LocalStack $LOCALSTACK_VERSION" localstack_ready -- \
		env OVERRIDE_IN_DOCKER=0 \
		GATEWAY_LISTEN="127.0.0.1:$LOCALSTACK_PORT" \
		LOCALSTACK_HOST="127.0.0.1:$LOCALSTACK_PORT" \
		SQS_ENDPOINT_STRATEGY=path \
		SQS_CALL_METRICS=0 \
		SQS_CLOUDWATCH_METRICS_REPORT_INTERVAL=20 \
		SQS_ENABLE_MESSAGE_RETENTION_PERIOD=1 \
		LAMBDA_RUNTIME_EXECUTOR=host \
		LAMBDA_HOST_RIE="$RIE_BIN" \
		LAMBDA_HOST_ENV="AWS_ENDPOINT_URL_S3=$S3_URL AWS_ENDPOINT_URL_DYNAMODB=$DYNAMODB_URL S3_USE_PATH_STYLE=true" \
		DNS_ADDRESS=0 \
		FILESYSTEM_ROOT="$LS_DIR/filesystem" \
		TMPDIR="$LS_DIR/tmp" \
		SKIP_SSL_CERT_DOWNLOAD=1 \
		DISABLE_EVENTS=1 \
		DYNAMODB_LOCAL_PORT="$DYNAMODB_PORT" \
		"$LS_VENV/bin/python" -m localstack.runtime.main
}

# ------------------------------------------------------------------ S3 (moto)

MOTO_DIR="$LOCAL/moto"
MOTO_VENV="$MOTO_DIR/venv"
MOTO_REQUIREMENTS="$ROOT/localstack/moto-requirements.txt"
MOTO_STAMP="$MOTO_VENV/.requirements.sha256"

s3_installed() {
	[[ -x "$MOTO_VENV/bin/python" ]] && stamp_matches "$MOTO_STAMP" "$MOTO_REQUIREMENTS"
}

install_s3() {
	local log="$LOGS/pip-moto.log"
	install_venv "$MOTO_VENV" "$MOTO_REQUIREMENTS" "$log"
	"$MOTO_VENV/bin/python" -c 'import moto.server' >>"$log" 2>&1 ||
		die_log "$log" "moto does not import after the install; see $log"
	write_stamp "$MOTO_STAMP" "$MOTO_REQUIREMENTS"
}

# s3_ready URL is true when URL answers an S3 ListBuckets call (moto checks
# no signature).
s3_ready() {
	curl -s --connect-timeout 1 --max-time 3 \
		-H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0' \
		"$1/" 2>/dev/null | grep -q ListAllMyBucketsResult
}

S3_WHAT="moto $MOTO_VERSION, S3 only"

# s3_answers: as localstack_answers, for S3.
s3_answers() {
	started_before "moto (S3)" s3 "$S3_URL" S3_PORT "$RUN/moto-s3.pid" moto.server s3_ready "$S3_WHAT" && return 0
	if s3_ready "$S3_URL"; then
		STATUS[s3]="$S3_URL|S3 (already running, not managed by up.sh)"
		return 0
	fi
	port_open "$S3_PORT" && die "127.0.0.1:$S3_PORT is taken by something that does not answer S3 calls; stop it or set S3_PORT (and AWS_ENDPOINT_URL_S3)"
	return 1
}

start_s3() {
	local pidfile="$RUN/moto-s3.pid" log="$LOGS/moto-s3.log" what="$S3_WHAT"
	start_service "moto (S3)" s3 "$S3_URL" "$MOTO_DIR" "$pidfile" "$log" "$what" s3_ready -- \
		"$MOTO_VENV/bin/python" -m moto.server -H 127.0.0.1 -p "$S3_PORT"
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

dynamodb_installed() { stamp_matches "$DDB_STAMP" "$DDB_POM"; }

install_dynamodb() {
	local log="$LOGS/mvn-dynamodb-local.log"
	say "fetching DynamoDB Local $DYNAMODB_LOCAL_VERSION with Maven into ${DDB_DIR#"$ROOT"/}/lib (log ${log#"$ROOT"/})"
	rm -rf "$DDB_DIR/lib.new"
	# Maven fetches into its own repository (~/.m2/repository), its cache
	# for every checkout, and copies from there.
	mvn -B -q -f "$DDB_POM" dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory="$DDB_DIR/lib.new" >"$log" 2>&1 ||
		die_log "$log" "mvn dependency:copy-dependencies failed; see $log"
	ls "$DDB_DIR/lib.new"/DynamoDBLocal-*.jar "$DDB_DIR/lib.new"/libsqlite4java-linux-amd64-*.so >/dev/null 2>&1 ||
		die "Maven did not fetch DynamoDBLocal and its native library; see $log"
	rm -rf "${DDB_DIR:?}/lib"
	mv "$DDB_DIR/lib.new" "$DDB_DIR/lib"
	write_stamp "$DDB_STAMP" "$DDB_POM"
}

# dynamodb_ready URL is true when URL answers a DynamoDB ListTables call.
# DynamoDB Local checks that a request names credentials, not the signature.
dynamodb_ready() {
	[[ "$(curl -s -o /dev/null -w '%{http_code}' --connect-timeout 1 --max-time 3 -X POST \
		-H 'Content-Type: application/x-amz-json-1.0' -H 'X-Amz-Target: DynamoDB_20120810.ListTables' \
		-H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0' \
		-d '{}' "$1/" 2>/dev/null)" == 200 ]]
}

DDB_WHAT="DynamoDB Local $DYNAMODB_LOCAL_VERSION in memory"

# dynamodb_answers: as localstack_answers, for DynamoDB.
dynamodb_answers() {
	started_before "DynamoDB Local" dynamodb "$DYNAMODB_URL" DYNAMODB_PORT "$RUN/dynamodb-local.pid" "$DDB_MAIN" dynamodb_ready "$DDB_WHAT" && return 0
	if dynamodb_ready "$DYNAMODB_URL"; then
		STATUS[dynamodb]="$DYNAMODB_URL|DynamoDB (already running, not managed by up.sh)"
		return 0
	fi
	port_open "$DYNAMODB_PORT" && die "127.0.0.1:$DYNAMODB_PORT is taken by something that does not answer DynamoDB calls; stop it or set DYNAMODB_PORT (and AWS_ENDPOINT_URL_DYNAMODB)"
	return 1
}

start_dynamodb() {
	local pidfile="$RUN/dynamodb-local.pid" log="$LOGS/dynamodb-local.log" what="$DDB_WHAT"
	# -inMemory: state goes with the process, as LocalStack's. -sharedDb: one
	# database whatever the credentials and region of a request. It listens
	# on every interface: DynamoDB Local has no option to bind one address.
	start_service "DynamoDB Local" dynamodb "$DYNAMODB_URL" "$DDB_DIR" "$pidfile" "$log" "$what" dynamodb_ready -- \
		java "-Xmx$DYNAMODB_HEAP" -Djava.library.path="$DDB_DIR/lib" -cp "$DDB_DIR/lib/*" "$DDB_MAIN" \
		-port "$DYNAMODB_PORT" -inMemory -sharedDb -disableTelemetry
}

# -------------------------------------------------------------- CouchDB source

POUCH_DIR="$LOCAL/pouchdb-server"
POUCH_BIN="$POUCH_DIR/node_modules/pouchdb-server/bin/pouchdb-server"

couch_installed() {
	[[ -f "$POUCH_DIR/node_modules/pouchdb-server/package.json" ]] &&
		grep -q "\"version\": \"$POUCHDB_SERVER_VERSION\"" "$POUCH_DIR/node_modules/pouchdb-server/package.json"
}

install_couch() {
	say "npm install pouchdb-server@$POUCHDB_SERVER_VERSION into ${POUCH_DIR#"$ROOT"/} (log ${LOGS#"$ROOT"/}/npm.log)"
	mkdir -p "$POUCH_DIR"
	# --ignore-scripts: the in-memory adapter needs no native build, and
	# sqlite3's install script would try to download a prebuilt binary.
	# --prefer-offline: what npm's cache holds is taken without asking the
	# registry whether it is current; only what it lacks is fetched.
	npm install --prefix "$POUCH_DIR" --no-audit --no-fund --no-save --ignore-scripts --prefer-offline \
		--loglevel=error "pouchdb-server@$POUCHDB_SERVER_VERSION" >"$LOGS/npm.log" 2>&1 ||
		die_log "$LOGS/npm.log" "npm install pouchdb-server failed; see $LOGS/npm.log"
}

# couch_ready URL is true when something answers HTTP at URL.
couch_ready() { answers "$1/"; }

COUCH_WHAT="pouchdb-server $POUCHDB_SERVER_VERSION in memory"

# couch_answers: as localstack_answers, for the CouchDB-compatible source.
couch_answers() {
	local pid
	if pid="$(pid_alive "$RUN/pouchdb-server.pid" pouchdb-server)" && couch_ready "$COUCH_URL_LOCAL"; then
		STATUS[couch]="$COUCH_URL_LOCAL|$COUCH_WHAT (pid $pid, started by up.sh)"
		return 0
	fi
	if couch_ready "$COUCH_URL_LOCAL"; then
		STATUS[couch]="$COUCH_URL_LOCAL|already running, not managed by up.sh"
		return 0
	fi
	port_open "$COUCH_PORT" && die "127.0.0.1:$COUCH_PORT is taken by something that does not speak HTTP"
	return 1
}

start_couch() {
	local pidfile="$RUN/pouchdb-server.pid" log="$LOGS/pouchdb-server.log" what="$COUCH_WHAT"
	# pouchdb-server writes config.json and log.txt into its working
	# directory: run it from .local/pouchdb-server so they stay out of the repo.
	# No admin is configured (admin party), as in CouchDB 1.x: every request is
	# an admin, so tests can create and delete databases without credentials.
	start_service pouchdb-server couch "$COUCH_URL_LOCAL" "$POUCH_DIR" "$pidfile" "$log" "$what" couch_ready -- \
		node "$POUCH_BIN" --in-memory --host 127.0.0.1 --port "$COUCH_PORT" \
		--config "$POUCH_DIR/config.json" --no-color
}

# ------------------------------------------------------------------ PostgreSQL

as_postgres() { runuser -u postgres -- "$@"; }

# postgres_answers is true, with the status line recorded, when the role
# changes logs in over TCP with its password and is a superuser: there is
# nothing to set up (and nothing that needs root).
postgres_answers() {
	local got
	got="$(PGPASSWORD=changes PGCONNECT_TIMEOUT=3 psql -X -q -At "$PG_URL?sslmode=disable" \
		-c "select rolsuper, current_setting('server_version') from pg_roles where rolname = current_user" 2>/dev/null)" || return 1
	[[ "$got" == "t|"* ]] || return 1
	STATUS[postgres]="127.0.0.1:$PG_PORT|PostgreSQL ${got#t|} (running; role and database changes in place)"
}

# up_postgres creates and starts the Debian cluster PG_VERSION PG_CLUSTER
# as needed, and its role and database changes.
up_postgres() {
	local info status port how=running hba
	need_root "setting up PostgreSQL (cluster $PG_VERSION $PG_CLUSTER, role and database changes)"
	[[ -x "$PG_BIN" ]] || die "PostgreSQL $PG_VERSION binaries not found ($PG_BIN) after installing Debian's postgresql package; set PG_VERSION"
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
	STATUS[postgres]="127.0.0.1:$PG_PORT|PostgreSQL $PG_VERSION cluster $PG_CLUSTER ($how)"
}

# ------------------------------------------------------------------------ main

# preflight SERVICE... checks that this machine can run the services to
# start, then installs with one apt-get the Debian packages that they, and
# PostgreSQL when it is to be set up, lack.
preflight() {
	local pkgs=() s
	for s; do
		case "$s" in
		dynamodb)
			[[ "$(uname -m)" == x86_64 ]] || die "DynamoDB Local's native SQLite library is fetched for linux/amd64 only, and this machine is $(uname -m)"
			(("$(java_major)" >= 17)) || pkgs+=(openjdk-17-jre-headless)
			dynamodb_installed || command -v mvn >/dev/null || pkgs+=(maven)
			;;
		localstack | s3)
			"${s}_installed" || find_python >/dev/null || no_python
			;;
		couch)
			command -v node >/dev/null || pkgs+=(nodejs)
			couch_installed || command -v npm >/dev/null || pkgs+=(npm)
			;;
		esac
	done
	if [[ -z "$PG_READY" ]] && { [[ ! -x "$PG_BIN" ]] || ! command -v pg_ctlcluster >/dev/null; }; then
		pkgs+=(postgresql)
	fi
	((${#pkgs[@]} == 0)) || apt_install "${pkgs[@]}"
	if [[ " $* " == *" dynamodb "* ]] && (("$(java_major)" < 17)); then
		die "DynamoDB Local $DYNAMODB_LOCAL_VERSION needs Java 17 or later; \`java -version\` says $(java -version 2>&1 | head -n1)"
	fi
}

# install_missing SERVICE... installs what each service lacks, all at once:
# each install waits mostly on its downloads, and logs to a file of its own.
install_missing() {
	local s i pids=() names=() failed=()
	for s; do
		"${s}_installed" && continue
		"install_$s" &
		pids+=("$!")
		names+=("$s")
	done
	for i in "${!pids[@]}"; do
		wait "${pids[$i]}" || failed+=("${names[$i]}")
	done
	((${#failed[@]} == 0)) || die "could not install ${failed[*]}; see above"
}

# The services in the order they start: LocalStack's DynamoDB forwards to
# DynamoDB Local.
TO_START=()
for s in dynamodb localstack s3 couch; do
	"${s}_answers" || TO_START+=("$s")
done
PG_READY=
postgres_answers && PG_READY=1
preflight "${TO_START[@]}"
install_missing "${TO_START[@]}"
for s in "${TO_START[@]}"; do
	"start_$s"
done
[[ -n "$PG_READY" ]] || up_postgres

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
for svc in dynamodb aws s3 couch postgres; do
	IFS='|' read -r addr what <<<"${STATUS[$svc]:-}"
	printf '%-9s %-23s %s\n' "$svc" "$addr" "$(inspect "$svc")"
	printf '%-9s %-23s   %s\n' "" "" "$what"
done
printf '\nLogs: %s   Environment: source localstack/env.sh\n' "${LOGS#"$ROOT"/}"
