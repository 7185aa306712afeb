#!/bin/sh
# Installs what bench/gateway_test.go and bench/gatewaytls_test.go compare the
# gateway with and load it by, from Debian, unless present: nginx (reverse
# proxy, TLS terminator), wrk (HTTP/1.1 load) and h2load from nghttp2-client
# (HTTP/2 load).
set -eu
missing=""
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing="$missing nginx-light"
command -v wrk >/dev/null 2>&1 || missing="$missing wrk"
command -v h2load >/dev/null 2>&1 || missing="$missing nghttp2-client"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "install-bench-tools: need$missing; run as root or apt-get install -y$missing" >&2
	exit 1
fi
apt-get update -qq
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
