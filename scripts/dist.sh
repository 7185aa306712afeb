#!/usr/bin/env bash
# Builds Berth's release artifacts (docs/operating.md section 8): every binary of
# the repository for each platform, static (CGO_ENABLED=0) and reproducible
# (-trimpath, no VCS stamp, empty build id), with VERSION stamped into
# internal/version; one tar.gz per platform with normalised owners, modes and
# times; and SHA256SUMS over every file. Same sources and VERSION, same bytes.
#
# Environment: VERSION (default 0.0.0-dev), DIST_OUT (default dist),
# DIST_PLATFORMS (default "linux/amd64 linux/arm64"), DIST_PKGS (default every
# command operators run), GO (default go). DIST_LIST=1 prints the packages and
# builds nothing.
set -euo pipefail
GO=${GO:-go}
VERSION=${VERSION:-0.0.0-dev}
OUT=${DIST_OUT:-dist}
PLATFORMS=${DIST_PLATFORMS:-linux/amd64 linux/arm64}
# What operators run: the commands under cmd/ except the test driver
# (berth-plugin-fake). The examples (the hello app, the provider and the
# runner) and the conformance suite's broken providers are for authors and
# tests, built from the source tree, and do not ship.
if [ -z "${DIST_PKGS:-}" ]; then
  DIST_PKGS=$("$GO" list -f '{{if eq .Name "main"}}./{{.ImportPath}}{{end}}' ./cmd/... |
    sed 's#^\./github.com/berthhq/berth/#./#' | grep -v '^\./cmd/berth-plugin-fake$' | tr '\n' ' ')
fi
PKGS=$DIST_PKGS
if [ -n "${DIST_LIST:-}" ]; then
  printf '%s\n' $PKGS
  exit 0
fi
LDFLAGS="-s -w -buildid= -X github.com/berthhq/berth/internal/version.Version=${VERSION}"

case "$VERSION" in
  *[!A-Za-z0-9.+-]*|'') echo "dist.sh: VERSION '$VERSION' is not a plain version string" >&2; exit 2 ;;
esac
rm -rf "$OUT"
mkdir -p "$OUT"
for p in $PLATFORMS; do
  os=${p%/*} arch=${p#*/}
  name="berth-${VERSION}-${os}-${arch}"
  mkdir -p "$OUT/$name"
  # shellcheck disable=SC2086 # PKGS is a list of patterns
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch "$GO" build -trimpath -buildvcs=false -ldflags "$LDFLAGS" -o "$OUT/$name/" $PKGS
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --mode='u+rwX,go+rX,go-w' \
    -C "$OUT" -cf - "$name" | gzip -n -9 > "$OUT/$name.tar.gz"
done
(cd "$OUT" && find . -type f ! -name SHA256SUMS | sed 's#^\./##' | LC_ALL=C sort | xargs sha256sum > SHA256SUMS)
echo "dist.sh: $(wc -l < "$OUT/SHA256SUMS") files in $OUT; checksums in $OUT/SHA256SUMS"
