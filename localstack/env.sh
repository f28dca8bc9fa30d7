# shellcheck shell=sh
# Source this file (`. localstack/env.sh`) to point the AWS SDK, the tools and
# the tests at the local services started by localstack/up.sh. A variable that
# is already set is left as it is (even when empty), so exporting e.g.
# AWS_ENDPOINT_URL first points everything elsewhere, and AWS_ENDPOINT_URL=
# (empty) means real AWS.
#
# AWS_ENDPOINT_URL is LocalStack (SQS and the rest); the SDK's standard
# per-service settings send S3 calls to moto (AWS_ENDPOINT_URL_S3) and
# DynamoDB calls to DynamoDB Local (AWS_ENDPOINT_URL_DYNAMODB) instead; see
# localstack/README.md for why. Set one empty to send that service's calls to
# AWS_ENDPOINT_URL too.
#
# The settings stay in the shell that sourced this file: a later `make deploy`,
# `changesctl` or AWS CLI command there goes to the local services too (each
# changesctl command that talks to AWS names its endpoint on stderr). Use
# another shell for AWS.
#
# pouchdb-server runs in "admin party" mode: COUCH_URL carries no credentials
# on purpose (see localstack/README.md). For the CouchDB container, put the
# admin credentials in the URL: http://admin:PASSWORD@127.0.0.1:5984.

: "${AWS_ENDPOINT_URL=http://127.0.0.1:4566}"
: "${AWS_ENDPOINT_URL_S3=http://127.0.0.1:4567}"
: "${AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:8000}"
: "${AWS_REGION=us-east-1}"
: "${AWS_ACCESS_KEY_ID=test}"
: "${AWS_SECRET_ACCESS_KEY=test}"
: "${S3_USE_PATH_STYLE=true}"
: "${PG_DSN=postgres://changes:changes@127.0.0.1:5432/changes?sslmode=disable}"
: "${COUCH_URL=http://127.0.0.1:5984}"
export AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3 AWS_ENDPOINT_URL_DYNAMODB AWS_REGION AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY S3_USE_PATH_STYLE PG_DSN COUCH_URL
