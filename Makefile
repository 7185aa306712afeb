# Berth: make build | run | test | bench | generate | lint
GO      ?= go
BIN     := $(CURDIR)/bin
HTTPBIN := github.com/mccutchen/go-httpbin/v2/cmd/go-httpbin

.PHONY: build run test bench generate lint bundles clean

## build: every binary into ./bin
build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...

## bundles: the example apps as bundle directories under ./build/bundles
bundles:
	@mkdir -p build/bundles/hello build/bundles/httpbin
	CGO_ENABLED=0 $(GO) build -o build/bundles/hello/hello ./examples/apps/hello
	CGO_ENABLED=0 $(GO) build -o build/bundles/httpbin/go-httpbin $(HTTPBIN)

## run: berthd + one agent on embedded defaults, deploys hello and httpbin; Ctrl-C stops everything
run: build bundles
	./scripts/run-local.sh

## test: everything CI runs (builds the binaries the end-to-end tests start)
test: build
	BERTH_BIN_DIR=$(BIN) $(GO) test -race -count=1 -timeout 15m ./...

## bench: benchmarks, one figure per line
bench: build
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./... | ./scripts/bench-figures.sh

## generate: protobuf code (committed)
generate:
	./abi/proto/generate.sh

## lint: go vet and gofmt
lint:
	$(GO) vet ./...
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

clean:
	rm -rf bin build .berth-run
