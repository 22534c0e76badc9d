# Helpers shared by the cross-node test scripts (tests/xnode/*_test.sh), sourced by them.
# xnode_enter N "$@" runs the calling script again as root inside N test hosts (network namespaces
# from scripts/hosts.sh, always cleaned up) and, inside, sets VIPER (the viper binary), TMP (a
# scratch directory removed at exit) and PIDS (processes killed at exit).
# The test hosts share one kernel: UCX would move bulk data by CMA (process_vm_readv) across the
# namespaces, which separate hosts cannot. Everything runs with UCX_TLS=tcp, the transport real
# hosts here use.

XNODE_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=/usr/bin/python3
PIDS=()
source "$XNODE_LIB_DIR/../check.sh"  # pass, failed, check

# xnode_enter HOSTS "$@": outside the hosts, re-executes "$0" in them (never returns); inside,
# sets up VIPER and TMP.
xnode_enter() {
  local hosts=$1 name
  name=$(basename "$0" .sh)
  shift
  if [[ ${1:-} != --inner ]]; then
    local viper=${1:-}
    if [[ -z $viper || ! -x $viper ]]; then
      echo "$name: first argument must be the viper binary (got '${viper}')" >&2
      exit 2
    fi
    if [[ $(id -u) -ne 0 ]]; then
      echo "$name: must run as root (network namespaces)" >&2
      exit 2
    fi
    export VIPER_HOSTS_QUIET=1
    exec "$XNODE_LIB_DIR/../../scripts/hosts.sh" run "$hosts" -- "$0" --inner "$(readlink -f "$viper")"
  fi
  VIPER=$2
  # Scratch on tmpfs when it has room: the 600 MB models, the copies `viper pull` writes (and
  # fsyncs) and the byte-for-byte comparisons would otherwise wait for the disk. On this VM, with
  # TMP on /tmp's disk, test_big spent 58 of its 93 s in three pulls (4-6 s each, the fsync) and
  # three comparisons of 2 x 600 MB (11-18 s each), and `viper publish` read its 600 MB file for 6-7 s
  # (2026-11-26). The checks are the same either way.
  local scratch=/tmp
  if [[ -d /dev/shm ]] && (($(df --output=avail -k /dev/shm | tail -1) > 8 * 1024 * 1024)); then
    scratch=/dev/shm
  fi
  TMP=$(mktemp -d "$scratch/xnode-$name.XXXXXX")
  export UCX_TLS=tcp
  trap finish EXIT
}

finish() {
  local p
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  # A node killed here leaves its shared-memory segments (/dev/shm/<prefix>.<pid>.<seq>) for a
  # restart that never comes: remove those of the processes this test started, now all dead.
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null || rm -f /dev/shm/*."$p".[0-9]*; done
  rm -rf "$TMP"
}

# summary: the last line, the logs of a failed run, and the exit status.
summary() {
  echo "$PASSED passed, $FAILED failed"
  if ((FAILED > 0)); then
    for f in "$TMP"/*.log "$TMP"/*.err "$TMP"/*.json; do [[ -f $f ]] && { echo "--- $f"; tail -20 "$f"; }; done
  fi
  ((FAILED == 0 && PASSED > 0))
}

on() { local host=$1; shift; "$VIPER_HOSTS_SCRIPT" exec "$host" -- "$@"; }
# wait_for SECONDS command...: polls the command every 0.1 s.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    ((SECONDS >= deadline)) && return 1
    sleep 0.1
  done
}
fetch_ms() { $PY -c 'import json,sys; j = json.loads(open(sys.argv[1]).read().splitlines()[int(sys.argv[2])]); print(round((j["fetched_ns"] - j["notified_ns"]) / 1e6, 1))' "$1" "$2"; }
lines() { [[ -f $1 ]] && [[ $(wc -l <"$1") -ge $2 ]]; }
field() { $PY -c 'import json,sys; print(json.loads(sys.argv[1].splitlines()[int(sys.argv[2])])[sys.argv[3]])' "$(cat "$1")" "$2" "$3"; }
# checked_checksum FILE SOURCE: if FILE's data region is SOURCE's byte for byte, prints its xxh3
# (from viper inspect --verify: declared and recomputed); prints nothing otherwise. The data region
# starts after the 8-byte header length and the header; cmp skips each file's own and fails on a
# differing byte or length (a Python read-and-compare of two 600 MB files took 11-18 s here, cmp
# about 1 s).
checked_checksum() {
  local h1 h2
  h1=$(od -An -t u8 -N 8 "$1" | tr -d ' ') && h2=$(od -An -t u8 -N 8 "$2" | tr -d ' ') || return 0
  [[ $h1 =~ ^[0-9]+$ && $h2 =~ ^[0-9]+$ ]] || return 0
  cmp -s -i $((8 + h1)):$((8 + h2)) "$1" "$2" || return 0
  "$VIPER" inspect --verify --json "$1" | $PY -c 'import json,sys; c = json.load(sys.stdin)["checksum"]; print(c["computed"] if c["status"] == "ok" else "")'
}
# source_checksum HOST_IP PORT MODEL VERSION SOURCE: pulls the version on the producer's own host
# (a map, no network) and checks it against the source file (see checked_checksum).
source_checksum() {
  local out=$TMP/pulled.safetensors
  on h1 "$VIPER" pull "$3" --version "$4" --connect "$1:$2" -o "$out" >/dev/null 2>&1 || return 0
  checked_checksum "$out" "$5"
  rm -f "$out"
}
# serve HOST NAME ARGS...: starts a node in HOST (log in $TMP/NAME.log), waits until it listens.
serve() {
  local host=$1 name=$2; shift 2
  # exec all the way down: $! is the node's own pid (hosts.sh exec and ip netns exec exec too).
  (exec "$VIPER_HOSTS_SCRIPT" exec "$host" -- "$VIPER" serve --name "$name" --address-file "$TMP/$name.addr" "$@" \
     >"$TMP/$name.log" 2>&1) &
  PIDS+=($!)
  eval "PID_$name=$!"
  wait_for 10 test -s "$TMP/$name.addr" || { echo "node $name did not start:"; cat "$TMP/$name.log"; return 1; }
}
stop() { kill -TERM "$1" 2>/dev/null; wait "$1" 2>/dev/null; }
