#!/usr/bin/env bash
# Measurement helper, not a test (asserts nothing): raw TCP stream and UCX tag_bw throughput on
# loopback and between two test hosts, over congestion control x veth MTU x size. Configurations
# are interleaved round by round so that drift from other load hits all of them alike.
# Usage: wire_matrix.sh PATH/TO/viper_wire_baseline [ROUNDS=3] [SECTIONS="loopback veth ucx"]
# Prints one line per configuration: median of the per-round medians, and the best single run.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HOSTS=$HERE/../scripts/hosts.sh
WIRE=${1:?usage: wire_matrix.sh PATH/TO/viper_wire_baseline [ROUNDS] [SECTIONS]}
ROUNDS=${2:-3}
SECTIONS=${3:-loopback veth ucx}
export VIPER_HOSTS_QUIET=1
TMP=$(mktemp -d /tmp/viper-wire-matrix.XXXXXX)
BASE=vm$$
SETS=()       # host-set prefixes made here
declare -A SAMPLES   # config -> "gbps gbps ..."

cleanup() {
  local p
  for p in "${SETS[@]}"; do "$HOSTS" down --prefix "$p"; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

add() { SAMPLES[$1]+="$2 "; }
# "vm123" + "1500c" -> "mtu=1500 cc=cubic"; k sets keep the kernel default (bbr on this machine).
label() {
  local s=${1#"$BASE"}
  echo "mtu=${s%?} cc=$([[ ${s: -1} == c ]] && echo cubic || sysctl -n net.ipv4.tcp_congestion_control)"
}
json_field() { sed -nE "s/.*\"$1\":([0-9.]+).*/\1/p"; }

# ---- loopback in the root namespace --------------------------------------------------------
loopback_round() {
  local bytes cc out
  for bytes in 600M 1.7G; do
    for cc in default cubic; do
      out=$("$WIRE" loopback --bytes "$bytes" --cc "$cc" --warmup 1 --repeat 3 --json) || continue
      add "wire loopback      cc=$cc bytes=$bytes" "$(json_field gbps <<<"$out")"
      add "wire loopback best cc=$cc bytes=$bytes" "$(json_field gbps_best <<<"$out")"
    done
  done
}

# ---- between two hosts ---------------------------------------------------------------------
# Host sets: <BASE><mtu><c|k>: namespace default cc cubic (c) or kept from the kernel (k, bbr here).
make_sets() {
  local mtu cc p
  for mtu in 1500 9000 65535; do
    for cc in cubic keep; do
      p=$BASE${mtu}${cc:0:1}
      "$HOSTS" up 2 --prefix "$p" --mtu "$mtu" --cc "$cc" >/dev/null || exit 3
      SETS+=("$p")
      # One server per set, serving until the set is taken down.
      "$HOSTS" exec h1 --prefix "$p" -- "$WIRE" server --listen 10.77.0.1:7000 --clients 0 \
        --timeout 0 --cc default --json >"$TMP/$p.server" 2>&1 &
    done
  done
  sleep 1
}

veth_round() {
  local p bytes out
  for p in "${SETS[@]}"; do
    for bytes in 600M 1.7G; do
      out=$("$HOSTS" exec h2 --prefix "$p" -- "$WIRE" client --connect 10.77.0.1:7000 \
            --bytes "$bytes" --cc default --warmup 1 --repeat 3 --json) || continue
      add "wire veth      $(label "$p") bytes=$bytes" "$(json_field gbps <<<"$out")"
      add "wire veth best $(label "$p") bytes=$bytes" "$(json_field gbps_best <<<"$out")"
    done
  done
}

# ucx_perftest tag_bw h2 -> h1, 4 MiB x 200, UCX_TLS=tcp; prints MB/s (ucx: 2^20 bytes/s) as GB/s.
ucx_once() {
  local p=$1; shift
  env "$@" UCX_TLS=tcp timeout 60 "$HOSTS" exec h1 --prefix "$p" -- ucx_perftest -p 13337 \
    >/dev/null 2>&1 &
  local srv=$!
  sleep 0.5
  env "$@" UCX_TLS=tcp timeout 60 "$HOSTS" exec h2 --prefix "$p" -- ucx_perftest 10.77.0.1 \
    -p 13337 -t tag_bw -s 4194304 -n 200 2>/dev/null |
    awk '/^Final:/ { printf "%.4f\n", $(NF-2) * 1048576 / 1e9 }'
  wait "$srv"
}

ucx_round() {
  local p v out
  local variants=("DEFAULT=1" "UCX_TCP_SNDBUF=4M UCX_TCP_RCVBUF=4M"
                  "UCX_TCP_TX_SEG_SIZE=64K UCX_TCP_RX_SEG_SIZE=512K")
  for p in "${SETS[@]}"; do
    [[ $p == *1500k || $p == *9000k ]] && continue   # keep the UCX part short
    for v in "${variants[@]}"; do
      # shellcheck disable=SC2086
      out=$(ucx_once "$p" $v)
      [[ -n $out ]] && add "ucx tag_bw $(label "$p") $v" "$out"
    done
  done
}

report() {
  local key vals
  printf '%-62s %8s %8s  %s\n' configuration median max "GB/s per round"
  for key in $(printf '%s\n' "${!SAMPLES[@]}" | sed 's/ /\x1f/g' | sort); do
    key=${key//$'\x1f'/ }
    vals=${SAMPLES[$key]}
    printf '%-62s %s  %s\n' "$key" \
      "$(tr ' ' '\n' <<<"$vals" | grep . | sort -g | awk '{a[NR]=$1} END {printf "%8.3f %8.3f", a[int((NR+1)/2)], a[NR]}')" "$vals"
  done
}

echo "# $(uname -r), $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg), rounds $ROUNDS, sections: $SECTIONS"
[[ $SECTIONS == *veth* || $SECTIONS == *ucx* ]] && make_sets
for ((r = 1; r <= ROUNDS; r++)); do
  [[ $SECTIONS == *loopback* ]] && loopback_round
  [[ $SECTIONS == *veth* ]] && veth_round
  [[ $SECTIONS == *ucx* ]] && ucx_round
  echo "# round $r done, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
report
