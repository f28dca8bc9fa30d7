# changes-worker: `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO        ?= go
LOCAL     := .local
CTL       := $(LOCAL)/bin/changesctl
CONFIG    ?= localstack/jobs.json
ENV       := source localstack/env.sh &&
FUNCTIONS := poller writer verify
# How many tests of one package make test runs at once (in ./tests, the
# tests that deploy the stack first), and how many packages' test binaries.
# The end-to-end tests mostly wait (deploys, lease TTLs, outages), so more
# run side by side than the machine has cores. The packages whose tests wait
# longest are named first, so that they start first, and the next slowest
# after them, so that they run in infra's place before tests ends.
TEST_PARALLEL ?= 10
TEST_PACKAGES ?= 2
SLOW_PACKAGES := ./tests ./infra ./cmd/changesctl ./tests/syncgateway
# Every event of the last make test (go test -json), the passing tests'
# output included.
TEST_LOG      := $(LOCAL)/logs/test.json
# How each local service answered during the last make test (tests/svcprobe:
# a request to each every second), one JSON object a line.
SERVICES_LOG  := $(LOCAL)/logs/services.jsonl
# The release stamped into changesctl and the functions (changesctl version,
# their first log line, the lease item), with the commit they are built from.
VERSION   := $(shell cat VERSION)
COMMIT    := $(shell git rev-parse --short=12 HEAD 2>/dev/null)
LDFLAGS   := -X github.com/changes-worker/changes-worker/shared/version.version=$(VERSION) \
	-X github.com/changes-worker/changes-worker/shared/version.commit=$(COMMIT)
# The configuration a deploy ships: no default, name it (make deploy CDK_CONFIG=path/to/jobs.json).
CDK_CONFIG       ?=
# localstack-deploy: the demo's configuration unless CDK_CONFIG names another.
LOCALSTACK_CONFIG  = $(or $(CDK_CONFIG),$(CONFIG))
# The CDK CLI of bootstrap, synth, diff, deploy and destroy;
# CDK=infra/node_modules/.bin/cdklocal sends its calls to a local AWS
# (AWS_ENDPOINT_URL, and AWS_ENDPOINT_URL_S3 to the same).
CDK              ?= infra/node_modules/.bin/cdk
# Where make build puts the functions, for which architecture (arm64 on AWS;
# a LocalStack that runs them on this machine needs its own), and where the
# CDK writes the cloud assembly.
BUILD_DIR        ?= build
FUNCTION_ARCH    ?= arm64
CDK_OUT          ?= cdk.out
CDK_ARGS          = -c config=$(CDK_CONFIG) -c build_dir=$(BUILD_DIR) -o $(CDK_OUT)
CDKLOCAL         := infra/node_modules/.bin/cdklocal
CFN_LINT_VERSION := 1.51.0
# staticcheck 2026.2.2, built with the toolchain of go.mod (go 1.26).
STATICCHECK_VERSION := v0.8.2
STATICCHECK      := $(LOCAL)/bin/staticcheck-$(STATICCHECK_VERSION)

.PHONY: help up down sync-gateway lambda-rie build ctl test test-infra cfn-lint-tool fuzz demo bench lint cdk-deps cdk-config bootstrap synth diff deploy destroy localstack-up localstack-deploy localstack-demo

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

up: ## start the local services (LocalStack, moto for S3, DynamoDB Local, CouchDB-compatible source, PostgreSQL); installs what is missing
	@bash localstack/up.sh

sync-gateway: ## build the pinned Sync Gateway 3.1.0 into .local/bin/sync_gateway (test and bench do; tests start it)
	@bash localstack/syncgateway.sh

lambda-rie: ## build AWS's Lambda Runtime Interface Emulator, with which LocalStack runs Lambda functions, into .local/bin
	@bash localstack/lambda-rie.sh

down: ## stop the local services
	@bash localstack/down.sh

