#!/usr/bin/env bash
# Tests scripts/hosts.sh (network-namespace test hosts) and viper_wire_baseline between two hosts.
# Usage: hosts_test.sh PATH/TO/viper_wire_baseline      (root; labels: netns)
# Prints one line per check and "N passed, N failed" at the end; exits non-zero on any failure.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HOSTS=$HERE/../../scripts/hosts.sh
WIRE=${1:-}
export VIPER_HOSTS_QUIET=1
TMP=$(mktemp -d /tmp/viper-hosts-test.XXXXXX)
BASE=vt$$   # every prefix of this test starts with it
source "$HERE/../check.sh"

if [[ -z $WIRE || ! -x $WIRE ]]; then
  echo "hosts_test: first argument must be the viper_wire_baseline binary (got '${WIRE}')" >&2
  exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "hosts_test: must run as root (network namespaces)" >&2
  exit 2
fi

finish() {
  local ns
  # A command this test started (a sleep) outliving its hosts.sh would hold ctest's pipe open.
  local pid
  pid=$(cat "$TMP/cmdpid" 2>/dev/null)
  [[ $pid =~ ^[0-9]+$ && $(cat "/proc/$pid/comm" 2>/dev/null) == sleep ]] && kill -KILL "$pid"
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${BASE}" || true); do
    ip netns pids "$ns" | xargs -r kill -KILL 2>/dev/null
    ip netns delete "$ns" 2>/dev/null
  done
  rm -rf "$TMP"
}
trap finish EXIT

# True when nothing named <prefix>-* exists: no namespace, and no link in the root namespace.
no_leftovers() {
  local p=$1
  [[ -z $(ip netns list | awk '{print $1}' | grep -E "^$p-" || true) ]] &&
    [[ -z $(ip -o link show | grep -E "[ :]$p-" || true) ]]
}
# True when PID is gone or a zombie (an orphan's reaper, pid 1 here, may reap it late).
not_running() {
  [[ $1 =~ ^[0-9]+$ ]] || { echo "  no pid recorded"; return 1; }
  [[ ! -e /proc/$1 ]] || [[ $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) == Z ]] ||
    { echo "  pid $1 still runs: $(ps -o stat=,comm= -p "$1")"; return 1; }
}
# Waits up to 30 s for the command under test to write its pid to $TMP/cmdpid.
wait_for_cmdpid() {
  local _
  for _ in $(seq 300); do [[ -s $TMP/cmdpid ]] && return 0; sleep 0.1; done
  echo "  the command wrote no pid in 30 s"; return 1
}
namespace_count() { ip netns list | awk '{print $1}' | grep -cE "^$1-(h[0-9]+|br)$"; }
wait_for_namespaces() {  # wait_for_namespaces PREFIX COUNT: up to 10 s
  local i
  for i in $(seq 100); do
    [[ $(namespace_count "$1") -eq $2 ]] && return 0
    sleep 0.1
  done
  return 1
}
expect_rc() {  # expect_rc CODE command...: runs command, true if it exits with CODE
  local want=$1 rc=0; shift
  "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
  [[ $rc -eq $want ]] || { echo "  exit $rc, expected $want; stderr: $(head -c 300 "$TMP/err")"; return 1; }
}
stderr_has() { grep -q -- "$1" "$TMP/err" || { echo "  stderr lacks '$1': $(head -c 300 "$TMP/err")"; return 1; }; }

# ---------------------------------------------------------------------------------------------

test_up_list_down() {
  local p=${BASE}u
  check "up 2 prints the hosts" \
    bash -c "'$HOSTS' up 2 --prefix $p > '$TMP/up' && diff <(printf 'h1 10.77.0.1\nh2 10.77.0.2\n') '$TMP/up'"
  check "up made 2 hosts + hub" test "$(namespace_count $p)" -eq 3
  check "list shows the hosts" bash -c "diff '$TMP/up' <('$HOSTS' list --prefix $p)"
  check "nothing created in the root namespace" bash -c "! ip -o link show | grep -q '$p'"
  check "up again with the same prefix replaces the leftovers" \
    bash -c "'$HOSTS' up 3 --prefix $p >/dev/null && test \$(ip netns list | grep -c '^$p-') -eq 4"
  check "down removes everything" bash -c "'$HOSTS' down --prefix $p && true"
  check "no leftovers after down" no_leftovers "$p"
  check "down again is a no-op" "$HOSTS" down --prefix "$p"
}

