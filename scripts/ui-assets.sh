#!/usr/bin/env bash
# Vendors the dashboard's third-party assets (core/ui/assets/MANIFEST) from
# the npm registry: for each package and version the manifest names, `npm
# pack` fetches the registry's tarball (npm checks the registry's own
# integrity digest), then each named file is taken from it, its SHA-256
# compared with the manifest's, and only then copied into
# core/ui/assets/vendor/. Any mismatch stops the script and leaves the
# vendored file untouched. With --check it fetches and compares but writes
# nothing, and also checks the committed copies.
#
#   scripts/ui-assets.sh [--check] [MANIFEST DIR]
#
# MANIFEST and DIR default to the dashboard's; the browser tests fetch
# axe-core (not committed, not embedded) with e2e/ui/testdata/axe/MANIFEST.
set -euo pipefail
cd "$(dirname "$0")/.."
check=""
[ "${1:-}" = "--check" ] && { check=1; shift; }
MANIFEST=${1:-core/ui/assets/MANIFEST}
VENDOR=${2:-core/ui/assets/vendor}
command -v npm >/dev/null || { echo "ui-assets.sh: npm is needed (apt-get install -y npm)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$VENDOR"
grep -v '^\s*#' "$MANIFEST" | grep -v '^\s*$' | while read -r pkg ver path name sum; do
  dir=$work/$pkg-$ver
  if [ ! -d "$dir" ]; then
    mkdir -p "$dir"
    (cd "$dir" && npm pack --silent "$pkg@$ver" >/dev/null)
    tar -xzf "$dir"/*.tgz -C "$dir"
  fi
  [ -f "$dir/$path" ] || { echo "ui-assets.sh: $pkg@$ver has no $path" >&2; exit 1; }
  got=$(sha256sum "$dir/$path" | cut -d' ' -f1)
  if [ "$got" != "$sum" ]; then
    echo "ui-assets.sh: $pkg@$ver $path has SHA-256 $got, the manifest pins $sum; refusing it" >&2
    exit 1
  fi
  if [ -n "$check" ]; then
    have=$(sha256sum "$VENDOR/$name" 2>/dev/null | cut -d' ' -f1 || true)
    [ "$have" = "$sum" ] || { echo "ui-assets.sh: $VENDOR/$name differs from the manifest" >&2; exit 1; }
  else
    install -m 0644 "$dir/$path" "$VENDOR/$name"
  fi
  echo "ui-assets.sh: $name ($pkg@$ver) sha256 $sum ok"
done
