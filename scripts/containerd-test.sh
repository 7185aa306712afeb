#!/usr/bin/env bash
# Starts or stops a private containerd for the container tests, without
# systemd: its own socket, root and state directories and configuration
# under one temporary directory. Installs containerd and runc from Debian
# when they are missing, and busybox and iproute2, which the network tests
# and the relay's end-to-end test (network namespaces, veths) need.
#
#   scripts/containerd-test.sh start DIR   # prints the socket path; DIR is created
#   scripts/containerd-test.sh stop DIR    # stops it and removes DIR
#   scripts/containerd-test.sh run CMD...  # start, run CMD with BERTH_TEST_CONTAINERD
#                                          # and BERTH_REQUIRE_CONTAINERD=1, stop
set -euo pipefail

cmd=${1:-}
if [ "$cmd" = run ]; then
	shift
	[ $# -gt 0 ] || { echo "usage: $0 run CMD..." >&2; exit 2; }
	self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
	rundir=$(mktemp -d /tmp/berth-containerd.XXXXXX)
	trap '"$self" stop "$rundir"' EXIT
	sock=$("$self" start "$rundir")
	echo "containerd for the container tests: $sock" >&2
	export BERTH_TEST_CONTAINERD="$sock" BERTH_REQUIRE_CONTAINERD=1
	set +e
	"$@"
	rc=$?
	set -e
	exit $rc
fi
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR | run CMD..." >&2; exit 2; }

install_missing() {
	local missing=()
	command -v containerd >/dev/null 2>&1 || missing+=(containerd)
	command -v runc >/dev/null 2>&1 || missing+=(runc)
	[ -x /bin/busybox ] || command -v busybox >/dev/null 2>&1 || missing+=(busybox-static)
	command -v ip >/dev/null 2>&1 || missing+=(iproute2)
	if [ ${#missing[@]} -gt 0 ]; then
		echo "containerd-test.sh: installing ${missing[*]} from Debian" >&2
		local sudo_cmd=""
		if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
		$sudo_cmd apt-get update >&2
		DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y --no-install-recommends "${missing[@]}" >&2
	fi
}

case "$cmd" in
start)
	install_missing
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	sock="$dir/containerd.sock"
	cat >"$dir/config.toml" <<CONF
version = 2
root = "$dir/root"
state = "$dir/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[debug]
  level = "warn"
[metrics]
  address = ""
CONF
	# Its own session: a Ctrl-C in the terminal that started it (make run)
	# reaches the caller, which stops the containers before containerd.
	setsid containerd --config "$dir/config.toml" >"$dir/containerd.log" 2>&1 &
	echo $! >"$dir/containerd.pid"
	for _ in $(seq 1 100); do
		if [ -S "$sock" ] && ctr --address "$sock" version >/dev/null 2>&1; then
			echo "$sock"
			exit 0
		fi
		kill -0 "$(cat "$dir/containerd.pid")" 2>/dev/null || break
		sleep 0.1
	done
	echo "containerd-test.sh: containerd did not start; its log:" >&2
	cat "$dir/containerd.log" >&2 || true
	exit 1
	;;
stop)
	[ -d "$dir" ] || exit 0
	sock="$dir/containerd.sock"
	# Tasks left by a failed test: kill them so their shims exit and the
	# mounts under the root directory can be removed.
	if [ -S "$sock" ]; then
		for ns in $(ctr --address "$sock" namespaces list -q 2>/dev/null); do
			for t in $(ctr --address "$sock" -n "$ns" tasks list -q 2>/dev/null); do
				ctr --address "$sock" -n "$ns" tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
				ctr --address "$sock" -n "$ns" tasks delete -f "$t" >/dev/null 2>&1 || true
			done
			for c in $(ctr --address "$sock" -n "$ns" containers list -q 2>/dev/null); do
				ctr --address "$sock" -n "$ns" containers delete "$c" >/dev/null 2>&1 || true
			done
		done
	fi
	if [ -f "$dir/containerd.pid" ]; then
		pid=$(cat "$dir/containerd.pid")
		# Only the containerd of this directory: the pid may be another process's by now.
		if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--config $dir/config.toml"; then
			kill -TERM "$pid" 2>/dev/null || true
			for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	# Leftover overlay mounts under the root directory block its removal.
	{ grep -o " $dir/[^ ]*" /proc/self/mounts || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
	rm -rf "$dir"
	;;
*)
	echo "usage: $0 start|stop DIR" >&2
	exit 2
	;;
esac