# Runs inside `hosts.sh run 2`: connectivity, isolation and per-host settings.
test_run_environment() {
  local p=${BASE}r
  cat >"$TMP/inner.sh" <<'EOF'
set -u
x() { "$VIPER_HOSTS_SCRIPT" exec "$@"; }
[[ $VIPER_HOSTS == "h1=10.77.0.1 h2=10.77.0.2" ]] || { echo "VIPER_HOSTS='$VIPER_HOSTS'"; exit 10; }
x h1 -- ping -c 1 -W 2 10.77.0.2 >/dev/null || { echo "h1 cannot ping h2"; exit 11; }
x h2 -- ping -c 1 -W 2 10.77.0.1 >/dev/null || { echo "h2 cannot ping h1"; exit 12; }
[[ -z $(x h1 -- ip route show default) ]] || { echo "h1 has a default route"; exit 13; }
# A lookup only (no packet): an address outside the subnet must be unroutable from a host.
! x h1 -- ip route get 192.0.2.1 >/dev/null 2>&1 || { echo "h1 can route to 192.0.2.1"; exit 14; }
[[ $(x h2 -- sysctl -n net.ipv4.tcp_congestion_control) == cubic ]] || { echo "h2 cc not cubic"; exit 15; }
[[ $(x h1 -- ip -o link show lo) == *UP* ]] || { echo "h1 loopback down"; exit 16; }
echo "$VIPER_HOST_PREFIX" > "$1"
EOF
  check "run: env, ping both ways, no route out, cubic, lo up" \
    bash -c "'$HOSTS' run 2 --prefix $p -- bash '$TMP/inner.sh' '$TMP/prefix'"
  check "run exported VIPER_HOST_PREFIX" grep -qx "$p" "$TMP/prefix"
  check "no leftovers after run" no_leftovers "$p"
}

test_wire_between_hosts() {
  local p=${BASE}w
  cat >"$TMP/wire.sh" <<EOF
set -u
"\$VIPER_HOSTS_SCRIPT" exec h1 -- '$WIRE' server --listen 10.77.0.1:7000 --timeout 20 > '$TMP/server' 2>&1 &
srv=\$!
for i in \$(seq 100); do grep -q '^listening' '$TMP/server' && break; sleep 0.1; done
"\$VIPER_HOSTS_SCRIPT" exec h2 -- '$WIRE' client --connect 10.77.0.1:7000 --bytes 64M --json --timeout 20 > '$TMP/client' || exit 20
wait \$srv || exit 21
EOF
  check "wire baseline h2 -> h1 (64 MB) completes" \
    bash -c "'$HOSTS' run 2 --prefix $p -- bash '$TMP/wire.sh'"
  local gbps
  gbps=$(sed -nE 's/.*"gbps":([0-9.]+).*/\1/p' "$TMP/client")
  echo "  wire h2 -> h1: ${gbps:-?} GB/s ($(cat "$TMP/client"))"
  check "wire figure is plausible (0.01..1000 GB/s)" \
    awk -v g="${gbps:-0}" 'BEGIN { exit !(g > 0.01 && g < 1000) }'
  check "server received all 64e6 bytes" grep -q "received 64000000 bytes" "$TMP/server"
  check "client socket used cubic" grep -q '"cc":"cubic"' "$TMP/client"
  check "no leftovers after wire run" no_leftovers "$p"
}

test_failing_command() {
  local p=${BASE}f
  check "run returns the command's exit code (7)" expect_rc 7 "$HOSTS" run 2 --prefix "$p" -- sh -c 'exit 7'
  check "no leftovers after a failing command" no_leftovers "$p"
  # A daemon left running inside a host (own session, so not in CMD's process group) must be
  # ended by the cleanup, or its namespace would live on.
  # CMD returns once the daemon has written its pid (10 s at most), however slowly it starts.
  rm -f "$TMP/orphan"
  check "run with a daemon left inside h1" expect_rc 0 "$HOSTS" run 2 --prefix "$p" -- \
    sh -c "\"\$VIPER_HOSTS_SCRIPT\" exec h1 -- setsid sh -c 'echo \$\$ > $TMP/orphan; exec sleep 300' &
      i=0; while [ ! -s $TMP/orphan ] && [ \$i -lt 200 ]; do sleep 0.05; i=\$((i + 1)); done"
  check "the daemon left inside h1 was ended" not_running "$(cat "$TMP/orphan")"
  check "no leftovers after a left-over daemon" no_leftovers "$p"
}

# hosts.sh receives SIGNAL while CMD runs: exit 128+n, CMD ended, nothing left.
test_signal() {
  local sig=$1 code=$2 p=${BASE}s$1
  rm -f "$TMP/cmdpid"
  # Background jobs of a script start with SIGINT ignored; give hosts.sh the default back.
  env --default-signal=INT "$HOSTS" run 2 --prefix "$p" -- sh -c "echo \$\$ > $TMP/cmdpid; exec sleep 300" &
  local pid=$! rc=0
  check "SIG$sig: hosts came up" wait_for_namespaces "$p" 3
  wait_for_cmdpid
  kill -"$sig" "$pid"
  wait "$pid" || rc=$?
  check "SIG$sig: run exits $code" test "$rc" -eq "$code"
  check "SIG$sig: the command was ended" not_running "$(cat "$TMP/cmdpid")"
  check "SIG$sig: no leftovers" no_leftovers "$p"
}

