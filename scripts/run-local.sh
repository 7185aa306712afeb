#!/usr/bin/env bash
# Runs Berth's main job on one machine with embedded defaults: berthd (embedded
# store, gateway plugin), one enrolled agent with the process driver, and two
# services (examples/apps/hello and go-httpbin) routed through the gateway.
# Runs in the foreground; Ctrl-C stops every process it started. The run
# directory (berthd's store, the enrolled agent, the volumes) is kept, so the
# next run starts where this one stopped: the same node, token and services.
# BERTH_RUN_FRESH=1 (make run FRESH=1) empties it first, and then Ctrl-C also
# deletes the services before stopping. Expects `make build bundles` to have
# run (make run does).
#
# BERTH_RUNTIME=containerd (make run RUNTIME=containerd) runs the services as
# containers instead: a private containerd under the run directory (installed
# from Debian when missing), the agent on the containerd driver with the
# nftables node network (subnet BERTH_WORKLOAD_SUBNET, default 10.213.250.0/24,
# on bridge berthrun0, torn down at the end), and both apps built into images
# and pushed with `berth image push`.
#
# A run that could not finish its cleanup (killed, or the machine's session
# ended) leaves processes behind; the next run in the same directory finds them
# (pid files under RUN_DIR/pids, and the processes whose command line or
# working directory names RUN_DIR, each checked before it is stopped) and stops
# them before it starts. BERTH_BIN_DIR (default ./bin) holds the binaries.
set -euo pipefail
cd "$(dirname "$0")/.."

RUN_DIR=${BERTH_RUN_DIR:-$PWD/.berth-run}
API=${BERTH_LISTEN:-127.0.0.1:7070}
GATEWAY=${BERTH_GATEWAY_LISTEN:-127.0.0.1:8080}
BIN=${BERTH_BIN_DIR:-$PWD/bin}
BIN=$(cd "$BIN" && pwd)
RUNTIME=${BERTH_RUNTIME:-process}
FRESH=${BERTH_RUN_FRESH:-}
WORKLOAD_SUBNET=${BERTH_WORKLOAD_SUBNET:-10.213.250.0/24}
start=$(date +%s.%N)
case "$RUNTIME" in process|containerd) ;; *) echo "error: BERTH_RUNTIME must be process or containerd" >&2; exit 2 ;; esac

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

RUN_DIR=$(mkdir -p "$RUN_DIR" && cd "$RUN_DIR" && pwd)
PID_DIR=$RUN_DIR/pids

