#!/bin/sh
# Installs the opa binary the Rego tests and benchmarks compare against into
# the directory given (default ./bin), unless it is there already.
set -eu
dir=${1:-$(dirname "$0")/../bin}
version=v1.22.4
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
if [ -x "$dir/opa" ] && "$dir/opa" version 2>/dev/null | grep -q "^Version: ${version#v}$"; then
	exit 0
fi
GOBIN="$dir" GOFLAGS=-mod=mod go install "github.com/open-policy-agent/opa@$version"
