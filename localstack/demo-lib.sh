# shellcheck shell=bash
# Sourced by demo.sh and demo-deployed.sh: the steps both demos share, and
# what both print at the end. The S3 output writes to the deployed stack's bucket when a stack of the
# demo's prefix is deployed (the stack names it), else to changes-worker-data.

# demo_bucket prints the bucket the demo's S3 output writes to.
demo_bucket() {
	local b
	b="$(.local/localstack/venv/bin/python -m awscli cloudformation describe-stacks --stack-name changes-worker \
		--query "Stacks[0].Outputs[?OutputKey=='BucketName'].OutputValue" --output text 2>/dev/null || true)"
	[[ -n "$b" && "$b" != None ]] && echo "$b" || echo changes-worker-data
}

# demo_load CHANGESCTL DB loads the 1,000 sample orders into a new DB.
demo_load() {
	echo "== loading sample data into $2"
	"$1" sample --url "$2" --docs 1000 --update-every 4 --delete-every 10 --fresh
}

# demo_receiver CHANGESCTL OUT starts the demo REST endpoint, writing into a
# new OUT, until the script exits.
demo_receiver() {
	echo "== starting the demo REST endpoint on 127.0.0.1:8099"
	rm -rf "$2"
	"$1" receiver --addr 127.0.0.1:8099 --dir "$2" 2>/dev/null &
	DEMO_RECEIVER=$!
	trap 'kill $DEMO_RECEIVER 2>/dev/null || true' EXIT
}

# demo_result CHANGESCTL CONFIG OUT prints the status and the three outputs' counts.
demo_result() {
	local ctl=$1 config=$2 out=$3 rows files objects bucket s3
	echo
	echo "== status"
	"$ctl" status --config "$config" 2>/dev/null
	bucket="$(demo_bucket)"
	rows=$(psql "$PG_DSN" -Atc 'select count(*) from demo_orders')
	files=$(find "$out" -name '*.json' | wc -l)
	# Documents, not the tombstone markers that remember deletions.
	s3="${AWS_ENDPOINT_URL_S3:-$AWS_ENDPOINT_URL}"
	objects=$(curl -s "$s3/$bucket?list-type=2&prefix=demo-orders/" | grep -o '<Key>[^<]*</Key>' | grep -vc '_tombstones/')
	echo
	echo "== result"
	echo "  postgres demo_orders rows:  $rows (expected 900 live documents)"
	echo "  http receiver documents:    $files"
	echo "  s3 objects (demo-orders/):  $objects"
	echo
	echo "Look at it yourself:"
	echo "  psql \"$PG_DSN\" -c 'select doc_id, rev, body->>'\"'\"'total'\"'\"' as total from demo_orders order by doc_id limit 5'"
	echo "  curl -s '$s3/$bucket?list-type=2&prefix=demo-orders/&max-keys=5'"
	echo "  ls $out | head"
	echo "  $ctl status --config $config"
}
