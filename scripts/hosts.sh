#!/usr/bin/env bash
# hosts.sh: throwaway test hosts for Viper's cross-node tests and benchmarks.
#
# A set of hosts is N network namespaces <P>-h1..<P>-hN, each with one veth "eth0" holding
# 10.77.0.<k>/24, joined to a bridge "br0" that lives in a hub namespace <P>-br. Nothing is created
# in the root namespace, there is no default route, no NAT and no link to any outside interface:
# traffic between the hosts cannot leave them. Each host gets loopback up, TCP congestion control
# cubic (per namespace), larger TCP autotuning maxima (per namespace) and IPv6 off.
#
# Usage (run as root):
#   hosts.sh up N [--prefix P] [--mtu M] [--cc NAME]
#       Creates the hosts (removing leftovers with the same prefix first), prints one
#       "hK 10.77.0.K" line per host on stdout and leaves them up. Default prefix vu<pid>.
#   hosts.sh down [--prefix P]
#       Ends every process inside the prefix's namespaces, then deletes the namespaces (which
#       deletes their veths and bridge). P defaults to $VIPER_HOST_PREFIX. Idempotent.
#   hosts.sh run N [--prefix P] [--mtu M] [--cc NAME] -- CMD [ARGS...]
#       up, then CMD (in the root namespace, in its own process group) with
#         VIPER_HOSTS="h1=10.77.0.1 h2=10.77.0.2 ..."  VIPER_HOST_PREFIX=P
#         VIPER_HOSTS_SCRIPT=<absolute path of this script>
#       then down, always (exit, failure, SIGINT, SIGTERM). Exit code: CMD's, 128+signal when
#       interrupted, 2 for usage errors, 3 when the hosts cannot be created. Default prefix vp<pid>;
#       also removes leftovers of earlier `run`s that died without cleaning up (see gc).
#   hosts.sh exec HOST [--prefix P] -- CMD [ARGS...]
#       Runs CMD inside host HOST (h1, h2, ...): ip netns exec <P>-<HOST> CMD. P defaults to
#       $VIPER_HOST_PREFIX.
#   hosts.sh list [--prefix P]
#       With P: "hK ADDRESS" per existing host. Without: one line per prefix found ("P N-hosts").
#   hosts.sh gc
#       Removes host sets named vp<pid> whose pid no longer runs (a `run` killed with SIGKILL).
#
# Options: --mtu (veth MTU, default 65535: measured fastest, see docs/ARCHITECTURE.md "Facts of the machine"),
# --cc (default congestion control inside the hosts, default cubic; "keep" leaves the kernel's).
# Env: VIPER_HOSTS_QUIET=1 silences the progress lines on stderr.
set -uo pipefail

readonly SUBNET=10.77.0
readonly MAX_HOSTS=250
readonly DEFAULT_MTU=65535
readonly DEFAULT_CC=cubic
# Per-namespace TCP autotuning maxima (min default max). net.core.[rw]mem_max are global on this
# kernel (read-only inside a namespace), so they are left alone.
readonly TCP_RMEM="4096 131072 33554432"
readonly TCP_WMEM="4096 16384 33554432"
SCRIPT_PATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
readonly SCRIPT_PATH

log() { [[ -n ${VIPER_HOSTS_QUIET:-} ]] || echo "hosts.sh: $*" >&2; }
fail() { echo "hosts.sh: error: $*" >&2; }
usage_error() { fail "$*"; echo "usage: hosts.sh up|down|run|exec|list|gc ... (see the header of $SCRIPT_PATH)" >&2; exit 2; }

# ---------------------------------------------------------------------------------------------
# Argument checks.

check_prefix() {
  [[ $1 =~ ^[A-Za-z0-9_]{1,16}$ ]] ||
    usage_error "prefix '$1' must be 1-16 characters of [A-Za-z0-9_] (it names namespaces <prefix>-h1 ...)"
}
check_count() {
  [[ $1 =~ ^[0-9]+$ ]] && (($1 >= 1 && $1 <= MAX_HOSTS)) ||
    usage_error "host count '$1' must be an integer in 1..$MAX_HOSTS"
}
check_mtu() {
  [[ $1 =~ ^[0-9]+$ ]] && (($1 >= 1280 && $1 <= 65535)) ||
    usage_error "--mtu '$1' must be an integer in 1280..65535"
}
check_host() {
  [[ $1 =~ ^h[0-9]+$ ]] || usage_error "host '$1' must be h1, h2, ... (as in VIPER_HOSTS)"
}
require_root() {
  [[ $(id -u) -eq 0 ]] || { fail "must run as root (ip netns needs CAP_SYS_ADMIN and CAP_NET_ADMIN)"; exit 3; }
}

