#!/usr/bin/env bash
# The demo through the deployed stack (`make localstack-demo`, after
# `make localstack-deploy`): the same 1,000 sample orders as `make demo`, but
# delivered by the deployed Lambda functions, which LocalStack runs on this
# machine: the poller invoked through the Lambda API, the writer by the
# queues' event source mappings. It prints the same result as `make demo`,
# then each function's cold starts and median duration from the REPORT lines
# of its log group.
# Usage: demo-deployed.sh CHANGESCTL CONFIG (run by make with localstack/env.sh sourced).
set -euo pipefail
# shellcheck source=localstack/demo-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/demo-lib.sh"
ctl=$1
config=$2
db="$COUCH_URL/demo-orders"
out=.local/http-out
prefix=changes-worker
AWSCLI=(.local/localstack/venv/bin/python -m awscli)
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-$AWS_REGION}"

"${AWSCLI[@]}" lambda get-function --function-name "$prefix-poller" >/dev/null 2>&1 ||
	{ echo "no deployed function $prefix-poller: run make localstack-deploy first" >&2; exit 1; }
start_ms=$(($(date +%s) * 1000))
started=$SECONDS

demo_load "$ctl" "$db"

echo "== emptying the outputs, so that what they hold is the deployed functions' work"
psql "$PG_DSN" -qc 'drop table if exists demo_orders, demo_orders_versions'
bucket="$(demo_bucket)"
AWS_ENDPOINT_URL="${AWS_ENDPOINT_URL_S3:-$AWS_ENDPOINT_URL}" "${AWSCLI[@]}" s3 rm --quiet --recursive "s3://$bucket/demo-orders/"
# The source database was just recreated, so its sequence starts again.
"$ctl" checkpoint reset --config "$config" --job orders --yes --force >/dev/null 2>&1

demo_receiver "$ctl" "$out"

# The poller runs for its whole budget (stack.poller_timeout), standing by
# for new changes once caught up.
echo "== invoking $prefix-poller through the Lambda API (it returns when its budget is spent)"
"${AWSCLI[@]}" lambda invoke --cli-read-timeout 300 --function-name "$prefix-poller" \
	--payload '{"job":"orders"}' .local/poller-result.json >/dev/null
echo "   $(cat .local/poller-result.json)"

echo "== waiting for the event source mappings to drain the queues into the outputs"
queues=()
for name in orders-pg orders-rest.fifo orders-archive; do
	queues+=("$("${AWSCLI[@]}" sqs get-queue-url --queue-name "$prefix-$name" --query QueueUrl --output text)")
done
idle=0
while ((idle < 2)); do
	sleep 2
	busy=0
	for q in "${queues[@]}"; do
		n="$("${AWSCLI[@]}" sqs get-queue-attributes --queue-url "$q" \
			--attribute-names ApproximateNumberOfMessages ApproximateNumberOfMessagesNotVisible \
			--query 'sum([Attributes.ApproximateNumberOfMessages, Attributes.ApproximateNumberOfMessagesNotVisible][].to_number(@))' --output text)"
		((busy += ${n%.*}))
	done
	if ((busy == 0)); then ((idle += 1)); else idle=0; fi
done
echo "   drained $((SECONDS - started))s after the start"

demo_result "$ctl" "$config" "$out"

echo
echo "== the deployed functions, from the REPORT lines of their log groups"
for f in poller writer; do
	"${AWSCLI[@]}" logs filter-log-events --log-group-name "/aws/lambda/$prefix-$f" \
		--start-time "$start_ms" --filter-pattern REPORT --query 'events[].message' --output json |
		python3 "$(dirname "${BASH_SOURCE[0]}")/reports.py" "$prefix-$f"
done