# A run killed with SIGKILL cannot clean up; the next run with the same prefix and gc must.
test_crash_leftovers() {
  local p=${BASE}k
  rm -f "$TMP/cmdpid"  # test_signal's pid must not stand for this run's command
  "$HOSTS" run 2 --prefix "$p" -- sh -c "echo \$\$ > $TMP/cmdpid; exec sleep 300" &
  local pid=$!
  wait_for_namespaces "$p" 3
  wait_for_cmdpid
  kill -KILL "$pid"; wait "$pid" 2>/dev/null
  kill -KILL "$(cat "$TMP/cmdpid")" 2>/dev/null   # our own sleep, now orphaned
  check "SIGKILL leaves the hosts behind (precondition)" test "$(namespace_count "$p")" -eq 3
  check "a new run with the same prefix cleans them first" "$HOSTS" run 2 --prefix "$p" -- true
  check "no leftovers after the rerun" no_leftovers "$p"
  # gc: a set named vp<pid> whose pid is dead. Any prefix is fine for up; this one mimics run's.
  local dead
  dead=$(sh -c 'echo $$')
  local g=vp${dead}
  if kill -0 "$dead" 2>/dev/null; then failed "gc: pid $dead reused, cannot test"; return; fi
  "$HOSTS" up 1 --prefix "$g" >/dev/null
  check "gc precondition: stale set exists" test "$(namespace_count "$g")" -eq 2
  check "gc removes the set of a dead run" bash -c "'$HOSTS' gc && true"
  check "no leftovers after gc" no_leftovers "$g"
}

test_usage_errors() {
  check "up 0 is rejected (exit 2)" expect_rc 2 "$HOSTS" up 0
  check "bad prefix is rejected" expect_rc 2 "$HOSTS" up 2 --prefix bad-name
  check "bad --mtu is rejected" expect_rc 2 "$HOSTS" up 2 --prefix "${BASE}x" --mtu 100
  check "run without a command is rejected" expect_rc 2 "$HOSTS" run 2 --prefix "${BASE}x"
  check "exec without a prefix is rejected" expect_rc 2 env -u VIPER_HOST_PREFIX "$HOSTS" exec h1 -- true
  check "exec on a missing host fails with 3" expect_rc 3 "$HOSTS" exec h1 --prefix "${BASE}none" -- true
  check "  ... and names the namespace" stderr_has "${BASE}none-h1"
  check "nothing made by rejected commands" no_leftovers "${BASE}x"
}

test_wire_cli() {
  check "wire: address without port (exit 2)" expect_rc 2 "$WIRE" client --connect 127.0.0.1 --bytes 1M
  check "  ... says what to write" stderr_has "expected ADDR:PORT"
  check "wire: bad byte suffix (exit 2)" expect_rc 2 "$WIRE" loopback --bytes 12X
  check "  ... names the suffix" stderr_has "unknown suffix 'X'"
  check "wire: zero bytes (exit 2)" expect_rc 2 "$WIRE" loopback --bytes 0
  check "wire: host name refused (exit 2)" expect_rc 2 "$WIRE" client --connect localhost:5 --bytes 1M
  check "wire: unknown congestion control (exit 1)" expect_rc 1 "$WIRE" loopback --bytes 1M --cc nosuchcc
  check "  ... names the setting" stderr_has "TCP_CONGESTION=nosuchcc"
  check "wire: refused connection (exit 1)" expect_rc 1 "$WIRE" client --connect 127.0.0.1:1 --bytes 1M
  check "  ... names the peer" stderr_has "connect to 127.0.0.1:1"
  check "wire: loopback 16 MB completes" expect_rc 0 "$WIRE" loopback --bytes 16M --json
  check "  ... prints a figure" grep -qE '"gbps":[0-9]' "$TMP/out"
  check "wire: a --verify server refuses a stream over 16 GiB (exit 2)" wire_verify_refuses_huge
  check "wire: a --verify server whose client stops mid-stream exits 1 and says how far it got" wire_verify_broken_stream
  check "wire: --land and --verify servers take 3 streams of 24 MB; the digest is xxh3 of the bytes" wire_verify_digest
}

