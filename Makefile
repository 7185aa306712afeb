# Berth: make build | run | test | bench | generate | lint
GO      ?= go
# VERSION is stamped into every binary (internal/version, --version, the
# plugins' Describe); release builds pass VERSION=MAJOR.MINOR.PATCH.
VERSION ?= 0.0.0-dev
LDFLAGS := -X github.com/berthhq/berth/internal/version.Version=$(VERSION)
BIN     := $(CURDIR)/bin
HTTPBIN := github.com/mccutchen/go-httpbin/v2/cmd/go-httpbin

.PHONY: build run run-bins test test-containers bench generate lint bundles clean wasm modules dist opa ui-assets

# The container tests: real containerd (started by scripts/containerd-test.sh,
# installed from Debian when missing), network namespaces and nftables.
CONTAINER_PKGS := ./nodeplugins/containerd/... ./nodeplugins/nftables/...

# Generated WebAssembly modules (not committed): the default route compiler
# berthd embeds, and the AssemblyScript example policy (needs Node.js and npm).
ROUTES_WASM := core/routes/default_routes.wasm
AS_WASM     := examples/policies/require-digest-as/policy.wasm

# axe-core for the dashboard's browser test (e2e/ui), fetched from npm and checked against
# its pinned SHA-256 (e2e/ui/testdata/axe/MANIFEST); not committed.
AXE := e2e/ui/testdata/axe/axe.min.js
$(AXE): e2e/ui/testdata/axe/MANIFEST scripts/ui-assets.sh
	./scripts/ui-assets.sh e2e/ui/testdata/axe/MANIFEST e2e/ui/testdata/axe

## modules: the generated WebAssembly modules (rebuilt when their sources change)
modules: $(ROUTES_WASM) $(AS_WASM)

$(ROUTES_WASM): $(shell find examples/routes sdk/wasm abi/wasm abi/routes -name '*.go' -not -name '*_test.go') scripts/build-wasm.sh
	./scripts/build-wasm.sh examples/routes $@

