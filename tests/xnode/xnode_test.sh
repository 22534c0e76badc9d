#!/usr/bin/env bash
# Cross-node tests: real `viper` processes on three test hosts (network namespaces from
# scripts/hosts.sh, always cleaned up). h1 = producer host A, h2 = consumer host B, h3 = a stranger.
# A directory both hosts see ($TMP/pfs) stands in for the parallel file system.
# Usage: xnode_test.sh PATH/TO/viper      (root; labels: netns)
# Prints one line per check and "N passed, N failed"; exits non-zero on any failure.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/lib.sh"
xnode_enter 3 "$@"

PFS=$TMP/pfs
mkdir -p "$PFS"
A=10.77.0.1
B=10.77.0.2

echo "making models"
$PY "$HERE/make_model.py" "$TMP/big1.safetensors" $((600 << 20)) 1 || exit 1
$PY "$HERE/make_model.py" "$TMP/big2.safetensors" $((600 << 20)) 2 || exit 1
$PY "$HERE/make_model.py" "$TMP/mid1.safetensors" $((48 << 20)) 3 || exit 1
$PY "$HERE/make_model.py" "$TMP/mid2.safetensors" $((48 << 20)) 4 || exit 1


# ---------------------------------------------------------------- 1. 600 MB, A -> B, three versions
test_big() {
  serve h1 a1 --listen $A:7300 --insecure || return
  on h2 "$VIPER" watch big --connect $A:7300 --json --count 3 --timeout 90 >"$TMP/big.json" 2>"$TMP/big.err" &
  local watch=$!
  PIDS+=($watch)
  local k file start sums=()
  for k in 1 2 3; do
    file=$TMP/big$((2 - k % 2)).safetensors  # v1 big1, v2 big2, v3 big1: every version differs from the last
    start=$(date +%s.%N)
    on h1 "$VIPER" publish big "$file" --connect $A:7300 >/dev/null || { failed "publish big v$k"; return; }
    if wait_for 60 lines "$TMP/big.json" $k; then
      echo "  big v$k: publish start -> live on h2 in $(echo "$(date +%s.%N) - $start" | bc) s" \
           "(notify->fetched $(fetch_ms "$TMP/big.json" $((k - 1))) ms," \
           "publish->live $(field "$TMP/big.json" $((k - 1)) publish_to_live_ms) ms)"
    fi
    sums+=("$(source_checksum $A 7300 big $k "$file")")
  done
  wait "$watch"
  check "watch on h2 saw 3 versions of the 600 MB model (exit 0)" test $? -eq 0
  for k in 1 2 3; do
    local want=${sums[$((k - 1))]}
    check "big v$k on A: the node holds the source file's bytes" test -n "$want"
    check "big v$k on h2: version $k" test "$(field "$TMP/big.json" $((k - 1)) version)" = $k
    check "big v$k on h2: path remote" test "$(field "$TMP/big.json" $((k - 1)) path)" = remote
    check "big v$k on h2: bit-exact (checksum $want of the source file's data)" \
      test "$(field "$TMP/big.json" $((k - 1)) checksum)" = "$want"
  done
  stop "$PID_a1"
}

