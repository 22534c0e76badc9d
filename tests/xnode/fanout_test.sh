#!/usr/bin/env bash
# Fan-out across hosts (issue 14): real `viper` processes on four test hosts (network namespaces
# from scripts/hosts.sh). A producer's node on h1 and a chain of relays h1 -> h2 -> h3 -> h4
# (`viper serve --upstream`), two consumers on every host mapping their own host's node.
#   test_chain: every consumer maps every version bit-exact in its own host's node (the relay on
#               h2..h4, the producer's node on h1); each node sends each version once
#               (counted by the nodes: `viper stats`); a relay forwards chunks while it still
#               receives them (its downstream's first bytes land before its own last bytes).
#   test_relay_killed: a relay killed mid-transfer; the relay behind it finishes the version from
#               the producer's node at the prefix that had landed (resume: its own receivers never
#               notice), every consumer gets a whole, verified model, and all re-attach past the dead
#               relay for the next version.
#   test_delta_chain: with deltas always on, version 2 (one byte in 256 changed) crosses the chain
#               as the producer's delta, passed on by each relay (none encodes one), and the
#               consumer at the end maps it whole and verified.
# Usage: fanout_test.sh PATH/TO/viper      (root; labels: netns)
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/lib.sh"
xnode_enter 4 "$@"

IP=(none 10.77.0.1 10.77.0.2 10.77.0.3 10.77.0.4)

# host_shell HOST: a shell inside HOST running each line written to $TMP/HOST.fifo. Processes it
# starts share one mount namespace (every `ip netns exec` makes a new one, and the host key
# includes it), so a consumer started there maps the segments of a node started there.
host_shell() {
  mkfifo "$TMP/$1.fifo"
  (exec "$VIPER_HOSTS_SCRIPT" exec "$1" -- bash -c 'exec 3<>"$0"; while read -r line <&3; do eval "$line"; done' \
     "$TMP/$1.fifo" >"$TMP/$1.shell.log" 2>&1) &
  PIDS+=($!)
}
# spawn HOST NAME COMMAND: runs the COMMAND string in HOST's shell in the background; its pid
# goes to $TMP/NAME.pid (and PIDS).
spawn() {
  rm -f "$TMP/$2.pid"
  echo "$3 & echo \$! >'$TMP/$2.pid'" >"$TMP/$1.fifo"
  wait_for 5 test -s "$TMP/$2.pid" || { echo "could not start $2 on $1"; return 1; }
  PIDS+=($(cat "$TMP/$2.pid"))
}
# node HOST NAME PORT ARGS...: a node in HOST's shell; waits until it listens.
node() {
  local host=$1 name=$2 port=$3; shift 3
  spawn "$host" "$name" "VIPER_LOG=info '$VIPER' serve --name $name --listen ${IP[${host#h}]}:$port --insecure \
    --address-file '$TMP/$name.addr' $* >'$TMP/$name.log' 2>&1" || return 1
  wait_for 10 test -s "$TMP/$name.addr" || { echo "node $name did not start:"; cat "$TMP/$name.log"; return 1; }
}
# consumer HOST NAME NODE COUNT ARGS...: `viper watch` in HOST's shell, JSON lines in $TMP/NAME.json.
consumer() {
  local host=$1 name=$2 addr=$3 count=$4; shift 4
  spawn "$host" "$name" "'$VIPER' watch fan --connect $addr --json --count $count --timeout 90 --verify-local $* \
    >'$TMP/$name.json' 2>'$TMP/$name.err'"
}
# counter HOST ADDR NAME: one of the node's counters (viper stats).
counter() {
  on "$1" "$VIPER" stats --connect "$2" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$3"
}
# settled HOST ADDR NAME [FLOOR]: the counter once it reached FLOOR and stopped moving (two reads
# 0.3 s apart agree; 10 s at most). A node counts a chunk as sent when UCX completes its send, which
# can reach it after the receiver already has the chunk.
settled() {
  local deadline=$((SECONDS + 10)) last now
  last=$(counter "$1" "$2" "$3")
  while ((last < ${4:-0} && SECONDS < deadline)); do
    sleep 0.05
    last=$(counter "$1" "$2" "$3")
  done
  while ((SECONDS < deadline)); do
    sleep 0.3
    now=$(counter "$1" "$2" "$3")
    [[ $now == "$last" ]] && break
    last=$now
  done
  echo "$last"
}
# landed NAME VERSION first|all: when the relay NAME's first or last bytes of VERSION landed (ns).
landed() {
  grep -o "fan version $2: $3 .*landed at [0-9]*" "$TMP/$1.log" | head -1 | grep -o '[0-9]*$'
}
all_lines() { local n=$1 f; shift; for f in "$@"; do lines "$TMP/$f.json" "$n" || return 1; done; }
peers_at_least() { (($(counter "$1" "$2" peers 2>/dev/null || echo 0) >= $3)); }
# slow HOST DST RATE: traffic from HOST to DST (an address) at RATE; everything else at full speed.
slow() {
  on "$1" tc qdisc add dev eth0 root handle 1: htb default 1
  on "$1" tc class add dev eth0 parent 1: classid 1:1 htb rate 10gbit 2>/dev/null  # "quantum is big": harmless
  on "$1" tc class add dev eth0 parent 1: classid 1:3 htb rate "$3" 2>/dev/null
  on "$1" tc filter add dev eth0 parent 1: protocol ip u32 match ip dst "$2/32" flowid 1:3
}
unslow() { on "$1" tc qdisc del dev eth0 root 2>/dev/null; }
# chain PORT SUFFIX: nodes a, b, c, d (names + SUFFIX) on h1..h4 listening on PORT..PORT+3, each
# relaying "fan" from the one before it; c and d fall back to a when their upstream is gone.
chain() {
  local p=$1 x=$2
  node h1 a$x $p || return
  node h2 b$x $((p + 1)) --upstream ${IP[1]}:$p --relay-model fan || return
  node h3 c$x $((p + 2)) --upstream ${IP[2]}:$((p + 1)) --upstream-alternate ${IP[1]}:$p --relay-model fan || return
  node h4 d$x $((p + 3)) --upstream ${IP[3]}:$((p + 2)) --upstream-alternate ${IP[1]}:$p --relay-model fan
}
publish() { on h1 "$VIPER" publish fan "$TMP/m$2.safetensors" --connect "$1" >/dev/null; }

