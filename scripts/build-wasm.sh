#!/usr/bin/env bash
# Builds a Go WebAssembly guest reproducibly: build-wasm.sh PKG_DIR OUT.wasm
# The flags match internal/wasmtest, whose tests check committed modules.
set -euo pipefail
GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 ${GO:-go} build -buildmode=c-shared -trimpath -buildvcs=false \
  -ldflags='-s -w -buildid=' -o "$2" "./$1"