# ours PID: whether process PID is one a run in RUN_DIR started, so that a pid
# reused by an unrelated process is never stopped. berthd, the agent and the
# plugins run a binary of BIN with an argument under RUN_DIR (--data-dir,
# --state-dir); a process workload is a session leader without a terminal
# working under RUN_DIR (a shell someone opened there has a terminal).
ours() {
  local exe args stat
  exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
  args=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) || return 1
  case "$exe" in "$BIN"/*)
    case " $args" in *" $RUN_DIR"/*|*"=$RUN_DIR"/*) return 0 ;; esac ;;
  esac
  case "$(readlink "/proc/$1/cwd" 2>/dev/null)/" in "$RUN_DIR"/*) ;; *) return 1 ;; esac
  stat=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  # After the command name: state ppid pgrp session tty_nr ...
  set -- $1 $stat
  [ "$1" = "$5" ] && [ "$6" = 0 ]
}

# leftovers: the pids of processes of RUN_DIR's runs still running.
leftovers() {
  local d
  for d in /proc/[0-9]*; do
    [ "${d#/proc/}" != "$$" ] && ours "${d#/proc/}" && echo "${d#/proc/}"
  done
  return 0
}

# stop_run stops everything a run in RUN_DIR started, this one or an earlier
# one that could not finish: berthd and the agent from their pid files (TERM,
# so they stop in order), the private containerd and node network, then any
# process left (the gateway outlives berthd and workloads outlive the agent by
# design, so that a restart of either keeps apps served).
stop_run() {
  local f pid alive live=()
  for f in "$PID_DIR/agent.pid" "$PID_DIR/berthd.pid"; do
    pid=$(cat "$f" 2>/dev/null) || continue
    if ours "$pid"; then kill -TERM "$pid" 2>/dev/null && live+=("$pid"); fi
  done
  for _ in $(seq 1 150); do # at most 15 s
    alive=
    for pid in "${live[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  if [ -e "$RUN_DIR/containerd/containerd.pid" ]; then
    # The node network (guard, tables, bridge, any namespace left), then the
    # private containerd and any container the deletes missed.
    "$BIN/berth-plugin-nftables" teardown --state-dir "$RUN_DIR/agent/network" --bridge berthrun0 \
      --subnet "$WORKLOAD_SUBNET" || true
    ./scripts/containerd-test.sh stop "$RUN_DIR/containerd" || true
  fi
  # What is left is killed, berthd and the agent first: one still stopping (slow on a loaded
  # machine) would start again a gateway or a workload killed before it. A few rounds, so
  # nothing started meanwhile survives.
  local left round
  for round in 1 2 3 4 5; do
    for f in "$PID_DIR/agent.pid" "$PID_DIR/berthd.pid"; do
      pid=$(cat "$f" 2>/dev/null) || continue
      if ours "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
    done
    left=$(leftovers)
    [ -z "$left" ] && break
    for pid in $left; do
      # A workload leads its own process group: stop the group.
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    done
    sleep 0.2
  done
  rm -f "$PID_DIR"/*.pid
}

left=$(leftovers | tr '\n' ' ')
if [ -n "$left" ] || [ -e "$RUN_DIR/containerd/containerd.pid" ]; then
  say "stopping what an earlier run in $RUN_DIR left running (pids ${left:-none}; containers if any)"
  stop_run
fi

for p in "$API" "$GATEWAY"; do
  if (exec 3<>"/dev/tcp/${p%:*}/${p##*:}") 2>/dev/null; then
    die "$p is already in use; stop what listens there or set BERTH_LISTEN / BERTH_GATEWAY_LISTEN"
  fi
done

if [ -n "$FRESH" ]; then
  rm -rf "$RUN_DIR"
elif [ -d "$RUN_DIR/berthd" ]; then
  say "keeping the data of the last run in $RUN_DIR (make run FRESH=1 starts empty)"
fi
mkdir -p "$RUN_DIR"
chmod 700 "$RUN_DIR"

pids=()
cleanup() {
  # A second Ctrl-C (or TERM) while stopping is ignored, and so are they in
  # the commands run from here on, or the gateway and the apps would be left.
  trap '' INT TERM
  trap - EXIT
  echo
  say "stopping"
  if [ -n "$FRESH" ] && [ -n "${BERTH_TOKEN:-}" ]; then
    "$BIN/berth" delete service hello || true
    "$BIN/berth" delete service httpbin || true
    # Deletion is asynchronous: the slots stop and are removed against the
    # node's receipts (a few sweeps), then the services disappear.
    say "waiting for the services' workloads to stop (at most 60 s)"
    for _ in $(seq 1 300); do
      n=$("$BIN/berth" get workloads -o json 2>/dev/null | grep -c '"id"' || true)
      [ "${n:-0}" = 0 ] && break
      sleep 0.2
    done
  fi
  stop_run
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  say "stopped; logs and state are in $RUN_DIR"
}
trap cleanup EXIT
trap 'exit 0' INT TERM

say "starting berthd (API https://$API, gateway http://$GATEWAY, data $RUN_DIR/berthd)"
# setsid: Ctrl-C reaches only this script, which then deletes the services
# through the still-running berthd before it stops the processes in order.
setsid "$BIN/berthd" --data-dir "$RUN_DIR/berthd" --listen "$API" --gateway-listen "$GATEWAY" \
  --runner-transport >"$RUN_DIR/berthd.log" 2>&1 &
pids+=($!)
mkdir -p "$PID_DIR"
echo "$!" >"$PID_DIR/berthd.pid"
# berthd serves TLS with a self-signed certificate it generated; curl trusts
# exactly that certificate, and the CLI and agent pin its fingerprint.
CERT="$RUN_DIR/berthd/tls/server.crt"
ready() { [ -s "$CERT" ] && curl -fsS --cacert "$CERT" "https://$API/readyz" >/dev/null 2>&1; }
for _ in $(seq 1 300); do
  [ -s "$RUN_DIR/berthd/admin-token" ] && ready && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$RUN_DIR/berthd.log" >&2; die "berthd exited"; }
  sleep 0.1
done
ready || die "berthd did not become ready; see $RUN_DIR/berthd.log"
export BERTH_SERVER="https://$API" BERTH_TOKEN BERTH_FINGERPRINT
BERTH_TOKEN=$(cat "$RUN_DIR/berthd/admin-token")
BERTH_FINGERPRINT=$(cat "$RUN_DIR/berthd/server-fingerprint")
say "server certificate fingerprint $BERTH_FINGERPRINT"
say "dashboard https://$API/ui/ (log in with the token in $RUN_DIR/berthd/admin-token)"

if [ -s "$RUN_DIR/agent/agent.db" ]; then
  # The agent dials the address it enrolled with; after a change of
  # BERTH_LISTEN it would redial the old one forever.
  if [ -s "$RUN_DIR/agent.server" ]; then
    enrolled=$(cat "$RUN_DIR/agent.server")
  else # a run directory of an older make run: the URL is in the agent's store
    enrolled=https://$API
    grep -aqF "https://$API" "$RUN_DIR/agent/agent.db"* 2>/dev/null || enrolled="another address"
  fi
  [ "$enrolled" = "https://$API" ] || die "the node in $RUN_DIR/agent was enrolled with berthd at $enrolled, not https://$API: run with that BERTH_LISTEN, or make run FRESH=1 to start empty"
  say "the node of the last run is enrolled already"
else
  say "enrolling a node"
  join=$("$BIN/berth" join-token create -o json)
  token=$(printf '%s' "$join" | sed -n 's/.*"token": *"\([^"]*\)".*/\1/p')
  "$BIN/berth-agent" enroll --server "https://$API" --join-token "$token" --fingerprint "$BERTH_FINGERPRINT" \
    --data-dir "$RUN_DIR/agent" --label demo=true
  echo "https://$API" >"$RUN_DIR/agent.server"
