#!/usr/bin/env bash
# The long version of the Redis fault rounds (tests/registry/redis_kill_test.cc): redis-server is
# killed with -9 at random points ROUNDS times (default 500) while a node publishes and a
# subscriber that found it through Redis follows; every round checks that the registry lists what
# the node holds and that the subscriber has the newest version. Prints the figures recorded in
# docs/RELIABILITY.md ("Redis") and docs/ARCHITECTURE.md ("Registry").
#
#   scripts/soak-redis.sh [ROUNDS]        VIPER_FAULT_SEED=S replays a run; BUILD_DIR (default build)
set -euo pipefail
rounds=${1:-500}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "usage: scripts/soak-redis.sh [ROUNDS]" >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
cmake --build "$build" -j2 --target redis_kill_test viper >/dev/null
start=$SECONDS
status=0
VIPER_FAULT_ROUNDS=$rounds "$build/tests/registry/redis_kill_test" >"$build/soak-redis.out" 2>"$build/soak-redis.log" || status=$?
grep -E "^redis kill:|^\[  (PASSED|FAILED)" "$build/soak-redis.out" || true
if ((status != 0)); then
  echo "soak-redis: FAILED (output in $build/soak-redis.out, stderr in $build/soak-redis.log)" >&2
  exit 1
fi
echo "soak-redis: $rounds rounds in $((SECONDS - start)) s"
