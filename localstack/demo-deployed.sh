#!/usr/bin/env bash
# The demo through the deployed stack (`make localstack-demo`, after
# `make localstack-deploy`): the same 1,000 sample orders as `make demo`, but
# delivered by the deployed Lambda functions, which LocalStack runs on this
# machine: the poller invoked through the Lambda API, the writer by the
# queues' event source mappings. It prints the same result as `make demo`,
# then each function's median duration during the demo and its cold starts
# since the deploy, from the REPORT lines of its log group.
# Usage: demo-deployed.sh CHANGESCTL CONFIG (run by make with localstack/env.sh sourced).
set -euo pipefail
# shellcheck source=localstack/demo-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/demo-lib.sh"
ctl=$1
config=$2
db="$COUCH_URL/demo-orders"
out=.local/http-out
prefix=changes-worker
job=orders
AWSCLI=(.local/localstack/venv/bin/python -m awscli)
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-$AWS_REGION}"

"${AWSCLI[@]}" lambda get-function --function-name "$prefix-$job-poller" >/dev/null 2>&1 ||
	{ echo "no deployed function $prefix-$job-poller: run make localstack-deploy first" >&2; exit 1; }
start_ms=$(($(date +%s) * 1000))
started=$SECONDS

demo_load "$ctl" "$db"

echo "== emptying the outputs, so that what they hold is the deployed functions' work"
# Emptied, not dropped: a warm writer created the tables once and goes on
# using them.
psql "$PG_DSN" -qc 'truncate demo_orders, demo_orders_versions' 2>/dev/null || true
bucket="$(demo_bucket)"
AWS_ENDPOINT_URL="${AWS_ENDPOINT_URL_S3:-$AWS_ENDPOINT_URL}" "${AWSCLI[@]}" s3 rm --quiet --recursive "s3://$bucket/demo-orders/"
# What the schedule delivered or dead-lettered before (the REST endpoint
# listens only during a demo) goes too.
for o in pg rest archive; do
	"$ctl" dlq purge --config "$config" --job orders --output "$o" --yes >/dev/null 2>&1
done
# The source database was just recreated, so its sequence starts again.
"$ctl" checkpoint reset --config "$config" --job orders --yes --force >/dev/null 2>&1

demo_receiver "$ctl" "$out"

# Invoked asynchronously, as the schedule invokes it: it runs for its whole
# budget (stack.poller_timeout), standing by when the schedule's poller holds
# the lease, which then delivers instead.
echo "== invoking $prefix-$job-poller through the Lambda API"
"${AWSCLI[@]}" lambda invoke --invocation-type Event --function-name "$prefix-$job-poller" \
	--payload '{"job":"orders"}' /dev/null >/dev/null
want="$(curl -s "$db" | python3 -c 'import json, sys; print(json.load(sys.stdin)["update_seq"])')"
echo "== waiting for the poller to checkpoint the source's last change ($want)"
until "$ctl" checkpoint get --config "$config" --job orders 2>/dev/null | grep -q "checkpoint $want,"; do
	sleep 1
done
echo "   checkpointed $((SECONDS - started))s after the start"

echo "== waiting for the event source mappings to drain the queues into the outputs"
queues=()
for name in orders-pg orders-rest.fifo orders-archive; do
	queues+=("$("${AWSCLI[@]}" sqs --endpoint-url "$AWS_ENDPOINT_URL" get-queue-url --queue-name "$prefix-$name" --query QueueUrl --output text)")
done
idle=0
while ((idle < 2)); do
	sleep 2
	busy=0
	for q in "${queues[@]}"; do
		n="$("${AWSCLI[@]}" sqs --endpoint-url "$AWS_ENDPOINT_URL" get-queue-attributes --queue-url "$q" \
			--attribute-names ApproximateNumberOfMessages ApproximateNumberOfMessagesNotVisible \
			--query 'sum([Attributes.ApproximateNumberOfMessages, Attributes.ApproximateNumberOfMessagesNotVisible][].to_number(@))' --output text)"
		busy=$((busy + ${n%.*}))
	done
	if ((busy == 0)); then idle=$((idle + 1)); else idle=0; fi
done
echo "   drained $((SECONDS - started))s after the start"

demo_result "$ctl" "$config" "$out"

echo
echo "== the deployed functions, from the REPORT lines of their log groups"
for f in poller writer; do
	"${AWSCLI[@]}" logs filter-log-events --log-group-name "/aws/lambda/$prefix-$job-$f" \
		--filter-pattern REPORT --query 'events[].[timestamp, message]' --output json |
		python3 "$(dirname "${BASH_SOURCE[0]}")/reports.py" "$prefix-$job-$f" "$start_ms"
done
