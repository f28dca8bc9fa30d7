#!/usr/bin/env bash
# The demo behind `make demo`: load sample orders into the local source, create
# the resources, run the pipeline until it is idle, and show the result.
# Usage: demo.sh CHANGESCTL CONFIG (run by make with localstack/env.sh sourced).
set -euo pipefail
ctl=$1
config=$2
db="$COUCH_URL/demo-orders"
out=.local/http-out

echo "== loading sample data into $db"
"$ctl" sample --url "$db" --docs 1000 --update-every 4 --delete-every 10 --fresh

echo "== creating the table, queues and bucket on $AWS_ENDPOINT_URL"
"$ctl" bootstrap --config "$config" >/dev/null
# The source database was just recreated, so its sequence starts again.
"$ctl" checkpoint reset --config "$config" --job orders --yes --force >/dev/null

echo "== starting the demo REST endpoint on 127.0.0.1:8099"
rm -rf "$out"
"$ctl" receiver --addr 127.0.0.1:8099 --dir "$out" 2>/dev/null &
receiver=$!
trap 'kill $receiver 2>/dev/null || true' EXIT

echo "== running the pipeline until idle"
"$ctl" run --config "$config" --until-idle --timeout 10m

echo
echo "== status"
"$ctl" status --config "$config"

rows=$(psql "$PG_DSN" -Atc 'select count(*) from demo_orders')
files=$(find "$out" -name '*.json' | wc -l)
# Documents, not the tombstone markers that remember deletions.
s3="${AWS_ENDPOINT_URL_S3:-$AWS_ENDPOINT_URL}"
objects=$(curl -s "$s3/changes-worker-data?list-type=2&prefix=demo-orders/" | grep -o '<Key>[^<]*</Key>' | grep -vc '_tombstones/')
echo
echo "== result"
echo "  postgres demo_orders rows:  $rows (expected 900 live documents)"
echo "  http receiver documents:    $files"
echo "  s3 objects (demo-orders/):  $objects"
echo
echo "Look at it yourself:"
echo "  psql \"$PG_DSN\" -c 'select doc_id, rev, body->>'\"'\"'total'\"'\"' as total from demo_orders order by doc_id limit 5'"
echo "  curl -s '$s3/changes-worker-data?list-type=2&prefix=demo-orders/&max-keys=5'"
echo "  ls $out | head"
echo "  $ctl status --config $config"
