#!/usr/bin/env bash
# Bootstraps the local AWS for the CDK (the CDKToolkit stack) unless it stands
# complete already. Deploys run side by side (the tests deploy several stacks
# at once on a fresh LocalStack): each would otherwise see no CDKToolkit and
# create one, and all but the first fail on the others' resources
# (ParameterAlreadyExists). So the check and the bootstrap run one at a time,
# under a lock, and the check is made again once the lock is held.
#
# Usage: cdk-bootstrap.sh [CDK ARGS...]   (run by deploy.sh, in the repository)
#
# Environment: CDKLOCAL [infra/node_modules/.bin/cdklocal] the CDK CLI;
# CHANGES_AWSCLI [LocalStack's AWS CLI] the AWS CLI; CHANGES_BOOTSTRAP_LOCK
# [.local/cdk-bootstrap.lock] the lock file.
set -euo pipefail
CDKLOCAL="${CDKLOCAL:-infra/node_modules/.bin/cdklocal}"
if [[ -n "${CHANGES_AWSCLI:-}" ]]; then
	AWSCLI=("$CHANGES_AWSCLI")
else
	AWSCLI=(.local/localstack/venv/bin/python -m awscli)
fi
lock="${CHANGES_BOOTSTRAP_LOCK:-.local/cdk-bootstrap.lock}"
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-${AWS_REGION:-us-east-1}}"

# A stack whose creation failed (ROLLBACK_COMPLETE) is no bootstrap: the CDK
# deletes it and creates it again.
bootstrapped() {
	local status
	status="$("${AWSCLI[@]}" cloudformation describe-stacks --stack-name CDKToolkit \
		--query 'Stacks[0].StackStatus' --output text 2>/dev/null)" || return 1
	case "$status" in
	CREATE_COMPLETE | UPDATE_COMPLETE | UPDATE_ROLLBACK_COMPLETE) return 0 ;;
	*) return 1 ;;
	esac
}

bootstrapped && exit 0
mkdir -p "$(dirname "$lock")"
exec 9>"$lock"
flock 9
bootstrapped || "$CDKLOCAL" bootstrap "$@"