# ---------------------------------------------------------------- 2. A killed mid-transfer -> file tier
test_kill() {
  serve h1 a2 --listen $A:7310 --insecure --store-dir "$PFS" || return
  # The watch pins the remote path: the file tier is its fallback, never tried first, although
  # v1's transfer (over the slowed link below) measures the network far slower than the file tier
  # (here on tmpfs) is predicted to be.
  on h2 "$VIPER" watch mid --connect $A:7310 --path remote --file-dir "$PFS" --json --count 2 --timeout 40 \
    >"$TMP/mid.json" 2>"$TMP/mid.err" &
  local watch=$!
  PIDS+=($watch)
  on h1 tc qdisc add dev eth0 root tbf rate 400mbit burst 256kb latency 200ms
  on h1 "$VIPER" publish mid "$TMP/mid1.safetensors" --connect $A:7310 >/dev/null || { failed "publish mid v1"; return; }
  wait_for 20 lines "$TMP/mid.json" 1 || { failed "mid v1 never reached h2"; return; }
  # Slow A's link to ~4 s per version so that the kill lands mid-transfer.
  on h1 tc qdisc change dev eth0 root tbf rate 100mbit burst 256kb latency 200ms
  on h1 "$VIPER" publish mid "$TMP/mid2.safetensors" --connect $A:7310 >/dev/null || { failed "publish mid v2"; return; }
  wait_for 10 test -f "$PFS/mid/2.safetensors" || { failed "mid v2 never reached the file tier"; return; }
  sleep 0.3
  kill -KILL "$PID_a2"
  wait "$PID_a2"
  check "node A died of SIGKILL" test $? -eq 137
  wait "$watch"
  check "watch on h2 got 2 versions although A died (exit 0)" test $? -eq 0
  check "mid v1 came over the network" test "$(field "$TMP/mid.json" 0 path)" = remote
  check "mid v2 came from the file tier (path file)" test "$(field "$TMP/mid.json" 1 path)" = file
  local reason
  reason=$(field "$TMP/mid.json" 1 reason)
  echo "  reason: $reason"
  check "mid v2's reason says the remote transfer, tried first, failed" grep -q "; after remote failed" <<<"$reason"
  SUM_MID2=$(checked_checksum "$PFS/mid/2.safetensors" "$TMP/mid2.safetensors")
  check "mid v2's file holds the source's bytes" test -n "$SUM_MID2"
  check "mid v2 on h2 is bit-exact" test "$(field "$TMP/mid.json" 1 checksum)" = "$SUM_MID2"
  check "the subscriber logged the broken transfer" grep -q "via remote failed" "$TMP/mid.err"
  check "file tier files are owner-only (0600)" test "$(stat -c %a "$PFS/mid/2.safetensors")" = 600
  on h1 tc qdisc del dev eth0 root
}

# ---------------------------------------------------------------- 3. two replicas: the local one wins
test_relay() {
  serve h1 a3 --listen $A:7320 --insecure || return
  on h1 "$VIPER" publish rel "$TMP/mid1.safetensors" --connect $A:7320 >/dev/null || { failed "publish rel v1"; return; }
  # The relay node and the consumer share h2's mount namespace (one `exec`): shared memory reachable.
  on h2 bash -c "
    VIPER_LOG=info '$VIPER' serve --name b3 --listen $B:7301 --insecure --upstream $A:7320 --relay-model rel >'$TMP/b3.log' 2>&1 &
    relay=\$!
    for i in \$(seq 100); do '$VIPER' ls --connect $B:7301 --json 2>/dev/null | grep -q '\"version\": 1' && break; sleep 0.1; done
    '$VIPER' ls --connect $B:7301 --json >'$TMP/rel.ls'
    '$VIPER' watch rel --connect $B:7301 --json --count 1 --timeout 20 >'$TMP/rel.json' 2>'$TMP/rel.err'
    echo \$? >'$TMP/rel.rc'
    for i in \$(seq 50); do '$VIPER' ls --connect $A:7320 --json 2>/dev/null | grep -q 'node:$B:7301' && break; sleep 0.1; done
    '$VIPER' ls --connect $A:7320 --json >'$TMP/upstream.ls'
    kill -TERM \$relay; wait \$relay"
  check "watch on h2 via the relay node (exit 0)" test "$(cat "$TMP/rel.rc")" = 0
  check "the relay fetched v1 from A over the network" grep -q "relayed rel version 1 .* via remote" "$TMP/b3.log"
  check "the relay node lists its own segment and node" grep -q "node:$B:7301" "$TMP/rel.ls"
  check "the relay node lists A's replica too" grep -q "node:$A:7320" "$TMP/rel.ls"
  check "the consumer on h2 took the local replica (path map)" test "$(field "$TMP/rel.json" 0 path)" = map
  echo "  reason: $(field "$TMP/rel.json" 0 reason)"
  check "reason says same host" grep -q "same host" <<<"$(field "$TMP/rel.json" 0 reason)"
  check "A's registry lists the relay as a replica (REPLICA message)" grep -q "node:$B:7301" "$TMP/upstream.ls"
  wait_for 5 bash -c "! '$VIPER_HOSTS_SCRIPT' exec h1 -- '$VIPER' ls --connect $A:7320 --json | grep -q 'node:$B:7301'"
  check "A forgets the relay's replica once the relay is gone" test $? -eq 0
  stop "$PID_a3"
}

