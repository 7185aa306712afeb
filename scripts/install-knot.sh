#!/bin/sh
# Installs the authoritative DNS server the DNS provider's tests write to
# (internal/knottest): knot 3.2.6 and its utilities (keymgr, kdig) from
# Debian, unless knotd is present already.
set -eu
if command -v knotd >/dev/null 2>&1 || [ -x /usr/sbin/knotd ]; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "install-knot: need knot knot-dnsutils; run as root or apt-get install -y knot knot-dnsutils" >&2
	exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq knot knot-dnsutils
