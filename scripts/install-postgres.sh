#!/bin/sh
# Installs Debian's PostgreSQL 15 (server, pg_dump, pg_restore) for the tests
# that start a real PostgreSQL (internal/pgtest) when it is missing. The
# package's own cluster is not used: tests initdb their own directories.
set -eu
[ -x /usr/lib/postgresql/15/bin/postgres ] && [ -x /usr/lib/postgresql/15/bin/pg_dump ] && exit 0
sudo_cmd=""
if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
echo "install-postgres.sh: installing postgresql-15 from Debian" >&2
$sudo_cmd apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends postgresql-15 postgresql-client-15 >&2
