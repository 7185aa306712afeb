#!/usr/bin/env bash
# Turns `go test -bench` output into one "name value unit" figure per line.
set -euo pipefail
awk '/^Benchmark/ {
  name=$1; sub(/-[0-9]+$/, "", name)
  for (i = 3; i < NF; i += 2) print name, $i, $(i+1)
}
/^(FAIL|panic)/ { print; failed=1 }
END { exit failed }'
