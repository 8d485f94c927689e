# runbox — see README.md.
GO ?= go
# The S3 server the file-store tests run against (Apache-2.0).
VERSITYGW ?= v1.8.0

.PHONY: run test test-e2e-kubernetes build images deploy-images k8s-images deps test-deps versitygw vet bench clean generate e2b-sdk-tests

## run: build what is missing and start the service on the embedded default
run: deps images build
	./bin/api

# The end-to-end tests that run a second time with sandboxes under gVisor.
RUNSC_TESTS = ^(TestContainment|TestEgress|TestRecycledSandbox|TestMCP|TestREST|TestExecutorCrash|TestExecutorShutdown|TestEmbedded|TestExecutorShutdownLetsRunsFinish|TestPoolForNewConversations)$$

# The packages whose tests start the test cluster (deploy/k8s-cluster).
# They run after the others, never beside them: kube-router, the
# cluster's NetworkPolicy firewall, rewrites iptables' whole filter table
# from a copy it read moments before (cloudnativelabs/kube-router#1248),
# so a rule Docker adds in between (a new network's, docker-compose's) is
# lost and that network's containers cannot reach each other.
CLUSTER_PKGS = ./deploy/k8s-cluster ./deploy/kubernetes ./internal/sandbox/kubernetes

# The end-to-end tests that run a second time with sandboxes as pods of the
# test cluster (deploy/k8s-cluster): core workflow, kept state, egress,
# previews, containment, reaping.
K8S_TESTS = ^(TestMCP|TestREST|TestKeptState|TestKeptStateCancel|TestEgress|TestPreview|TestContainment|TestDeadPeer|TestExecutorCrash)$$

# The containment and egress tests that run once more on the test cluster
# with the sandbox pods under gVisor (the RuntimeClass runsc); the whole
# K8S_TESTS pass passes so too (E2E_K8S_RUNTIME_CLASS=runsc
# make test-e2e-kubernetes: 672 s here), more than CI's 90 minutes leave.
K8S_RUNSC_TESTS = ^(TestContainment|TestEgress)$$

## test: every test: unit, and integration against real Redis and Docker;
## then the containment, recycling and core end-to-end tests under gVisor;
## then the test cluster's packages and the end-to-end pass on it
test: test-deps images
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 60m $$($(GO) list ./... | grep -vxF "$$($(GO) list $(CLUSTER_PKGS))")
	SANDBOX_RUNTIME=runsc $(GO) test -race -count=1 -timeout 30m -run '$(RUNSC_TESTS)' ./e2e
	$(GO) test -race -count=1 -timeout 40m $(CLUSTER_PKGS)
	E2E_ENGINE=kubernetes $(GO) test -race -count=1 -timeout 40m -run '$(K8S_TESTS)' ./e2e
	E2E_ENGINE=kubernetes E2E_K8S_RUNTIME_CLASS=runsc $(GO) test -race -count=1 -timeout 30m -run '$(K8S_RUNSC_TESTS)' ./e2e

## test-e2e-kubernetes: the end-to-end tests above with SANDBOX_ENGINE=kubernetes,
## against the single-node cluster of deploy/k8s-cluster (make test-deps);
## E2E_K8S_RUNTIME_CLASS=runsc runs the sandbox pods under gVisor
test-e2e-kubernetes: test-deps images
	E2E_ENGINE=kubernetes $(GO) test -race -count=1 -timeout 40m -run '$(K8S_TESTS)' ./e2e

## bench: start the service on a real redis-server and Docker, measure it
## against plain-Docker baselines, print the table (also in var/bench.md);
## then the Kubernetes engine on the test cluster: a pod's create to its
## agent's hello (p50/p95), a warm print(1) over the API server beside the
## same agent attached through Docker, and run_code's print(1) through the
## whole service on each engine, same run (var/bench-kubernetes.txt)
bench: images build
	@mkdir -p var
	$(GO) run ./cmd/bench -bin bin -out var/bench.md
	GO=$(GO) ./deploy/k8s-cluster/install.sh
	$(GO) test -run '^$$' -bench 'StartToHello|WarmPrint' -benchtime 20x ./internal/sandbox/kubernetes | tee var/bench-kubernetes.txt
	$(GO) test -run '^$$' -bench Engines -benchtime 30x -timeout 30m ./e2e | tee -a var/bench-kubernetes.txt

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

## k8s-images: what deploy/kubernetes runs: deploy-images' and runbox-versitygw
k8s-images: deps versitygw
	./deploy/build.sh kubernetes

## deps: install what the machine lacks (apt, when root or with sudo)
deps:
	./deploy/deps.sh run

## test-deps: what the integration tests run against besides Docker:
## redis-server, chromium, compose (apt), versitygw and Gitea (Go modules),
## and a single-node Kubernetes (deploy/k8s-cluster: Go modules and apt)
test-deps: versitygw
	./deploy/deps.sh test
	GO=$(GO) ./deploy/gitea/install.sh
	GO=$(GO) ./deploy/k8s-cluster/install.sh

## versitygw: the S3 server of the file-store tests and of deploy/kubernetes
versitygw:
	@command -v versitygw >/dev/null || [ -x "$$($(GO) env GOPATH)/bin/versitygw" ] || \
		$(GO) install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW)

## generate: docs/openapi.yaml and the REST client generated from it
## (internal/api/apiclient), from the api's route table; the E2B control
## plane's client (internal/e2b/e2bclient) from docs/e2b-openapi.yaml; the
## E2B daemon's services (internal/e2b/envdpb) from internal/e2b/proto
generate:
	$(GO) generate ./internal/api ./internal/e2b ./internal/e2b/envdpb

# E2B's own tests of its Python SDK that docs/e2b.md reports, and the
# Python that runs them (Debian's, which sees Debian's packages).
E2B_PYTHON ?= /usr/bin/python3
E2B_SDK_TESTS = tests/sync/sandbox_sync/commands tests/sync/sandbox_sync/files tests/sync/sandbox_sync/pty \
	tests/sync/sandbox_sync/test_create.py tests/sync/sandbox_sync/test_kill.py \
	tests/sync/sandbox_sync/test_connect.py tests/sync/sandbox_sync/test_timeout.py tests/sync/api_sync

## e2b-sdk-tests: run E2B's own SDK tests (docs/e2b.md) from a checkout of
## its Python SDK against a started service: make e2b-sdk-tests
## E2B_SDK=<E2B>/packages/python-sdk E2B_BASE=http://localhost:8080
## E2B_API_KEY=<token> (with the SDK importable: PYTHONPATH, docs/e2b.md)
e2b-sdk-tests:
	@test -n "$(E2B_SDK)" -a -n "$(E2B_BASE)" -a -n "$(E2B_API_KEY)" || { echo "set E2B_SDK, E2B_BASE and E2B_API_KEY"; exit 2; }
	cd $(E2B_SDK) && E2B_API_URL=$(E2B_BASE)/e2b E2B_SANDBOX_URL=$(E2B_BASE)/e2b E2B_API_KEY=$(E2B_API_KEY) \
		E2B_VALIDATE_API_KEY=false $(E2B_PYTHON) -m pytest -p no:cacheprovider -rA -q $(E2B_SDK_TESTS)

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

clean:
	rm -rf bin runners/build deploy/build