# ---------------------------------------------------------------------------------------------
# Namespaces of a prefix.

# Prints the namespaces that belong to prefix $1 (exact names: <P>-hK and <P>-br).
prefix_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-(h[0-9]+|br)\$" || true
}

# Ends the processes inside namespace $1 (TERM, then KILL after 3 s). They were started in a
# namespace this script created, so they belong to this test-host set.
end_namespace_processes() {
  local ns=$1 pids i
  pids=$(ip netns pids "$ns" 2>/dev/null | grep -vx -e "$$" -e "${BASHPID:-$$}" || true)
  [[ -z $pids ]] && return 0
  log "ending processes in $ns: $(echo $pids)"
  kill -TERM $pids 2>/dev/null || true
  for i in $(seq 30); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -z $pids ]] && return 0
    sleep 0.1
  done
  kill -KILL $pids 2>/dev/null || true
  for i in $(seq 20); do
    [[ -z $(ip netns pids "$ns" 2>/dev/null) ]] && return 0
    sleep 0.1
  done
  fail "processes still inside $ns after SIGKILL: $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
}

# Removes every namespace of prefix $1. Returns non-zero if one could not be deleted.
hosts_down() {
  local prefix=$1 ns rc=0
  for ns in $(prefix_namespaces "$prefix"); do
    end_namespace_processes "$ns"
    ip netns delete "$ns" || { fail "could not delete namespace $ns"; rc=1; }
  done
  return $rc
}

# ---------------------------------------------------------------------------------------------
# Creation.

# Only algorithms in the global net.ipv4.tcp_allowed_congestion_control may become a namespace's
# default (the kernel answers EPERM otherwise). Adding one there changes no traffic: it only lets
# unprivileged sockets select it. Root sockets may already pick any available algorithm.
ensure_cc_allowed() {
  local cc=$1 allowed=/proc/sys/net/ipv4/tcp_allowed_congestion_control
  if ! grep -qw "$cc" /proc/sys/net/ipv4/tcp_available_congestion_control; then
    modprobe "tcp_$cc" 2>/dev/null || true
    grep -qw "$cc" /proc/sys/net/ipv4/tcp_available_congestion_control ||
      { fail "congestion control '$cc' is not available: $(cat /proc/sys/net/ipv4/tcp_available_congestion_control)"; return 1; }
  fi
  grep -qw "$cc" "$allowed" && return 0
  log "adding $cc to the global net.ipv4.tcp_allowed_congestion_control ($(cat "$allowed")) so namespaces may default to it"
  echo "$(cat "$allowed") $cc" >"$allowed" || { fail "cannot add $cc to $allowed"; return 1; }
}

# Runs sysctl -w inside namespace $1 and checks that the value took.
ns_sysctl() {
  local ns=$1 key=$2 value=$3 got
  ip netns exec "$ns" sysctl -qw "$key=$value" >/dev/null ||
    { fail "$ns: sysctl -w $key=$value failed"; return 1; }
  got=$(ip netns exec "$ns" sysctl -n "$key" | tr -s '\t ' ' ')
  [[ $got == "$value" ]] || { fail "$ns: $key is '$got' after setting '$value'"; return 1; }
}

make_hub() {
  local hub=$1-br
  ip netns add "$hub" || { fail "ip netns add $hub failed"; return 1; }
  ip -n "$hub" link set lo up &&
    ip -n "$hub" link add br0 type bridge &&
    ip -n "$hub" link set br0 up || { fail "$hub: creating bridge br0 failed"; return 1; }
  # Bridged frames skip iptables (br_netfilter would run them through it when loaded).
  ip netns exec "$hub" sysctl -qw net.bridge.bridge-nf-call-iptables=0 >/dev/null 2>&1 || true
}

