#!/usr/bin/env bash
# Deploys the full stack to the local AWS (`make localstack-deploy`): the
# functions built for this machine, their schedule, event source mappings and
# permissions, and everything else the stack holds, with the pinned cdklocal.
# LocalStack runs the functions on the host (localstack/lambdahost).
#
# Usage: deploy.sh CHANGESCTL CONFIG   (run by make with localstack/env.sh sourced)
#
# Around the deploy:
#   - before: the table and queues that `changesctl bootstrap` (make demo)
#     created under the same names are removed when no stack owns them:
#     CloudFormation would fail on them (Table already exists).
#   - after: each secret <prefix>/NAME the stack created gets the value of
#     the environment variable NAME (PG_DSN from env.sh, say; other secrets
#     under the prefix are left alone), as
#     docs/deploy.md tells a user to do on AWS; the stack's bucket is also
#     created in the S3 the functions use (moto, AWS_ENDPOINT_URL_S3), since
#     CloudFormation creates it in LocalStack's S3; every function must be
#     Active. Only then are the schedule rules, deployed disabled, enabled:
#     a poller started by the schedule during the deploy would queue changes
#     for a writer without its secret or bucket.
#
# Environment: BUILD_DIR [.local/build/host] where the bootstraps are built;
# CDK_OUT [cdk.out] where the cloud assembly is written (deploys running side
# by side each need their own); SCHEDULES [enabled] or disabled: leave the
# rules disabled (the tests invoke the poller themselves); CHANGES_AWS_CALLS
# [unset] an absolute path: the functions record every AWS request they make
# there (-c aws_calls), for the tests' IAM check; CHANGES_COMMIT [the
# checkout's HEAD] the commit stamped into the functions (a test deploying
# twice pins it, so that a commit made meanwhile changes no function).
set -euo pipefail
ctl=$1
config=$2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-.local/build/host}"
CDK_OUT="${CDK_OUT:-cdk.out}"
CDKLOCAL=infra/node_modules/.bin/cdklocal
OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
AWSCLI=(.local/localstack/venv/bin/python -m awscli)
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-$AWS_REGION}"

say() { printf 'localstack-deploy: %s\n' "$*" >&2; }
die() { printf 'localstack-deploy: ERROR: %s\n' "$*" >&2; exit 1; }

[[ -x "${AWSCLI[0]}" ]] || die "LocalStack's virtualenv is missing: run make up"

goarch="$(go env GOARCH)"
# The release and commit stamped into the functions, as make build stamps them.
version_pkg=github.com/changes-worker/changes-worker/shared/version
version="$(cat VERSION)"
commit="${CHANGES_COMMIT-$(git rev-parse --short=12 HEAD 2>/dev/null || true)}"
ldflags="-s -w -X $version_pkg.version=$version -X $version_pkg.commit=$commit"
say "building the functions $version for linux/$goarch into $BUILD_DIR"
for f in poller writer verify; do
	GOOS=linux GOARCH="$goarch" CGO_ENABLED=0 go build -tags lambda.norpc -trimpath -ldflags="$ldflags" \
		-o "$BUILD_DIR/$f/bootstrap" "./functions/$f"
done

say "removing the table and queues \`changesctl bootstrap\` (make demo) made under the stack's names, if any: CloudFormation creates its own"
CHANGES_AWS_CALLS= "$ctl" bootstrap --remove --config "$config" | sed 's/^/localstack-deploy: bootstrap --remove: /' >&2

# cdklocal is given the local AWS as 127.0.0.1 (its default host name does not
# resolve everywhere), S3 included: CloudFormation reads the template from
# its own S3. CDK_HOME keeps the CLI's cached account apart from real AWS's.
s3_functions="${AWS_ENDPOINT_URL_S3:-$AWS_ENDPOINT_URL}"
export AWS_ENDPOINT_URL_S3="$AWS_ENDPOINT_URL" CDK_HOME="$ROOT/.local/cdk-home"
ctx=(-c "config=$config" -c "build_dir=$BUILD_DIR" -c schedules=disabled -o "$CDK_OUT")
if [[ -n "${CHANGES_AWS_CALLS:-}" ]]; then
	ctx+=(-c "aws_calls=$CHANGES_AWS_CALLS")