echo "making models"
for k in 1 2 3; do $PY "$HERE/make_model.py" "$TMP/m$k.safetensors" $((48 << 20)) $((40 + k)) || exit 1; done
$PY "$HERE/make_model.py" "$TMP/m4.safetensors" $((48 << 20)) 50 && $PY "$HERE/make_model.py" "$TMP/m5.safetensors" $((48 << 20)) 50 256 ||
  exit 1
for h in h1 h2 h3 h4; do host_shell $h; done

# ---------------------------------------------------------------- 1. a chain of relays, 8 consumers
test_chain() {
  local A=${IP[1]}:7400 B=${IP[2]}:7401 C=${IP[3]}:7402 D=${IP[4]}:7403
  chain 7400 "" || return
  local consumers=() k n addr
  for k in 1 2 3 4; do
    addr=$(cat "$TMP/$(echo a b c d | cut -d' ' -f$k).addr")
    # The default path (auto): a consumer on a relay's host maps that relay's segment, nothing else
    # (checked below by the exact egress and by each update's path).
    for n in 1 2; do consumer h$k w$k$n "$addr" 2 || return; consumers+=(w$k$n); done
  done
  # Every consumer and downstream relay has subscribed before the first version.
  wait_for 20 peers_at_least h1 $A 3 && wait_for 20 peers_at_least h2 $B 3 && wait_for 20 peers_at_least h3 $C 3 &&
    wait_for 20 peers_at_least h4 $D 2 || { failed "consumers never connected"; return; }
  # A -> B at 400 Mbit/s (~1 s per version): the relays behind B receive while B still does.
  slow h1 ${IP[2]} 400mbit
  local start k
  for k in 1 2; do
    start=$(date +%s%N)
    publish $A $k || { failed "publish v$k"; return; }
    wait_for 60 all_lines $k "${consumers[@]}" || { failed "v$k did not reach every consumer"; return; }
    echo "  v$k: publish -> the last of 8 consumers live in $((($(date +%s%N) - start) / 1000000)) ms"
  done
  unslow h1
  # Counters first: the checks' own pulls from A below count as egress too.
  local sent name host addr bytes=0 c bad
  for k in 1 2; do bytes=$((bytes + $(field "$TMP/w11.json" $((k - 1)) bytes))); done
  for n in a:h1:$A b:h2:$B c:h3:$C; do
    IFS=: read -r name host addr <<<"$n"
    sent=$(settled "$host" "$addr" bytes_sent "$bytes")
    check "node $name sent exactly one copy per update ($sent of $bytes bytes)" test "$sent" = "$bytes"
  done
  check "node d (end of the chain) sent nothing" test "$(counter h4 $D bytes_sent)" = 0
  local early
  for n in b:h2:$B c:h3:$C; do
    IFS=: read -r name host addr <<<"$n"
    early=$(settled "$host" "$addr" bytes_sent_incoming 1)
    check "relay $name forwarded bytes before it had the whole version ($early bytes)" test "$early" -gt 0
  done
  local sum
  for k in 1 2; do
    sum=$(source_checksum ${IP[1]} 7400 fan $k "$TMP/m$k.safetensors")
    check "fan v$k on A is the source file's bytes" test -n "$sum"
    bad=0
    for c in "${consumers[@]}"; do
      [[ $(field "$TMP/$c.json" $((k - 1)) version) = $k && $(field "$TMP/$c.json" $((k - 1)) path) = map &&
         $(field "$TMP/$c.json" $((k - 1)) checksum) = "$sum" ]] ||
        { echo "  consumer $c v$k: $(sed -n ${k}p "$TMP/$c.json")"; bad=$((bad + 1)); }
    done
    check "all 8 consumers mapped v$k in their own host's node's segment, verified, bit-exact" test $bad = 0
  done
  local up down
  for pair in b:c c:d; do
    up=${pair%:*} down=${pair#*:}
    for k in 1 2; do
      local up_all down_first
      up_all=$(landed $up $k all) down_first=$(landed $down $k first)
      echo "  v$k: $down's first bytes landed $(((up_all - down_first) / 1000000)) ms before $up had all of them"
      check "pipelined: $down's first bytes of v$k landed before $up's last" test "${down_first:-0}" -gt 0 -a \
        "${down_first:-0}" -lt "${up_all:-0}"
    done
  done
  for n in a b c d; do kill -TERM "$(cat "$TMP/$n.pid")" 2>/dev/null; done
}

# ---------------------------------------------------------------- 2. a relay killed mid-transfer
# A (h1) -> B (h2) -> C (h3) -> D (h4). B dies while C and D receive v2 through it: C and D fetch
# v2 from A (named in the INCOMING they got), the consumers on h3 and h4 map a whole, verified v2;
# the consumer on h2 (its node is gone) takes v2 from A's memory. v3 then flows A -> C -> D (C
# re-attached to its alternate) and reaches h2's consumer through its alternate.
test_relay_killed() {
  local A=${IP[1]}:7410 B=${IP[2]}:7411 C=${IP[3]}:7412 D=${IP[4]}:7413
  chain 7410 2 || return
  consumer h2 k2 $B 3 --alternate $A || return
  consumer h3 k3 $C 3 || return
  consumer h4 k4 $D 3 || return
  wait_for 20 peers_at_least h2 $B 2 && wait_for 20 peers_at_least h3 $C 2 && wait_for 20 peers_at_least h4 $D 1 ||
    { failed "consumers never connected"; return; }
  local sums=()
  publish $A 1 || { failed "publish v1"; return; }
  wait_for 60 all_lines 1 k2 k3 k4 || { failed "v1 did not reach every consumer"; return; }
  sums+=("$(source_checksum ${IP[1]} 7410 fan 1 "$TMP/m1.safetensors")")  # A keeps two versions in memory
  slow h1 ${IP[2]} 100mbit  # A -> B: ~4 s for v2
  local sent_before
  sent_before=$(settled h1 $A bytes_sent)
  publish $A 2 || { failed "publish v2"; return; }
  wait_for 20 grep -q "fan version 2: first bytes landed" "$TMP/d2.log" ||
    { failed "v2 never reached D through B and C"; return; }
  kill -KILL "$(cat "$TMP/b2.pid")"
  check "relay B was killed while C and D were receiving v2 through it" bash -c "! grep -q 'fan version 2: all' '$TMP/c2.log'"
  wait_for 60 all_lines 2 k2 k3 k4 || { failed "v2 did not reach every consumer after B died"; return; }
  local sent_v2
  sent_v2=$(($(settled h1 $A bytes_sent) - sent_before))
  unslow h1
  sums+=("$(source_checksum ${IP[1]} 7410 fan 2 "$TMP/m2.safetensors")")
  publish $A 3 || { failed "publish v3"; return; }
  wait_for 60 all_lines 3 k2 k3 k4 || { failed "v3 did not reach every consumer past the dead relay"; return; }
  sums+=("$(source_checksum ${IP[1]} 7410 fan 3 "$TMP/m3.safetensors")")
  local k c want
  for k in 1 2 3; do
    want=${sums[$((k - 1))]}
    check "fan v$k on A is the source file's bytes" test -n "$want"
    for c in k2 k3 k4; do
      check "consumer $c: v$k whole and verified (checksum $want, path $(field "$TMP/$c.json" $((k - 1)) path))" \
        test "$(field "$TMP/$c.json" $((k - 1)) version)" = $k -a "$(field "$TMP/$c.json" $((k - 1)) checksum)" = "$want"
    done
  done
  check "consumers on h3 and h4 took v2 from their own relays (map or copy)" \
    bash -c "[[ '$(field "$TMP/k3.json" 1 path)' =~ ^(map|copy)$ && '$(field "$TMP/k4.json" 1 path)' =~ ^(map|copy)$ ]]"
  echo "  h2's consumer, v2: $(field "$TMP/k2.json" 1 reason)"
  check "h2's consumer took v2 from A's memory over the network (its node died)" test "$(field "$TMP/k2.json" 1 path)" = remote
  check "relay C fetched v2 from A after B broke off" grep -q "remote from node $A" "$TMP/c2.log"
  # Resumed, not restarted: C finishes v2 from A at the prefix that landed from B (a FETCH with an
  # offset), into the same incoming segment, so D behind it (and C's consumers) never see it break.
  local size at
  size=$(field "$TMP/k4.json" 1 bytes)  # the snapshot as the node laid it out (not the file's size)
  at=$(grep -o "fan version 2: transfer from $B broke after [0-9]* of $size" "$TMP/c2.log" | grep -o "after [0-9]*" | grep -o "[0-9]*")
  check "relay C resumed v2 at the prefix from B (byte ${at:-?} of $size)" grep -q "resumed at byte ${at:-x} of $size" "$TMP/c2.log"
  check "C's incoming v2 was not aborted (its receivers never noticed)" test "$(counter h3 $C incoming_aborted)" -eq 0
  check "D's incoming v2 was not aborted" test "$(counter h4 $D incoming_aborted)" -eq 0
  # A's egress for v2: what reached B before it died (at least C's prefix, at most a copy), the
  # remainder to C, and one copy to h2's consumer, whose node died before v2 was whole there.
  # Restarting instead cost a copy to C and one to D on top of that (D was told Aborted).
  local to_b=$((sent_v2 - (size - ${at:-0}) - size))
  echo "  A sent $sent_v2 bytes for v2 ($(echo "scale=2; $sent_v2 / $size" | bc) copies): ~$to_b to B, $((size - ${at:-0})) to C after the resume, $size to h2's consumer"
  check "A's egress for v2 is B's part + C's remainder + h2's copy: B's part ($to_b) between C's prefix (${at:-?}) and one copy" \
    test "${at:-0}" -gt 0 -a "$to_b" -ge "${at:-0}" -a "$to_b" -le "$size"
  for n in a2 c2 d2; do kill -TERM "$(cat "$TMP/$n.pid")" 2>/dev/null; done
}

# ---------------------------------------------------------------- 3. a delta through the chain
# A (h1) -> B (h2) -> C (h3) -> D (h4), every node `--delta always`, one consumer mapping D. Version
# 1 crosses in full; version 2 (m5: m4 with one byte in 256 flipped) as the delta A encodes, which B
# and C pass on as it arrives (`delta_forwarded`), encoding none of their own (`delta_encoded`).
test_delta_chain() {
  local A=${IP[1]}:7420 B=${IP[2]}:7421 C=${IP[3]}:7422 D=${IP[4]}:7423
  node h1 a3 7420 --delta always || return
  node h2 b3 7421 --upstream $A --relay-model fan --delta always || return
  node h3 c3 7422 --upstream $B --relay-model fan --delta always || return
  node h4 d3 7423 --upstream $C --relay-model fan --delta always || return
  consumer h4 w3 $D 2 || return
  wait_for 20 peers_at_least h1 $A 1 && wait_for 20 peers_at_least h2 $B 1 && wait_for 20 peers_at_least h3 $C 1 &&
    wait_for 20 peers_at_least h4 $D 1 || { failed "the chain never connected"; return; }
  publish $A 4 || { failed "publish v1"; return; }
  wait_for 60 all_lines 1 w3 || { failed "v1 did not reach the consumer"; return; }
  local size name host addr sent
  size=$(field "$TMP/w3.json" 0 bytes)
  declare -A before
  for n in a:h1:$A b:h2:$B c:h3:$C; do
    IFS=: read -r name host addr <<<"$n"
    before[$name]=$(settled "$host" "$addr" bytes_sent "$size")
  done
  publish $A 5 || { failed "publish v2"; return; }
  wait_for 60 all_lines 2 w3 || { failed "v2 did not reach the consumer"; return; }
  for n in a:h1:$A b:h2:$B c:h3:$C; do
    IFS=: read -r name host addr <<<"$n"
    sent=$(($(settled "$host" "$addr" bytes_sent) - ${before[$name]}))
    check "node $name sent a delta for v2, not the version ($sent bytes for $size)" test "$sent" -gt 0 -a "$sent" -lt $((size / 10))
  done
  # A node counts a delta (passed on or encoded) once its last part is in, which may be after the
  # next hop has the whole stream: wait for the counts before reading them.
  counter_is() { [[ $(counter "$1" "$2" "$3") == "$4" ]]; }
  wait_for 30 counter_is h1 "$A" delta_encoded 1
  wait_for 30 counter_is h2 "$B" delta_forwarded 1
  wait_for 30 counter_is h3 "$C" delta_forwarded 1
  wait_for 30 counter_is h4 "$D" delta_forwarded 1
  for n in b:h2:$B c:h3:$C d:h4:$D; do
    IFS=: read -r name host addr <<<"$n"
    check "relay $name received v2 as the producer's delta and kept it to pass on" test "$(counter "$host" "$addr" delta_forwarded)" = 1
    check "relay $name encoded no delta of its own" test "$(counter "$host" "$addr" delta_encoded)" = 0
  done
  check "node a encoded the one delta" test "$(counter h1 $A delta_encoded)" = 1
  local want
  want=$(source_checksum ${IP[1]} 7420 fan 2 "$TMP/m5.safetensors")
  check "fan v2 on A is the source file's bytes" test -n "$want"
  check "the consumer on D mapped v2 whole and verified" \
    test "$(field "$TMP/w3.json" 1 version)" = 2 -a "$(field "$TMP/w3.json" 1 checksum)" = "$want"
  for n in a3 b3 c3 d3; do kill -TERM "$(cat "$TMP/$n.pid")" 2>/dev/null; done
}

for t in ${XNODE_TESTS:-test_chain test_relay_killed test_delta_chain}; do
  echo "== $t"
  start=$SECONDS
  $t
  echo "   ($((SECONDS - start)) s)"
done
summary
