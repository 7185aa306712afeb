#!/usr/bin/env bash
# Regenerates the Go code of every .proto under abi/proto. Called by `make generate`.
#
# Pinned tools: protoc from Debian's protobuf-compiler (3.21), protoc-gen-go v1.36.12,
# protoc-gen-go-grpc v1.6.2. Missing plugins are installed into a temporary GOBIN;
# a missing protoc is installed with apt-get.
set -euo pipefail

PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

if ! command -v protoc >/dev/null 2>&1; then
	echo "generate.sh: protoc not found; installing protobuf-compiler" >&2
	sudo_cmd=""
	if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
	$sudo_cmd apt-get update
	$sudo_cmd apt-get install -y protobuf-compiler
fi

# want NAME VERSION prints the path of NAME when it is installed at VERSION.
want() {
	local name="$1" version="$2" path
	for path in "$(command -v "$name" 2>/dev/null || true)" "$(go env GOPATH)/bin/$name"; do
		if [ -n "$path" ] && [ -x "$path" ] && "$path" --version 2>/dev/null | grep -q "${version#v}"; then
			echo "$path"
			return 0
		fi
	done
	return 1
}

tmpbin=""
cleanup() { if [ -n "$tmpbin" ]; then rm -rf "$tmpbin"; fi; }
trap cleanup EXIT

gen_go="$(want protoc-gen-go "$PROTOC_GEN_GO_VERSION" || true)"
gen_go_grpc="$(want protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION" || true)"
if [ -z "$gen_go" ] || [ -z "$gen_go_grpc" ]; then
	tmpbin="$(mktemp -d)"
	if [ -z "$gen_go" ]; then
		GOBIN="$tmpbin" go install "google.golang.org/protobuf/cmd/protoc-gen-go@${PROTOC_GEN_GO_VERSION}"
		gen_go="$tmpbin/protoc-gen-go"
	fi
	if [ -z "$gen_go_grpc" ]; then
		GOBIN="$tmpbin" go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@${PROTOC_GEN_GO_GRPC_VERSION}"
		gen_go_grpc="$tmpbin/protoc-gen-go-grpc"
	fi
fi

mapfile -t protos < <(find . -name '*.proto' | sort)
protoc \
	--plugin=protoc-gen-go="$gen_go" \
	--plugin=protoc-gen-go-grpc="$gen_go_grpc" \
	-I . \
	--go_out=. --go_opt=paths=source_relative \
	--go-grpc_out=. --go-grpc_opt=paths=source_relative \
	"${protos[@]}"