fi
CDKLOCAL="$CDKLOCAL" localstack/cdk-bootstrap.sh "${ctx[@]}"
"$CDKLOCAL" deploy "${ctx[@]}" --require-approval never --outputs-file "$OUT"

# The stack is named after stack.prefix; its one output is the bucket.
read -r prefix bucket < <(python3 -c '
import json, sys
for stack, outputs in json.load(open(sys.argv[1])).items():
    print(stack, outputs["BucketName"])' "$OUT")

# The secrets the stack created, one per {"env": NAME} reference, named
# <prefix>/NAME: read from its template, so that a secret of the user's under
# the same prefix (shop/orders-dsn, say) is left alone.
secrets="$(python3 -c '
import json, sys
for r in json.load(open(sys.argv[1]))["Resources"].values():
    if r["Type"] == "AWS::SecretsManager::Secret":
        print(r["Properties"]["Name"])' "$CDK_OUT/$prefix.template.json")"
for secret in $secrets; do
	name="${secret#"$prefix"/}"
	# NAME need not be a shell variable name ({"env": "crm-token"}): the
	# environment is read as it is, not through the shell's variables.
	if printenv -- "$name" >/dev/null; then
		python3 -c 'import os, sys; sys.stdout.write(os.environ[sys.argv[1]])' "$name" |
			"${AWSCLI[@]}" secretsmanager put-secret-value --secret-id "$secret" \
				--secret-string file:///dev/stdin >/dev/null
		say "secret $secret: the value of the environment variable $name"
	else
		say "secret $secret keeps its placeholder (the environment variable $name is not set); put the value: aws secretsmanager put-secret-value --secret-id $secret --secret-string VALUE"
	fi
done

if [[ "$s3_functions" != "$AWS_ENDPOINT_URL" ]]; then
	AWS_ENDPOINT_URL_S3="$s3_functions" "${AWSCLI[@]}" s3api create-bucket --bucket "$bucket" >/dev/null 2>&1 ||
		AWS_ENDPOINT_URL_S3="$s3_functions" "${AWSCLI[@]}" s3api head-bucket --bucket "$bucket" ||
		die "cannot create the stack's bucket $bucket on $s3_functions"
	say "bucket $bucket also on $s3_functions, the S3 the functions use"
fi

# One poller, one writer and one verify function per job, each named
# <prefix>-<job>-<function>.
functions="$("${AWSCLI[@]}" lambda list-functions \
	--query "Functions[?starts_with(FunctionName, \`$prefix-\`)].FunctionName" --output text)"
[[ -n "$functions" ]] || die "the stack $prefix deployed no functions"
for fn in $functions; do
	for _ in $(seq 60); do
		state="$("${AWSCLI[@]}" lambda get-function --function-name "$fn" --query Configuration.State --output text)"
		[[ "$state" == Active ]] && break
		sleep 1
	done
	[[ "$state" == Active ]] || die "function $fn is $state, not Active"
	say "function $fn: Active"
done
rules="$("${AWSCLI[@]}" events list-rules --name-prefix "$prefix-" --query 'Rules[?ends_with(Name, `-schedule`)].Name' --output text)"
if [[ "${SCHEDULES:-enabled}" == disabled ]]; then
	say "stack $prefix deployed; schedule rules left disabled: $rules"
	exit 0
fi
# LocalStack schedules a rule when its targets are put, enabled or not as
# the rule is then, and EnableRule does not change that: the targets are put
# again once the rule is enabled (on AWS this changes nothing).
for rule in $rules; do
	"${AWSCLI[@]}" events enable-rule --name "$rule"
	targets="$("${AWSCLI[@]}" events list-targets-by-rule --rule "$rule" --query Targets --output json)"
	"${AWSCLI[@]}" events put-targets --rule "$rule" --targets "$targets" >/dev/null
done
say "stack $prefix deployed; rules $rules now start their jobs' pollers on their schedule"
