# changes-worker: `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO        ?= go
LOCAL     := .local
CTL       := $(LOCAL)/bin/changesctl
CONFIG    ?= localstack/jobs.json
ENV       := source localstack/env.sh &&
FUNCTIONS := poller writer
CDK_CONFIG       ?= $(CONFIG)
CDK              := infra/node_modules/.bin/cdk
CDKLOCAL         := infra/node_modules/.bin/cdklocal
CFN_LINT_VERSION := 1.51.0

.PHONY: help up down sync-gateway build ctl test test-infra demo bench lint cdk-deps synth diff deploy destroy localstack-up localstack-deploy

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

up: ## start the local services (AWS emulator, CouchDB-compatible source, PostgreSQL); installs what is missing
	@bash localstack/up.sh

sync-gateway: ## build the pinned Sync Gateway 3.1.0 into .local/bin/sync_gateway (up does it too; tests start it)
	@bash localstack/syncgateway.sh

down: ## stop the local services
	@bash localstack/down.sh

ctl: ## build the changesctl CLI into .local/bin
	@mkdir -p $(LOCAL)/bin && $(GO) build -o $(CTL) ./cmd/changesctl

build: ## build the Lambda bootstraps for linux/arm64 into build/<function>/bootstrap
	@for f in $(FUNCTIONS); do \
		GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags='-s -w' -o build/$$f/bootstrap ./functions/$$f || exit 1; \
		echo "build/$$f/bootstrap"; \
	done

test: up ## run every test (unit, integration, end-to-end, infra) against the local services
	@command -v cfn-lint >/dev/null 2>&1 || pip install --quiet "cfn-lint==$(CFN_LINT_VERSION)"
	@$(ENV) $(GO) test -count=1 -timeout 45m ./...

test-infra: up ## only the CDK stack tests: assertions, IAM, cdk-nag, cfn-lint, deploy to the local emulator
	@command -v cfn-lint >/dev/null 2>&1 || pip install --quiet "cfn-lint==$(CFN_LINT_VERSION)"
	@$(ENV) $(GO) test -count=1 ./infra/...

demo: up ctl ## run the pipeline end to end on the local services and print a summary
	@$(ENV) bash localstack/demo.sh $(CTL) $(CONFIG)

bench: up ctl ## print throughput, latency and memory figures (also written to bench-results.json)
	@$(ENV) $(GO) run ./tests/bench

lint: ## gofmt, go vet, and go mod tidy leaves no diff
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	@$(GO) vet ./...
	@cp go.mod $(LOCAL)/go.mod.bak && cp go.sum $(LOCAL)/go.sum.bak && $(GO) mod tidy && \
		{ diff -q go.mod $(LOCAL)/go.mod.bak >/dev/null && diff -q go.sum $(LOCAL)/go.sum.bak >/dev/null || { echo "go mod tidy changes go.mod/go.sum"; exit 1; }; }

infra/node_modules/.package-lock.json: infra/package.json infra/package-lock.json
	npm ci --prefix infra --no-audit --no-fund

cdk-deps: infra/node_modules/.package-lock.json ## install the pinned CDK CLI and cdklocal into infra/node_modules

synth: build cdk-deps ## synthesize the stack into cdk.out (CDK_CONFIG=path/to/jobs.json)
	$(CDK) synth --quiet -c config=$(CDK_CONFIG)

diff: build cdk-deps ## show what deploy would change
	$(CDK) diff -c config=$(CDK_CONFIG)

deploy: build cdk-deps ## deploy the stack to AWS (see infra/README.md)
	$(CDK) deploy -c config=$(CDK_CONFIG) --require-approval broadening

destroy: build cdk-deps ## delete the stack (retained table and bucket stay)
	$(CDK) destroy -c config=$(CDK_CONFIG)

localstack-up: ## start LocalStack, CouchDB and PostgreSQL with Docker (where a Docker engine runs)
	docker compose -f localstack/docker-compose.yml up -d --wait

localstack-deploy: build cdk-deps ## bootstrap LocalStack and deploy the stack with cdklocal
	env -u AWS_ENDPOINT_URL $(CDKLOCAL) bootstrap -c config=$(CDK_CONFIG)
	env -u AWS_ENDPOINT_URL $(CDKLOCAL) deploy -c config=$(CDK_CONFIG) --require-approval never