# ---------------------------------------------------------------- 4. token; garbage on the listener
test_auth() {
  echo "s3cret-$$" >"$TMP/token"
  chmod 600 "$TMP/token"
  serve h1 a4 --listen $A:7330 --token-file "$TMP/token" || return
  on h2 "$VIPER" watch tok --connect $A:7330 --token-file "$TMP/token" --json --count 2 --timeout 30 \
    >"$TMP/tok.json" 2>"$TMP/tok.err" &
  local watch=$!
  PIDS+=($watch)
  on h1 "$VIPER" publish tok "$TMP/mid1.safetensors" --connect $A:7330 --token-file "$TMP/token" >/dev/null ||
    { failed "publish with the token"; return; }
  check "ls from h3 without a token is refused" bash -c "! '$VIPER_HOSTS_SCRIPT' exec h3 -- '$VIPER' ls --connect $A:7330 2>'$TMP/notoken.err'"
  echo wrong >"$TMP/wrong"
  chmod 600 "$TMP/wrong"
  check "ls from h3 with a wrong token is refused" bash -c "! '$VIPER_HOSTS_SCRIPT' exec h3 -- '$VIPER' ls --connect $A:7330 --token-file '$TMP/wrong' 2>/dev/null"
  check "the client without a token was told why" grep -q "refused by $A:7330: a token is required" "$TMP/notoken.err"
  check "the node logged why (no token)" grep -q "refused connection from .*: it holds no token" "$TMP/a4.log"
  check "the node logged why (wrong token)" grep -q "refused connection from .*: the client refused this node: wrong token" "$TMP/a4.log"
  # Garbage on the listener: the listener is the node's own socket (src/net/bootstrap.h); what is
  # not a bootstrap frame is dropped at once, and UCX never sees it.
  on h3 $PY -c "
import socket
s = socket.create_connection(('$A', 7330), timeout=5)
s.sendall(bytes(range(256)) * 256)
s.settimeout(3)
try:
    print('closed by the node' if s.recv(65536) == b'' else 'answered')
except (socket.timeout, ConnectionResetError) as e:
    print('reset by the node' if isinstance(e, ConnectionResetError) else 'left idle by the node')
" >"$TMP/garbage.out" 2>&1
  echo "  garbage client: $(cat "$TMP/garbage.out")"
  check "the garbage client was dropped (closed or reset)" grep -qE "^(closed|reset) by the node$" "$TMP/garbage.out"
  check "the node logged why it dropped it" grep -q "refused connection from .*not a Viper peer" "$TMP/a4.log"
  # The watcher has v1 before v2 comes (one busy when v2 is announced would skip v1's line).
  wait_for 20 lines "$TMP/tok.json" 1 || { failed "the consumer on h2 never got tok v1"; return; }
  on h1 "$VIPER" publish tok "$TMP/mid2.safetensors" --connect $A:7330 --token-file "$TMP/token" >/dev/null ||
    failed "publish after the garbage"
  wait "$watch"
  check "the real consumer still got both versions (exit 0)" test $? -eq 0
  local want
  want=$(VIPER_TOKEN=$(cat "$TMP/token") source_checksum $A 7330 tok 2 "$TMP/mid2.safetensors")
  check "A holds tok v2 as published" test -n "$want"
  check "its second version is v2, bit-exact" test "$(field "$TMP/tok.json" 1 checksum)" = "$want"
  check "host-tier segments are owner-only (0600)" \
    bash -c "test \"\$(stat -c %a /dev/shm/viper.$PID_a4.* | sort -u)\" = 600"
  stop "$PID_a4"
  # Without --listen a node binds loopback only: unreachable from another host.
  serve h1 a5 || return
  check "a node without --listen listens on loopback" grep -q "^127.0.0.1:" "$TMP/a5.addr"
  stop "$PID_a5"
}