ctl: ## build the changesctl CLI into .local/bin, its version stamped
	@mkdir -p $(dir $(CTL)) && $(GO) build -ldflags='$(LDFLAGS)' -o $(CTL) ./cmd/changesctl

build: ## build the Lambda bootstraps for linux/arm64 (FUNCTION_ARCH) into build/<function>/bootstrap (BUILD_DIR), their version stamped
	@for f in $(FUNCTIONS); do \
		GOOS=linux GOARCH=$(FUNCTION_ARCH) CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags='-s -w $(LDFLAGS)' -o $(BUILD_DIR)/$$f/bootstrap ./functions/$$f || exit 1; \
		echo "$(BUILD_DIR)/$$f/bootstrap"; \
	done

# make lint's checks run beside the tests at a lower CPU priority (nice): they
# only have to end, while the tests' waits for leases and deliveries are timed.
test: $(STATICCHECK) up sync-gateway lambda-rie cdk-deps cfn-lint-tool ## run every test (unit, integration, end-to-end, infra) against the local services, with make lint's checks beside them; prints the ten slowest tests and how the services answered, and keeps every event in .local/logs/test.json
	@$(GO) build -o $(LOCAL)/bin/testtimes ./tests/testtimes && $(GO) build -o $(LOCAL)/bin/svcprobe ./tests/svcprobe
	@lintlog=$$(mktemp); GO=$(GO) nice -n 10 bash .ci/lint $(STATICCHECK) >"$$lintlog" 2>&1 & lint=$$!; \
	$(ENV) { $(LOCAL)/bin/svcprobe -log $(SERVICES_LOG) & probe=$$!; }; \
	set -o pipefail; $(ENV) $(GO) test -count=1 -timeout 45m -p $(TEST_PACKAGES) -parallel $(TEST_PARALLEL) -json $(SLOW_PACKAGES) ./... | tee $(TEST_LOG) | $(LOCAL)/bin/testtimes; tested=$$?; \
	kill -TERM $$probe; wait $$probe; \
	wait $$lint; linted=$$?; \
	if [ $$linted -ne 0 ]; then echo "make lint failed:"; cat "$$lintlog"; else echo "make lint: ok"; fi; rm -f "$$lintlog"; \
	[ $$tested -eq 0 ] && [ $$linted -eq 0 ]

# Fuzz targets as package:Target. Their seed corpora (f.Add and testdata/fuzz)
# also run as ordinary tests in `make test`.
FUZZTIME         ?= 30s
FUZZMINIMIZETIME ?= 5s
FUZZ_TARGETS := \
	./shared/change:FuzzDecode \
	./shared/config:FuzzParse \
	./shared/config:FuzzShownURL \
	./shared/docid:FuzzPathSegment \
	./shared/feed:FuzzChanges \
	./shared/feed:FuzzBulkGetJSON \
	./shared/feed:FuzzBulkGetMultipart \
	./shared/fanout:FuzzBatchBody \
	./shared/deliver/httpsink:FuzzURL \
	./shared/deliver/s3sink:FuzzKey \
	./shared/deliver/pgsink:FuzzDecodeDoc \
	./shared/deliver/pgsink:FuzzMapDoc \
	./shared/deliver/pgsink:FuzzCoerce

fuzz: up ## run each fuzz target for FUZZTIME (30s); a failing input is written to the package's testdata/fuzz
	@failed=""; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; echo "== $$name ($$pkg), $(FUZZTIME)"; \
		$(ENV) $(GO) test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=$(FUZZMINIMIZETIME) $$pkg || failed="$$failed $$name"; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz failures:$$failed"; exit 1; fi

test-infra: up lambda-rie cdk-deps cfn-lint-tool ## only the CDK stack tests: assertions, IAM, cdk-nag, cfn-lint, the local variant deployed to LocalStack
	@$(ENV) $(GO) test -count=1 ./infra/...

