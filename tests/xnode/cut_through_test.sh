#!/usr/bin/env bash
# Cut-through from the producer across two test hosts (network namespaces from scripts/hosts.sh):
# a producer process on h1 (viper_test_peer produce --copy: the embedded Publisher copying each
# version in with Publish()) announces every version to the consumer on h2 while it copies it, and
# the consumer receives its chunks meanwhile; only complete, verified versions go live there; a
# producer killed with SIGKILL mid-copy leaves nothing live of the version it was copying.
# Usage: cut_through_test.sh PATH/TO/viper      (root; labels: netns; viper_test_peer beside viper)
# Prints one line per check and "N passed, N failed"; exits non-zero on any failure.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/lib.sh"
xnode_enter 2 "$@"

PEER=$(dirname "$VIPER")/viper_test_peer
[[ -x $PEER ]] || { echo "no $PEER (build target viper_test_peer)"; exit 2; }
A=10.77.0.1

# produce NAME PORT ARGS...: the producer on h1 (log $TMP/NAME.log), its pid in PID_NAME.
produce() {
  local name=$1 port=$2
  shift 2
  # exec all the way down (as serve does): $! is the producer's own pid.
  (exec "$VIPER_HOSTS_SCRIPT" exec h1 -- "$PEER" produce --model m --listen $A:$port --address-file "$TMP/$name.addr" \
     --copy 1 --insecure 1 --state-file "$TMP/$name.state" "$@" >"$TMP/$name.log" 2>&1) &
  printf -v "PID_$name" '%s' $!
  PIDS+=($!)
}
# Segments a killed producer left (/dev/shm/viper.<pid>.<n>) are removed by the test, not left behind.
drop_segments() { rm -f /dev/shm/viper."$1".*; }

# ---------------------------------------------------------------- 1. received while being copied
test_received_while_copied() {
  # 3 versions of 96 MiB (one 96 MiB tensor + small ones), one every 1.5 s; full copies (each
  # version's byte pattern differs from the last by one XOR constant: a delta would be tiny, and a
  # consumer holding a base would rightly wait for it).
  # Version 1's copy pauses 2 s half way, so that h2's FETCH finds it being copied however late a
  # loaded machine schedules h2 (the copy alone can end before h2 has even read the INCOMING).
  produce p1 7400 --versions 3 --tensor-bytes $((96 << 20)) --interval-ms 1500 --wait-peers 2 --delta off \
    --pause-in-copy 1
  wait_for 20 test -s "$TMP/p1.addr" || { failed "the producer never listened"; return; }
  on h2 "$VIPER" watch m --connect $A:7400 --path remote --json --count 3 --timeout 40 >"$TMP/w1.json" 2>"$TMP/w1.err" &
  local watch=$!
  PIDS+=($watch)
  on h2 "$PEER" consume --model m --connect $A:7400 --until 3 --path remote --result "$TMP/c1.json" \
    --timeout-s 90 >"$TMP/c1.log" 2>&1 &
  local consume=$!
  PIDS+=($consume)
  # A subscriber loads only the newest announced version: on a loaded machine h2 may skip version 2.
  wait "$watch"
  local seen
  seen=$($PY -c 'import json,sys; print(" ".join(str(json.loads(l)["version"]) for l in open(sys.argv[1])))' "$TMP/w1.json")
  check "watch on h2 made versions live in order, the last one 3 ($seen)" \
    $PY -c 'import sys; v = [int(x) for x in sys.argv[1:]]; sys.exit(0 if v and v[0] == 1 and v[-1] == 3 and v == sorted(set(v)) else 1)' $seen
  wait "$consume"
  check "consumer on h2 read up to version 3, every read verified (exit 0)" test $? -eq 0
  check "no torn or mixed read on h2" $PY -c 'import json,sys; r = json.load(open(sys.argv[1])); sys.exit(0 if not r.get("errors") else 1)' "$TMP/c1.json"
  local k reason n
  n=$(wc -l <"$TMP/w1.json")
  for ((k = 1; k <= n; k++)); do
    check "update $k on h2: path remote" test "$(field "$TMP/w1.json" $((k - 1)) path)" = remote
    reason=$(field "$TMP/w1.json" $((k - 1)) reason)
    # Version 1 is published once both consumers are connected and idle, and its copy pauses half
    # way, so its FETCH finds it being copied; a later one may find it committed already when h2 is
    # still busy with the last (a loaded 2-vCPU machine), and then comes as any committed version.
    if ((k == 1)); then
      check "version 1 on h2 came through the cut-through ($reason)" grep -q 'cut-through' <<<"$reason"
    else
      echo "  update $k on h2 (version $(field "$TMP/w1.json" $((k - 1)) version)): $reason"
    fi
  done
  local stats
  stats=$(on h1 "$VIPER" stats --connect $A:7400 --json 2>/dev/null)
  check "the producer's node announced 3 versions early (produced_early)" \
    $PY -c 'import json,sys; c = json.loads(sys.argv[1]); c = c.get("counters", c); sys.exit(0 if c["produced_early"] == 3 else 1)' "$stats"
  check "chunks left the producer's node before its versions were complete (bytes_sent_incoming > 0)" \
    $PY -c 'import json,sys; c = json.loads(sys.argv[1]); c = c.get("counters", c); sys.exit(0 if c["bytes_sent_incoming"] > 0 else 1)' "$stats"
  kill -TERM "$PID_p1" 2>/dev/null
  wait "$PID_p1" 2>/dev/null
  drop_segments "$PID_p1"
}

# ---------------------------------------------------------------- 2. producer killed mid-copy
test_killed_mid_copy() {
  # Version 1 complete, then version 2 stalls half copied: the consumer has received its first
  # chunks when the producer is killed.
  produce p2 7410 --versions 1 --tensor-bytes $((64 << 20)) --hang-in-copy 2 --wait-peers 1
  wait_for 20 test -s "$TMP/p2.addr" || { failed "the producer never listened"; return; }
  on h2 "$VIPER" watch m --connect $A:7410 --path remote --json --count 2 --timeout 20 >"$TMP/w2.json" 2>"$TMP/w2.err" &
  local watch=$!
  PIDS+=($watch)
  wait_for 30 grep -qs "copying 2" "$TMP/p2.state" || { failed "the producer never reached the middle of version 2"; return; }
  wait_for 30 lines "$TMP/w2.json" 1 || { failed "version 1 never went live on h2"; return; }
  local sent
  wait_for 20 eval '[[ $(on h1 "$VIPER" stats --connect $A:7410 --json 2>/dev/null | $PY -c "import json,sys; c = json.load(sys.stdin); c = c.get(\"counters\", c); print(c[\"bytes_sent_incoming\"])") -gt 0 ]]'
  sent=$(on h1 "$VIPER" stats --connect $A:7410 --json 2>/dev/null | $PY -c 'import json,sys; c = json.load(sys.stdin); c = c.get("counters", c); print(c["bytes_sent_incoming"])')
  check "h2 received chunks of version 2 while it was being copied ($sent bytes)" test "${sent:-0}" -gt 0
  kill -KILL "$PID_p2"
  wait "$PID_p2" 2>/dev/null
  check "producer died of SIGKILL" test $? -eq 137
  drop_segments "$PID_p2"
  wait "$watch"
  check "watch on h2 timed out without a second version (exit non-zero)" test $? -ne 0
  check "only version 1 went live on h2" test "$(wc -l <"$TMP/w2.json")" -eq 1
  check "the live version on h2 is version 1" test "$(field "$TMP/w2.json" 0 version)" = 1
}

test_received_while_copied
test_killed_mid_copy
summary