# a_bytes_sent ADDR: the bytes_sent counter of the node at ADDR on h1 (viper stats).
a_bytes_sent() {
  on h1 "$VIPER" stats --connect "$1" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["bytes_sent"])'
}

# ---------------------------------------------------------------- 5. relay killed mid-transfer -> the upstream's memory
# A consumer on h3 is connected to relay node B (h2), whose versions list A's node as the upstream
# replica. B dies mid-transfer: the consumer finishes the version from A's memory, not from a
# file, resuming at the prefix that landed from B (A sends only the rest).

test_failover() {
  serve h1 a6 --listen $A:7340 --insecure || return
  # The relay lives in h2 (its log says what it relayed); its NOTIFYs carry A's replicas after its own.
  VIPER_LOG=info serve h2 b6 --listen $B:7341 --insecure --upstream $A:7340 --relay-model fo || return
  local relay=$PID_b6
  on h3 "$VIPER" watch fo --connect $B:7341 --json --count 2 --timeout 40 >"$TMP/fo.json" 2>"$TMP/fo.err" &
  local watch=$!
  PIDS+=($watch)
  sleep 0.5  # subscribed before the first version
  on h1 "$VIPER" publish fo "$TMP/mid1.safetensors" --connect $A:7340 >/dev/null || { failed "publish fo v1"; return; }
  wait_for 20 lines "$TMP/fo.json" 1 || { failed "fo v1 never reached h3"; return; }
  # Slow B's outgoing link to ~4 s per version (A -> B stays fast) so that B dies mid-transfer.
  on h2 tc qdisc add dev eth0 root tbf rate 100mbit burst 256kb latency 200ms
  local sent_before
  sent_before=$(a_bytes_sent $A:7340)
  on h1 "$VIPER" publish fo "$TMP/mid2.safetensors" --connect $A:7340 >/dev/null || { failed "publish fo v2"; return; }
  wait_for 10 grep -q "relayed fo version 2" "$TMP/b6.log" || { failed "relay never got fo v2"; cat "$TMP/b6.log"; return; }
  sleep 1
  kill -KILL "$relay"
  wait "$relay"
  check "relay node B died of SIGKILL" test $? -eq 137
  wait "$watch"
  check "watch on h3 got 2 versions although B died (exit 0)" test $? -eq 0
  check "fo v1 came over the network from B" test "$(field "$TMP/fo.json" 0 path)" = remote
  check "fo v2 came over the network too (path remote, not file)" test "$(field "$TMP/fo.json" 1 path)" = remote
  local reason
  reason=$(field "$TMP/fo.json" 1 reason)
  echo "  reason: $reason"
  check "fo v2's reason names A's node as the replica it came from" grep -q "remote from node $A:7340" <<<"$reason"
  check "fo v2's reason says the transfer from B failed" grep -q "after remote failed" <<<"$reason"
  # Resumed, not restarted: A sent only what had not landed from B (FETCH with an offset); A's own
  # counter of bytes sent for v2 is one copy (to relay B) plus exactly that remainder.
  local size wire at sent
  size=$(field "$TMP/fo.json" 1 bytes)  # the snapshot as the node laid it out (not the file's size)
  wire=$(field "$TMP/fo.json" 1 wire_bytes)
  at=$(grep -o "resumed at byte [0-9]* of $size" <<<"$reason" | grep -o "byte [0-9]*" | grep -o "[0-9]*")
  sent=$(($(a_bytes_sent $A:7340) - sent_before))
  echo "  fo v2: $((size - ${at:-0})) of $size bytes from A after the resume at byte ${at:-?}; A sent $sent bytes for v2"
  check "fo v2 resumed from B's landed prefix (reason: resumed at byte N > 0 of $size)" test "${at:-0}" -gt 0
  check "h3 received from A only the remainder (wire_bytes $wire = $size - ${at:-?})" test "$wire" -eq $((size - ${at:-0}))
  check "A sent v2 once to B plus the remainder to h3 ($sent = $size + $wire), not a second copy" \
    test "$sent" -eq $((size + wire))
  local want
  want=$(source_checksum $A 7340 fo 2 "$TMP/mid2.safetensors")
  check "A holds fo v2 as published" test -n "$want"
  check "fo v2 on h3 is bit-exact" test "$(field "$TMP/fo.json" 1 checksum)" = "$want"
  on h2 tc qdisc del dev eth0 root
  stop "$PID_a6"
}

