#!/usr/bin/env bash
# The demo behind `make demo`: load sample orders into the local source, create
# the resources, run the pipeline until it is idle, and show the result.
# Usage: demo.sh CHANGESCTL CONFIG (run by make with localstack/env.sh sourced).
set -euo pipefail
# shellcheck source=localstack/demo-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/demo-lib.sh"
ctl=$1
config=$2
db="$COUCH_URL/demo-orders"
out=.local/http-out

demo_load "$ctl" "$db"

echo "== creating the table, queues and bucket on $AWS_ENDPOINT_URL"
"$ctl" bootstrap --config "$config" >/dev/null
# The source database was just recreated, so its sequence starts again.
"$ctl" checkpoint reset --config "$config" --job orders --yes --force >/dev/null

demo_receiver "$ctl" "$out"

echo "== running the pipeline until idle"
"$ctl" run --config "$config" --until-idle --timeout 10m

demo_result "$ctl" "$config" "$out"
