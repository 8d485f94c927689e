# runbox — see README.md.
GO ?= go
# The S3 server the file-store tests run against (Apache-2.0).
VERSITYGW ?= v1.8.0

.PHONY: run test build images deploy-images deps test-deps vet bench clean

## run: build what is missing and start the service on the embedded default
run: deps images build
	./bin/api

# The end-to-end tests that run a second time with sandboxes under gVisor.
RUNSC_TESTS = ^(TestContainment|TestEgress|TestRecycledSandbox|TestMCP|TestREST|TestExecutorCrash|TestExecutorShutdown|TestEmbedded|TestExecutorShutdownLetsRunsFinish|TestPoolForNewConversations)$$

## test: every test: unit, and integration against real Redis and Docker;
## then the containment, recycling and core end-to-end tests under gVisor
test: test-deps images
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 60m ./...
	SANDBOX_RUNTIME=runsc $(GO) test -race -count=1 -timeout 30m -run '$(RUNSC_TESTS)' ./e2e

## bench: start the service on a real redis-server and Docker, measure it
## against plain-Docker baselines, print the table (also in var/bench.md)
bench: images build
	@mkdir -p var
	$(GO) run ./cmd/bench -bin bin -out var/bench.md

## build: the api and executor binaries, in bin/
build:
	$(GO) build -o bin/api ./cmd/api
	$(GO) build -o bin/executor ./cmd/executor
	$(GO) build -o bin/loadgen ./cmd/loadgen

## images: the runner images that are missing or out of date
## (RUNNERS=python,r make images: those alone)
images: deps
	./runners/build.sh

## deploy-images: what docker-compose.yml runs (runners, runbox, runbox-redis)
deploy-images: deps
	./deploy/build.sh

## deps: install what the machine lacks (apt, when root or with sudo)
deps:
	./deploy/deps.sh run

## test-deps: what the integration tests run against besides Docker:
## redis-server, chromium, compose (apt), versitygw and Gitea (Go modules)
test-deps:
	./deploy/deps.sh test
	@command -v versitygw >/dev/null || [ -x "$$($(GO) env GOPATH)/bin/versitygw" ] || \
		$(GO) install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW)
	GO=$(GO) ./deploy/gitea/install.sh

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

clean:
	rm -rf bin runners/build deploy/build