# ---------------------------------------------------------------- 6. producer's node killed mid-transfer -> a relay
# The consumer on h3 is connected to A; relay B (h2) relays the model from A, so A's NOTIFYs list
# B as a relay (replica kind 4). A dies while the consumer is still receiving (A's link to h3 is
# slowed, its link to B is not): the consumer takes the version from B's memory.
test_failover_to_relay() {
  serve h1 a7 --listen $A:7350 --insecure || return
  VIPER_LOG=info serve h2 b7 --listen $B:7351 --insecure --upstream $A:7350 --relay-model fr || return
  local relay=$PID_b7
  on h3 "$VIPER" watch fr --connect $A:7350 --json --count 2 --timeout 40 >"$TMP/fr.json" 2>"$TMP/fr.err" &
  local watch=$!
  PIDS+=($watch)
  sleep 0.5
  on h1 "$VIPER" publish fr "$TMP/mid1.safetensors" --connect $A:7350 >/dev/null || { failed "publish fr v1"; return; }
  wait_for 20 lines "$TMP/fr.json" 1 || { failed "fr v1 never reached h3"; return; }
  wait_for 10 grep -q "relayed fr version 1" "$TMP/b7.log" || { failed "relay never got fr v1"; return; }
  # B's REPLICA for v1 reaches A (B logs "relayed" before it connects to A to say so).
  wait_for 10 bash -c "'$VIPER_HOSTS_SCRIPT' exec h1 -- '$VIPER' ls --connect $A:7350 --json | grep -q 'node:$B:7351'"
  on h1 "$VIPER" ls --connect $A:7350 --json >"$TMP/fr1.ls"
  check "A lists B as a node holding fr v1" grep -q "node:$B:7351" "$TMP/fr1.ls"
  # Only the traffic from A to h3 is slowed (~16 s for the 48 MiB version): the kill below must land
  # while h3 is still receiving from A, after B relayed v2 and A's copy was pulled and checked.
  on h1 tc qdisc add dev eth0 root handle 1: htb default 1
  on h1 tc class add dev eth0 parent 1: classid 1:1 htb rate 10gbit
  on h1 tc class add dev eth0 parent 1: classid 1:3 htb rate 25mbit
  on h1 tc filter add dev eth0 parent 1: protocol ip u32 match ip dst 10.77.0.3/32 flowid 1:3
  on h1 "$VIPER" publish fr "$TMP/mid2.safetensors" --connect $A:7350 >/dev/null || { failed "publish fr v2"; return; }
  wait_for 10 grep -q "relayed fr version 2" "$TMP/b7.log" || { failed "relay never got fr v2"; cat "$TMP/b7.log"; return; }
  local want
  want=$(source_checksum $A 7350 fr 2 "$TMP/mid2.safetensors")
  check "A holds fr v2 as published" test -n "$want"
  check "h3 was still receiving fr v2 from A when A was killed" test "$(wc -l <"$TMP/fr.json")" -eq 1
  kill -KILL "$PID_a7"
  wait "$PID_a7"
  check "node A died of SIGKILL" test $? -eq 137
  wait "$watch"
  check "watch on h3 got 2 versions although A died (exit 0)" test $? -eq 0
  check "fr v2 came over the network (path remote, not file)" test "$(field "$TMP/fr.json" 1 path)" = remote
  local reason
  reason=$(field "$TMP/fr.json" 1 reason)
  echo "  reason: $reason"
  check "fr v2's reason names relay B as the replica it came from" grep -q "remote from node $B:7351" <<<"$reason"
  check "fr v2's reason says the transfer from A failed" grep -q "after remote failed" <<<"$reason"
  check "fr v2 on h3 is bit-exact" test "$(field "$TMP/fr.json" 1 checksum)" = "$want"
  on h1 tc qdisc del dev eth0 root 2>/dev/null
  kill -TERM "$relay" 2>/dev/null; wait "$relay" 2>/dev/null
}

