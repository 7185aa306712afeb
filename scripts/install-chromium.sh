#!/bin/sh
# Installs Debian's chromium for the dashboard's browser tests (e2e/ui, driven
# by chromedp with ExecPath /usr/bin/chromium) when it is missing. The tests
# never download a browser of their own; without this package they fail.
set -eu
[ -x /usr/bin/chromium ] && exit 0
sudo_cmd=""
if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
echo "install-chromium.sh: installing chromium from Debian" >&2
$sudo_cmd apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends chromium >&2
