#!/usr/bin/env bash
# Rebuilds policy.wasm from assembly/index.ts with the pinned AssemblyScript
# compiler (package.json). Needs Node.js and npm; fetches the compiler once.
set -euo pipefail
cd "$(dirname "$0")"
[ -d node_modules/assemblyscript ] || npm ci --no-audit --no-fund --silent
npx --no-install asc assembly/index.ts --outFile "${1:-policy.wasm}" \
  --optimizeLevel 3 --shrinkLevel 1 --runtime stub --noAssert --use abort=