fi
if [ "$RUNTIME" = containerd ]; then
  say "starting a private containerd under $RUN_DIR/containerd"
  BERTH_CONTAINERD_ADDRESS=$(./scripts/containerd-test.sh start "$RUN_DIR/containerd")
  export BERTH_CONTAINERD_ADDRESS
fi
agent_net=()
if [ "$RUNTIME" = containerd ]; then agent_net=(--workload-subnet "$WORKLOAD_SUBNET" --workload-bridge berthrun0); fi
setsid "$BIN/berth-agent" run --data-dir "$RUN_DIR/agent" --driver "$RUNTIME" "${agent_net[@]}" >"$RUN_DIR/agent.log" 2>&1 &
pids+=($!)
echo "$!" >"$PID_DIR/agent.pid"

# apply_missing NAME FILE applies FILE when the service NAME does not exist yet.
# A service kept from an earlier run is left as the operator last changed it
# (an apply, spec set, rollout undo): applying the example again would undo that,
# and is refused once a runtime spec owns the replica count.
apply_missing() {
  if "$BIN/berth" describe service "$1" >/dev/null 2>&1; then
    say "service $1 exists: leaving it as it is (make run FRESH=1 starts from $2 again)"
  else
    "$BIN/berth" apply -f "$2"
  fi
}