# a_stat NODE NAME: one counter of NODE's STATS (viper stats --json, run on h1).
a_stat() { on h1 "$VIPER" stats --connect "$1" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2"; }
# a_dropped_the_relay NODE RELAY: NODE counts a peer dropped for silence and lists RELAY nowhere.
a_dropped_the_relay() {
  [[ $(a_stat "$1" peers_silent) -ge 1 ]] && ! on h1 "$VIPER" ls --connect "$1" --json | grep -q "$2"
}

# listed_checksum HOST NODE MODEL VERSION: the checksum NODE lists for that version (empty if none).
listed_checksum() {
  on "$1" "$VIPER" ls --connect "$2" --json 2>/dev/null | $PY -c '
import json, sys
for v in json.load(sys.stdin):
    if v["model"] == sys.argv[1] and v["version"] == int(sys.argv[2]): print(v["checksum"])' "$3" "$4"
}
holds() { [[ -n $(listed_checksum "$@") ]]; }

# ---------------------------------------------------------------- 7. a relay's host cut off silently -> the alternate
# h2's link goes down: no FIN, no RST, nothing reaches the consumer on h3 from relay B any more. The
# consumer's liveness probe (SubscriberOptions::liveness_probe) finds B silent, gives the connection
# up and takes the next version from its alternate, the producer's node A. A, for its part, pings
# the silent relay and drops it (--peer-liveness 2); once the link is back B relays again.
test_partition() {
  serve h1 a8 --listen $A:7360 --insecure --peer-liveness 2 || return
  serve h2 b8 --listen $B:7361 --insecure --upstream $A:7360 --relay-model pt || return
  local relay=$PID_b8
  VIPER_LOG=info on h3 "$VIPER" watch pt --connect $B:7361 --alternate $A:7360 --liveness 2 --json --count 2 --timeout 60 \
    >"$TMP/pt.json" 2>"$TMP/pt.err" &
  local watch=$!
  PIDS+=($watch)
  sleep 0.5
  on h1 "$VIPER" publish pt "$TMP/mid1.safetensors" --connect $A:7360 >/dev/null || { failed "publish pt v1"; return; }
  wait_for 20 lines "$TMP/pt.json" 1 || { failed "pt v1 never reached h3"; return; }
  on h2 ip link set eth0 down
  local cut=$SECONDS
  on h1 "$VIPER" publish pt "$TMP/mid2.safetensors" --connect $A:7360 >/dev/null || { failed "publish pt v2"; return; }
  wait_for 40 lines "$TMP/pt.json" 2
  local took=$((SECONDS - cut))
  check "pt v2 reached h3 although its relay's host was cut off ($took s after the cut)" lines "$TMP/pt.json" 2
  # --liveness 2: 2 s of silence, 2 s for the answer, then A (with the default 5 s, 10 s and more).
  check "the watch's --liveness 2 took effect ($took s < 9 s)" test "$took" -lt 9
  check "the consumer gave up the silent relay (its probe went unanswered)" grep -q "did not answer a probe" "$TMP/pt.err"
  local want
  want=$(source_checksum $A 7360 pt 2 "$TMP/mid2.safetensors")
  check "pt v2 on h3 is A's, bit-exact" test -n "$want" -a "$(field "$TMP/pt.json" 1 checksum 2>/dev/null)" = "$want"
  # A, for its part, pings the silent relay (--peer-liveness 2) and drops it: no longer a peer, no
  # longer listed as a relay of pt (a consumer whose transfer from A broke would try it first).
  wait_for 20 a_dropped_the_relay $A:7360 $B:7361
  local dropped=$((SECONDS - cut))
  check "A dropped its cut-off relay ($dropped s after the cut; peers_silent $(a_stat $A:7360 peers_silent))" \
    a_dropped_the_relay $A:7360 $B:7361
  check "A's --peer-liveness 2 took effect ($dropped s < 12 s)" test "$dropped" -lt 12
  # The link comes back: the relay notices A dropped it (its own probe) and relays again.
  on h2 ip link set eth0 up
  local back=$SECONDS
  on h1 "$VIPER" publish pt "$TMP/mid1.safetensors" --connect $A:7360 >/dev/null || { failed "publish pt v3"; return; }
  wait_for 40 holds h2 $B:7361 pt 3
  check "the relay relays again once its link is back (pt v3 on B $((SECONDS - back)) s after)" holds h2 $B:7361 pt 3
  check "pt v3 on B is A's (same checksum)" test "$(listed_checksum h1 $A:7360 pt 3)" = "$(listed_checksum h2 $B:7361 pt 3)"
  wait "$watch" 2>/dev/null
  kill -TERM "$relay" 2>/dev/null; wait "$relay" 2>/dev/null
  stop "$PID_a8"
}

# ---------------------------------------------------------------- 8. a node on every interface, found through Redis
# A node listening on 0.0.0.0 registers the address other hosts reach (h1's), not the wildcard: a
# consumer on h2 that knows only the registry gets the version. Told "0.0.0.0:7370", as before, it
# connected to its own host.
test_advertise() {
  (exec "$VIPER_HOSTS_SCRIPT" exec h1 -- redis-server --bind $A --port 6390 --save "" --appendonly no \
     --protected-mode no >"$TMP/redis.log" 2>&1) &
  local redis=$!
  PIDS+=($redis)
  wait_for 10 on h1 redis-cli -h $A -p 6390 ping >/dev/null 2>&1 || { failed "redis-server on h1 did not start"; return; }
  serve h1 a9 --listen 0.0.0.0:7370 --insecure --registry redis://$A:6390 || return
  check "the node on 0.0.0.0 advertises h1's address ($(cat "$TMP/a9.addr"))" test "$(cat "$TMP/a9.addr")" = "$A:7370"
  check "viper serve says where it listens and what it advertises" \
    grep -qF "a9 listening on 0.0.0.0:7370 (advertised as $A:7370)" "$TMP/a9.log"
  on h1 "$VIPER" publish adv "$TMP/mid1.safetensors" --connect 127.0.0.1:7370 >/dev/null || { failed "publish adv"; return; }
  on h2 "$VIPER" watch adv --registry redis://$A:6390 --json --count 1 --timeout 30 >"$TMP/adv.json" 2>"$TMP/adv.err"
  check "watch on h2 found the node through the registry alone and got the version (exit $?)" lines "$TMP/adv.json" 1
  check "adv v1 on h2 came over the network" test "$(field "$TMP/adv.json" 0 path 2>/dev/null)" = remote
  check "adv v1 on h2 is bit-exact" \
    test "$(field "$TMP/adv.json" 0 checksum 2>/dev/null)" = "$(source_checksum $A 7370 adv 1 "$TMP/mid1.safetensors")"
  stop "$PID_a9"
  kill -TERM "$redis" 2>/dev/null; wait "$redis" 2>/dev/null
}

for t in ${XNODE_TESTS:-test_big test_kill test_relay test_auth test_failover test_failover_to_relay test_partition test_advertise}; do
  echo "== $t"
  start=$SECONDS
  $t
  echo "   ($((SECONDS - start)) s)"
done
summary
