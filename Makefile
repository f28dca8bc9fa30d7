# changes-worker: `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO        ?= go
LOCAL     := .local
CTL       := $(LOCAL)/bin/changesctl
CONFIG    ?= localstack/jobs.json
ENV       := source localstack/env.sh &&
FUNCTIONS := poller writer

.PHONY: help up down build ctl test test-unit demo bench lint synth diff deploy destroy localstack-up localstack-deploy tidy

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

up: ## start the local services (AWS emulator, CouchDB-compatible source, PostgreSQL); installs what is missing
	@bash localstack/up.sh

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
	@$(ENV) $(GO) test -count=1 -timeout 40m ./...

demo: up ctl ## run the pipeline end to end on the local services and print a summary
	@$(ENV) bash localstack/demo.sh $(CTL) $(CONFIG)

bench: up ctl ## print throughput, latency and memory figures (also written to bench-results.json)
	@$(ENV) $(GO) run ./tests/bench

lint: ## gofmt, go vet, and go mod tidy leaves no diff
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	@$(GO) vet ./...
	@cp go.mod $(LOCAL)/go.mod.bak && cp go.sum $(LOCAL)/go.sum.bak && $(GO) mod tidy && \
		{ diff -q go.mod $(LOCAL)/go.mod.bak >/dev/null && diff -q go.sum $(LOCAL)/go.sum.bak >/dev/null || { echo "go mod tidy changes go.mod/go.sum"; exit 1; }; }