# The client's payload is its 4 MiB buffer of 0x5a bytes, repeated: the --verify server's digest of
# every stream must equal XXH3-64 of 24e6 such bytes, computed here by libxxhash itself.
wire_verify_digest() {
  local expected sink
  expected=$(/usr/bin/python3 -c 'import ctypes; x = ctypes.CDLL("libxxhash.so.0"); x.XXH3_64bits.restype = ctypes.c_uint64
data = b"\x5a" * 24000000; print("%016x" % x.XXH3_64bits(data, len(data)))') || return 1
  for sink in --land --verify; do
    "$WIRE" server --listen 127.0.0.1:0 --clients 3 --timeout 20 "$sink" > "$TMP/verify_server" 2>&1 &
    local srv=$! port=""
    for _ in $(seq 100); do
      port=$(sed -nE 's/^listening 127.0.0.1:([0-9]+)$/\1/p' "$TMP/verify_server"); [[ -n $port ]] && break; sleep 0.1
    done
    "$WIRE" client --connect "127.0.0.1:$port" --bytes 24M --repeat 2 --warmup 1 --timeout 20 > /dev/null || return 1
    wait "$srv" || return 1
    [[ $(grep -c "received 24000000 bytes" "$TMP/verify_server") == 3 ]] || return 1
    if [[ $sink == --verify ]]; then
      [[ $(grep -c "xxh3 $expected" "$TMP/verify_server") == 3 ]] || { cat "$TMP/verify_server"; echo "expected $expected"; return 1; }
    fi
  done
}

# The client announces 24e6 bytes, sends 1000 and closes: the hash thread must not wait forever.
wire_verify_broken_stream() {
  "$WIRE" server --listen 127.0.0.1:0 --clients 1 --timeout 10 --verify > "$TMP/broken_server" 2>&1 &
  local srv=$! port=""
  for _ in $(seq 100); do
    port=$(sed -nE 's/^listening 127.0.0.1:([0-9]+)$/\1/p' "$TMP/broken_server"); [[ -n $port ]] && break; sleep 0.1
  done
  # "VPRWIRE1" + u64 little-endian 24000000 (0x016e3600), then 1000 bytes.
  { printf 'VPRWIRE1\x00\x36\x6e\x01\x00\x00\x00\x00'; head -c 1000 /dev/zero; } > "/dev/tcp/127.0.0.1/$port" || return 1
  local rc=0
  timeout 10 tail --pid="$srv" -f /dev/null || return 1  # a hung server fails here
  wait "$srv" || rc=$?
  [[ $rc == 1 ]] && grep -q "after 1000 of 24000000 bytes" "$TMP/broken_server"
}

# The announced size is checked before anything is allocated.
wire_verify_refuses_huge() {
  "$WIRE" server --listen 127.0.0.1:0 --clients 1 --timeout 10 --verify > "$TMP/huge_server" 2>&1 &
  local srv=$! port=""
  for _ in $(seq 100); do
    port=$(sed -nE 's/^listening 127.0.0.1:([0-9]+)$/\1/p' "$TMP/huge_server"); [[ -n $port ]] && break; sleep 0.1
  done
  # "VPRWIRE1" + u64 little-endian 2^35 (32 GiB), then nothing.
  printf 'VPRWIRE1\x00\x00\x00\x00\x08\x00\x00\x00' > "/dev/tcp/127.0.0.1/$port" || return 1
  wait "$srv"
  local rc=$?
  [[ $rc == 2 ]] && grep -q "16 GiB limit" "$TMP/huge_server"
}

# A peer that does not speak the protocol gets a clear error, not a hang or a crash.
test_wire_bad_peer() {
  local p=${BASE}b
  cat >"$TMP/bad.sh" <<EOF
"\$VIPER_HOSTS_SCRIPT" exec h1 -- '$WIRE' server --listen 10.77.0.1:7001 --timeout 10 > '$TMP/bad_server' 2>&1 &
srv=\$!
for i in \$(seq 100); do grep -q '^listening' '$TMP/bad_server' && break; sleep 0.1; done
"\$VIPER_HOSTS_SCRIPT" exec h2 -- bash -c 'printf "GET / HTTP/1.0\r\n\r\n" > /dev/tcp/10.77.0.1/7001'
wait \$srv; echo "server exit \$?" >> '$TMP/bad_server'
EOF
  "$HOSTS" run 2 --prefix "$p" -- bash "$TMP/bad.sh"
  check "wire server rejects a foreign peer with exit 1" grep -q "server exit 1" "$TMP/bad_server"
  check "  ... saying bad magic" grep -q "bad magic" "$TMP/bad_server"
  check "no leftovers after the bad-peer run" no_leftovers "$p"
}

test_up_list_down
test_run_environment
test_wire_between_hosts
test_failing_command
test_signal TERM 143
test_signal INT 130
test_crash_leftovers
test_usage_errors
test_wire_cli
test_wire_bad_peer
check "no namespace of this test remains" bash -c "! ip netns list | grep -q '^$BASE'"

echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