# make_host PREFIX K MTU CC: namespace <P>-hK, veth eth0 <-> hK on the hub's bridge, address .K.
make_host() {
  local prefix=$1 k=$2 mtu=$3 cc=$4 ns=$1-h$2 hub=$1-br
  ip netns add "$ns" || { fail "ip netns add $ns failed"; return 1; }
  ip link add eth0 netns "$ns" mtu "$mtu" type veth peer name "h$k" netns "$hub" mtu "$mtu" ||
    { fail "$ns: creating veth pair (mtu $mtu) failed"; return 1; }
  ns_sysctl "$ns" net.ipv6.conf.all.disable_ipv6 1 || return 1
  ns_sysctl "$ns" net.ipv6.conf.default.disable_ipv6 1 || return 1
  ip -n "$hub" link set "h$k" master br0 up &&
    ip -n "$ns" link set lo up &&
    ip -n "$ns" addr add "$SUBNET.$k/24" dev eth0 &&
    ip -n "$ns" link set eth0 up || { fail "$ns: configuring eth0 failed"; return 1; }
  if [[ $cc != keep ]]; then ns_sysctl "$ns" net.ipv4.tcp_congestion_control "$cc" || return 1; fi
  ns_sysctl "$ns" net.ipv4.tcp_rmem "$TCP_RMEM" || return 1
  ns_sysctl "$ns" net.ipv4.tcp_wmem "$TCP_WMEM" || return 1
}

# hosts_up PREFIX N MTU CC. On failure the caller removes what was made.
hosts_up() {
  local prefix=$1 n=$2 mtu=$3 cc=$4 k
  if [[ -n $(prefix_namespaces "$prefix") ]]; then
    log "removing leftovers of an earlier run with prefix $prefix"
    hosts_down "$prefix" || return 1
  fi
  if [[ $cc != keep ]]; then ensure_cc_allowed "$cc" || return 1; fi
  make_hub "$prefix" || return 1
  for ((k = 1; k <= n; k++)); do
    make_host "$prefix" "$k" "$mtu" "$cc" || return 1
  done
  log "up: $n hosts, prefix $prefix, $SUBNET.0/24, mtu $mtu, cc $cc"
}

hosts_env_value() {
  local n=$1 k out=""
  for ((k = 1; k <= n; k++)); do out+="${out:+ }h$k=$SUBNET.$k"; done
  echo "$out"
}

# ---------------------------------------------------------------------------------------------
# Stale sets: `run` names its sets vp<pid>; a set whose pid is gone was left by a killed run.

