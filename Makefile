# runbox — see README.md.
GO ?= go

.PHONY: run test build images vet bench clean

## run: build what is missing and start the service on the embedded default
run: images build
	./bin/api

## test: every test: unit, and integration against real Redis and Docker
test: images
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 60m ./...

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
images:
	./runners/build.sh

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

clean:
	rm -rf bin runners/build