demo: up ctl ## run the pipeline end to end on the local services and print a summary
	@$(ENV) bash localstack/demo.sh $(CTL) $(CONFIG)

bench: up sync-gateway lambda-rie cdk-deps ctl ## print throughput, latency, memory and failover figures (BENCH_ONLY=a,b: those benchmarks only); merge them into docs/bench-results.json and write docs/benchmarks.md
	@$(ENV) $(GO) run ./tests/bench $(if $(BENCH_ONLY),-only $(BENCH_ONLY)) -merge docs/bench-results.json
	@$(GO) run ./tests/bench -report docs/bench-results.json > docs/benchmarks.md
	@echo "docs/benchmarks.md written from docs/bench-results.json"

lint: $(STATICCHECK) ## gofmt, go vet, staticcheck, go mod tidy leaves no diff, the docs' package table, links, metrics, alarms and benchmarks page, docs/configuration.md is what the code generates (.ci/lint)
	@GO=$(GO) bash .ci/lint $(STATICCHECK)

$(STATICCHECK):
	@mkdir -p $(LOCAL)/bin
	GOBIN=$(abspath $(LOCAL))/bin $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	@mv $(LOCAL)/bin/staticcheck $@

infra/node_modules/.package-lock.json: infra/package.json infra/package-lock.json
	npm ci --prefix infra --no-audit --no-fund

cdk-deps: infra/node_modules/.package-lock.json ## install the pinned CDK CLI and cdklocal into infra/node_modules

# cfn-lint-tool installs the pinned cfn-lint the infra tests run, unless one is on PATH.
cfn-lint-tool:
	@command -v cfn-lint >/dev/null 2>&1 || pip install --quiet "cfn-lint==$(CFN_LINT_VERSION)"

cdk-config:
	@test -n "$(CDK_CONFIG)" || { echo "name the job configuration: make $(or $(MAKECMDGOALS),synth) CDK_CONFIG=path/to/jobs.json (there is no default)" >&2; exit 1; }

# Bootstraps started together go one at a time: on one LocalStack, the
# tests deploy side by side, and localstack/cdk-bootstrap.sh takes this lock.
BOOTSTRAP_LOCK = $(if $(shell command -v flock),flock .local/cdk-bootstrap.lock)

bootstrap: cdk-config build cdk-deps ## prepare the account and region of your credentials for deploys, once (CDK_CONFIG required: the CDK synthesizes the app first)
	@mkdir -p .local
	$(BOOTSTRAP_LOCK) $(CDK) bootstrap $(CDK_ARGS)

synth: cdk-config build cdk-deps ## synthesize the stack into cdk.out (CDK_CONFIG=path/to/jobs.json, required)
	$(CDK) synth --quiet $(CDK_ARGS)

diff: cdk-config build cdk-deps ## show what deploy would change (CDK_CONFIG required)
	$(CDK) diff $(CDK_ARGS)

deploy: cdk-config build cdk-deps ## deploy the stack to AWS (CDK_CONFIG required; see docs/deploy.md)
	$(CDK) deploy $(CDK_ARGS) --require-approval broadening

destroy: cdk-config build cdk-deps ## delete the stack (CDK_CONFIG required; retained table and bucket stay)
	$(CDK) destroy $(CDK_ARGS)

localstack-up: ## start the same services as containers (localstack/docker-compose.yml; where a Docker engine runs)
	docker compose -f localstack/docker-compose.yml up -d --wait

localstack-demo: up lambda-rie ctl ## after make localstack-deploy: the demo's 1,000 documents through the deployed functions, with their cold starts and durations
	@$(ENV) bash localstack/demo-deployed.sh $(CTL) $(CONFIG)

localstack-deploy: up lambda-rie cdk-deps ctl ## deploy the full stack to the local AWS, functions built for this machine (CDK_CONFIG, default the demo's)
	@$(ENV) bash localstack/deploy.sh $(CTL) $(LOCALSTACK_CONFIG)