$(AS_WASM): $(wildcard examples/policies/require-digest-as/assembly/*.ts) examples/policies/require-digest-as/package-lock.json
	./examples/policies/require-digest-as/build.sh

## build: every binary into ./bin (the tools only the tests and benchmarks use,
## OPA and the AssemblyScript policy among them, are test's and bench's prerequisites)
build: $(ROUTES_WASM)
	@mkdir -p $(BIN)
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

# What make run starts: berthd with its gateway, the CLI, the agent and the
# runtime driver, plus the containerd driver and the node network with
# RUNTIME=containerd only (they are the slowest to compile); nothing else.
RUN_CMDS = ./cmd/berth ./cmd/berthd ./cmd/berth-agent ./cmd/berth-plugin-gateway ./cmd/berth-plugin-process \
	$(if $(filter containerd,$(RUNTIME)),./cmd/berth-plugin-containerd ./cmd/berth-plugin-nftables)
run-bins: $(ROUTES_WASM)
	@mkdir -p $(BIN)
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ $(RUN_CMDS)

## opa: the opa binary the Rego tests and benchmarks compare against (built from source, slowly, once)
opa:
	./scripts/install-opa.sh $(BIN)

## dist: release artifacts under ./dist (docs/operating.md section 8): every binary for
## linux/amd64 and linux/arm64, static and reproducible, VERSION stamped, one tar.gz per
## platform and SHA256SUMS
dist: $(ROUTES_WASM)
	VERSION=$(VERSION) GO=$(GO) ./scripts/dist.sh

## bundles: the example apps as bundle directories under ./build/bundles
bundles:
	@mkdir -p build/bundles/hello build/bundles/httpbin
	CGO_ENABLED=0 $(GO) build -o build/bundles/hello/hello ./examples/apps/hello
	CGO_ENABLED=0 $(GO) build -o build/bundles/httpbin/go-httpbin $(HTTPBIN)

## run: berthd + one agent on embedded defaults, deploys hello and httpbin; Ctrl-C stops everything.
## RUNTIME=containerd runs them as containers (a private containerd under .berth-run)
## The data under .berth-run is kept between runs; FRESH=1 starts from an empty one.
RUNTIME ?= process
FRESH ?=
run: run-bins bundles
	BERTH_RUNTIME=$(RUNTIME) BERTH_RUN_FRESH=$(FRESH) ./scripts/run-local.sh

# The S3 server the backup tests upload to (a real S3 API with signature checks).
VERSITYGW := $(shell $(GO) env GOPATH)/bin/versitygw
$(VERSITYGW):
	$(GO) install github.com/versity/versitygw/cmd/versitygw@v1.8.0

# The OCI distribution-spec conformance program core/registry's tests run
# against /v2, and crane, the registry client of the image tests.
OCI_CONFORMANCE := $(shell $(GO) env GOPATH)/bin/conformance
$(OCI_CONFORMANCE):
	$(GO) install github.com/opencontainers/distribution-spec/conformance@v0.0.0-20260831232431-97274622c111
CRANE := $(shell $(GO) env GOPATH)/bin/crane
$(CRANE):
	$(GO) install github.com/google/go-containerregistry/cmd/crane@v0.22.1

# The external proxy plugins/caddy drives in its tests (compiles slowly, once).
CADDY := $(shell $(GO) env GOPATH)/bin/caddy
$(CADDY):
	$(GO) install github.com/caddyserver/caddy/v2/cmd/caddy@v2.11.9

# The ACME CA the certificate tests order from (internal/pebbletest), and
# the DNS server those tests point its -dnsserver at.
PEBBLE := $(shell $(GO) env GOPATH)/bin/pebble
$(PEBBLE):
	$(GO) install github.com/letsencrypt/pebble/v2/cmd/pebble@v2.10.3
PEBBLE_CHALLTESTSRV := $(shell $(GO) env GOPATH)/bin/pebble-challtestsrv
$(PEBBLE_CHALLTESTSRV):
	$(GO) install github.com/letsencrypt/pebble/v2/cmd/pebble-challtestsrv@v2.10.3

# The test packages that take longest, longest first. go test starts test
# binaries strictly in the order the packages are named (at most -p, by
# default the number of cores, at a time), and ./... names them in path
# order, which started the longest package (e2e) about halfway through and
# left it running alone at the end. Naming the long ones first lets the
# short packages fill in beside them; ./... then adds every other package
# once. Keep this list in the order of the per-package seconds that
# go test prints (longest first) when packages grow or shrink.
SLOW_TEST_PKGS := ./e2e ./core/api ./e2e/corestore ./core/store ./e2e/images ./core/registry \
	./e2e/edge ./core/placement ./host/wasm/interrupt ./plugins/corestore ./e2e/backups \
	./nodeplugins/containerd ./plugins/corestore/backup ./core/session

## test: everything CI runs (builds the binaries the end-to-end tests start;
## starts a private containerd for the container tests and stops it after)
test: build opa $(AS_WASM) $(AXE) $(VERSITYGW) $(OCI_CONFORMANCE) $(CRANE) $(CADDY) $(PEBBLE) $(PEBBLE_CHALLTESTSRV)
	./scripts/install-postgres.sh
	./scripts/install-knot.sh
	./scripts/install-chromium.sh
	./scripts/containerd-test.sh run env BERTH_BIN_DIR=$(BIN) $(GO) test -race -count=1 -timeout 35m $(SLOW_TEST_PKGS) ./...

## test-containers: only the container tests (containerd driver, nftables network)
test-containers: build
	./scripts/containerd-test.sh run env BERTH_BIN_DIR=$(BIN) $(GO) test -race -count=1 -timeout 10m $(CONTAINER_PKGS)
	./scripts/containerd-test.sh run env BERTH_BIN_DIR=$(BIN) $(GO) test -race -count=1 -timeout 10m -run Container ./agent/reconcile/

## bench: benchmarks, one figure per line (bench/opa, its own Go module so
## OPA stays out of go.mod, compares Berth's modules with OPA side by side)
bench: build opa $(AS_WASM) $(CADDY) $(PEBBLE)
	./scripts/install-bench-tools.sh
	./scripts/install-knot.sh
	./scripts/install-postgres.sh
	./scripts/containerd-test.sh run env BERTH_BIN_DIR=$(BIN) $(GO) test -run '^$$' -bench . -benchmem -count=1 -timeout 60m ./... | ./scripts/bench-figures.sh
	cd bench/opa && BERTH_BIN_DIR=$(BIN) $(GO) test -run '^$$' -bench . -count=1 -timeout 30m . | ../../scripts/bench-figures.sh

## ui-assets: the dashboard's vendored htmx and uPlot (committed under core/ui/assets/vendor),
## fetched from npm at the versions and SHA-256 digests of core/ui/assets/MANIFEST
ui-assets:
	./scripts/ui-assets.sh

## generate: protobuf code (committed)
generate:
	./abi/proto/generate.sh

## wasm: the example policies and route compiler as WebAssembly modules under ./build/wasm
wasm: modules
	@mkdir -p build/wasm
	for p in require-digest require-labels cap-replicas domain-zones require-health-check require-secret-refs; do \
	  ./scripts/build-wasm.sh examples/policies/$$p build/wasm/$$p.wasm || exit 1; done
	cp $(AS_WASM) build/wasm/require-digest-as.wasm
	./scripts/build-wasm.sh examples/routes-internal build/wasm/routes-internal.wasm

## lint: go vet and gofmt
lint: modules
	$(GO) vet ./...
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

clean:
	rm -rf bin build dist .berth-run $(ROUTES_WASM) $(AS_WASM) $(AXE)