if [ "$RUNTIME" = containerd ]; then
  say "building and pushing images"
  # image_digest APP ENTRYPOINT builds build/bundles/APP into an image, pushes
  # it as bundle APP-image and prints the image digest.
  image_digest() {
    "$BIN/berth" image build "build/bundles/$1" -f "$RUN_DIR/$1.tar" --entrypoint "$2" >&2
    "$BIN/berth" image push "$RUN_DIR/$1.tar" --name "$1-image" -o json |
      sed -n 's/.*"\(sha256:[0-9a-f]\{64\}\)".*/\1/p' | tail -1
  }
  hello_image=$(image_digest hello /app/hello)
  httpbin_image=$(image_digest httpbin /app/go-httpbin)
  [ -n "$hello_image" ] && [ -n "$httpbin_image" ] || die "could not read the pushed image digests"
  say "applying services (runtime containerd)"
  for svc in hello httpbin; do
    image=$hello_image; [ "$svc" = httpbin ] && image=$httpbin_image
    # The same service files, with the container fields instead of the bundle's command.
    sed -e "s|^bundle: .*|bundle: $svc-image\nruntime: containerd\nimage: \"$image\"|" -e '/^command:/d' \
      "examples/services/$svc.yaml" >"$RUN_DIR/$svc.yaml"
    apply_missing "$svc" "$RUN_DIR/$svc.yaml"
  done
else
  say "pushing bundles"
  "$BIN/berth" bundle push build/bundles/hello --name hello
  "$BIN/berth" bundle push build/bundles/httpbin --name httpbin

  say "applying services"
  apply_missing hello examples/services/hello.yaml
  apply_missing httpbin examples/services/httpbin.yaml
fi

say "waiting for hello through the gateway"
ok=
for _ in $(seq 1 600); do
  if out=$(curl -fsS -H 'Host: hello.localhost' "http://$GATEWAY/" 2>/dev/null); then ok=1; break; fi
  kill -0 "${pids[1]}" 2>/dev/null || { tail -20 "$RUN_DIR/agent.log" >&2; die "the agent exited"; }
  sleep 0.1
done
[ -n "$ok" ] || die "hello did not answer within 60 s; see $RUN_DIR/*.log"
elapsed=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
say "hello answered through the gateway (${elapsed} s after start): $out"

cat <<MSG

  Try:
    curl -H 'Host: hello.localhost' http://$GATEWAY/
    curl http://hello.localhost:${GATEWAY##*:}/
    curl -H 'Host: httpbin.localhost' http://$GATEWAY/headers

  The dashboard: https://$API/ui/
    Log in with the admin token: paste the one line of $RUN_DIR/berthd/admin-token
    into the Token field. The browser warns about berthd's self-signed certificate:
    accept it only if its SHA-256 fingerprint has the hex digits of $BERTH_FINGERPRINT.

  The CLI, from another shell:
    export BERTH_SERVER=https://$API BERTH_TOKEN=\$(cat $RUN_DIR/berthd/admin-token)
    export BERTH_FINGERPRINT=\$(cat $RUN_DIR/berthd/server-fingerprint)
    bin/berth get services
    bin/berth get workloads

  A runner (docs/runner-protocol.md section 8), from another shell with the exports above:
    BERTH_RUNNER_REGISTRATION_TOKEN=\$(bin/berth runner enroll-token create --node example-runner -o json | sed -n 's/.*"token": *"\([^"]*\)".*/\1/p') \\
      go run ./examples/runner --data-dir $RUN_DIR/runner --once &
    bin/berth placement set --release hello
    bin/berth operation list

  Admin token: $RUN_DIR/berthd/admin-token
  Logs:        $RUN_DIR/berthd.log, $RUN_DIR/agent.log
  Press Ctrl-C to stop everything.
MSG
wait "${pids[0]}"