gc_stale() {
  local prefix pid
  for prefix in $(ip netns list 2>/dev/null | awk '{print $1}' |
                  sed -nE 's/^(vp[0-9]+)-(h[0-9]+|br)$/\1/p' | sort -u); do
    pid=${prefix#vp}
    [[ $pid == "$$" ]] && continue
    if ! kill -0 "$pid" 2>/dev/null; then
      log "gc: removing hosts of dead run $prefix"
      hosts_down "$prefix" || true
    fi
  done
}

# ---------------------------------------------------------------------------------------------
# Commands.

# Parses [--prefix P] [--mtu M] [--cc NAME] up to "--" or the end. Sets OPT_* and REST.
parse_options() {
  OPT_PREFIX="" OPT_MTU=$DEFAULT_MTU OPT_CC=$DEFAULT_CC REST=()
  while (($#)); do
    case $1 in
      --prefix) (($# >= 2)) || usage_error "--prefix needs a value"; OPT_PREFIX=$2; shift 2 ;;
      --mtu) (($# >= 2)) || usage_error "--mtu needs a value"; OPT_MTU=$2; shift 2 ;;
      --cc) (($# >= 2)) || usage_error "--cc needs a value"; OPT_CC=$2; shift 2 ;;
      --) shift; REST=("$@"); break ;;
      *) usage_error "unknown argument '$1'" ;;
    esac
  done
  check_mtu "$OPT_MTU"
  [[ $OPT_CC =~ ^[a-z0-9_]{1,15}$ ]] || usage_error "--cc '$OPT_CC' is not a congestion control name"
}

prefix_or_env() {
  local p=${OPT_PREFIX:-${VIPER_HOST_PREFIX:-}}
  [[ -n $p ]] || usage_error "no prefix: pass --prefix P or set VIPER_HOST_PREFIX"
  check_prefix "$p"
  echo "$p"
}

CLEANUP_PREFIX=""
CHILD_PGID=""

# Ends what `run`'s CMD left in its process group (TERM, then KILL after 3 s).
end_child_group() {
  [[ -n $CHILD_PGID ]] && kill -0 -- "-$CHILD_PGID" 2>/dev/null || return 0
  kill -TERM -- "-$CHILD_PGID" 2>/dev/null
  for _ in $(seq 30); do kill -0 -- "-$CHILD_PGID" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL -- "-$CHILD_PGID" 2>/dev/null || true
}

cleanup() {
  trap '' INT TERM HUP  # finish cleaning even when interrupted again
  end_child_group
  if [[ -n $CLEANUP_PREFIX ]]; then
    hosts_down "$CLEANUP_PREFIX" && log "down: prefix $CLEANUP_PREFIX removed"
  fi
}

on_signal() {
  log "caught SIG$1, cleaning up"
  exit $((128 + $2))
}

arm_cleanup() {
  CLEANUP_PREFIX=$1
  trap cleanup EXIT
  trap 'on_signal INT 2' INT
  trap 'on_signal TERM 15' TERM
  trap 'on_signal HUP 1' HUP
}

cmd_up() {
  (($#)) || usage_error "up needs a host count"
  local n=$1; shift
  check_count "$n"; parse_options "$@"
  ((${#REST[@]} == 0)) || usage_error "up takes no command"
  local prefix=${OPT_PREFIX:-vu$$}
  check_prefix "$prefix"; require_root
  arm_cleanup "$prefix"
  hosts_up "$prefix" "$n" "$OPT_MTU" "$OPT_CC" || exit 3
  CLEANUP_PREFIX=""  # success: leave them up
  trap - EXIT INT TERM HUP
  local k
  for ((k = 1; k <= n; k++)); do echo "h$k $SUBNET.$k"; done
  log "prefix $prefix: remove with: $SCRIPT_PATH down --prefix $prefix"
}

cmd_down() {
  parse_options "$@"
  ((${#REST[@]} == 0)) || usage_error "down takes no command"
  local prefix; prefix=$(prefix_or_env) || exit 2
  require_root
  hosts_down "$prefix" || exit 1
}

cmd_run() {
  (($#)) || usage_error "run needs a host count"
  local n=$1; shift
  check_count "$n"; parse_options "$@"
  ((${#REST[@]} > 0)) || usage_error "run needs a command after --"
  local prefix=${OPT_PREFIX:-vp$$}
  check_prefix "$prefix"; require_root
  arm_cleanup "$prefix"
  gc_stale
  hosts_up "$prefix" "$n" "$OPT_MTU" "$OPT_CC" || exit 3
  export VIPER_HOSTS VIPER_HOST_PREFIX=$prefix VIPER_HOSTS_SCRIPT=$SCRIPT_PATH
  VIPER_HOSTS=$(hosts_env_value "$n")
  # Own process group, so that a signal can end CMD and everything it started. Bash makes
  # background commands ignore SIGINT/SIGQUIT; CMD gets them back (tests may rely on SIGINT).
  setsid env --default-signal=INT,QUIT "${REST[@]}" <&0 &
  CHILD_PGID=$!  # setsid does not fork here (a background job is no group leader): pid == pgid
  local rc=0
  wait "$CHILD_PGID" || rc=$?
  exit "$rc"
}

cmd_exec() {
  (($#)) || usage_error "exec needs a host (h1, h2, ...)"
  local host=$1; shift
  check_host "$host"; parse_options "$@"
  ((${#REST[@]} > 0)) || usage_error "exec needs a command after --"
  local prefix; prefix=$(prefix_or_env) || exit 2
  require_root
  [[ -n $(ip netns list 2>/dev/null | awk -v ns="$prefix-$host" '$1 == ns') ]] ||
    { fail "no host $host with prefix $prefix (namespace $prefix-$host does not exist)"; exit 3; }
  exec ip netns exec "$prefix-$host" "${REST[@]}"
}

cmd_list() {
  parse_options "$@"
  local ns
  if [[ -z ${OPT_PREFIX:-} ]]; then
    ip netns list 2>/dev/null | awk '{print $1}' | sed -nE 's/^([A-Za-z0-9_]+)-h[0-9]+$/\1/p' |
      sort | uniq -c | awk '{print $2, $1 "-hosts"}'
    return 0
  fi
  check_prefix "$OPT_PREFIX"
  for ns in $(prefix_namespaces "$OPT_PREFIX" | grep -v -- '-br$' | sort -V); do
    echo "${ns#"$OPT_PREFIX"-} $(ip -n "$ns" -4 -o addr show dev eth0 | awk '{split($4, a, "/"); print a[1]}')"
  done
}

main() {
  (($#)) || usage_error "missing command"
  local cmd=$1; shift
  case $cmd in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    run) cmd_run "$@" ;;
    exec) cmd_exec "$@" ;;
    list) cmd_list "$@" ;;
    gc) require_root; gc_stale ;;
    -h|--help|help) sed -n '2,/^set -uo/p' "$SCRIPT_PATH" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) usage_error "unknown command '$cmd'" ;;
  esac
}

main "$@"
