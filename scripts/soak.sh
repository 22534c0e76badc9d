#!/usr/bin/env bash
# The long runs of the fault and load tests (CI runs 50 kill rounds and one churn run of 200
# versions / 100,000 reads; see docs/RELIABILITY.md):
#
#   scripts/soak.sh [ROUNDS] [CHURN_RUNS]   default 500 kill rounds, 10 churn runs
#
# Builds fault_test and churn_test in build/ (scripts/build.sh first), runs the fault suite with
# VIPER_FAULT_ROUNDS=ROUNDS (half sync, half async publishes) and churn_test CHURN_RUNS times with
# 1000 versions and 1,000,000 reads each. Needs root (the disk-full case mounts a tmpfs). Every
# randomised run prints its seed: VIPER_FAULT_SEED=S replays it. Exits non-zero on the first failure.
set -euo pipefail

rounds=${1:-500}
churn_runs=${2:-10}
for n in "$rounds" "$churn_runs"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "usage: scripts/soak.sh [ROUNDS] [CHURN_RUNS]  (non-negative integers)" >&2; exit 2; }
done
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build
[[ -f $build/CMakeCache.txt ]] || { echo "soak: no build in $build (run scripts/build.sh first)" >&2; exit 1; }
cmake --build "$build" -j"${VIPER_JOBS:-2}" --target fault_test churn_test viper_fault_peer viper

start=$SECONDS
VIPER_FAULT_ROUNDS=$rounds "$build/tests/fault/fault_test" | grep -E 'seed|survived|kills:|disk full|FAILED|Failure|PASSED'
for ((i = 1; i <= churn_runs; ++i)); do
  VIPER_CHURN_VERSIONS=1000 VIPER_CHURN_READS=1000000 "$build/tests/fault/churn_test" | grep -E '^churn|FAILED|Failure|PASSED'
done
echo "soak: $rounds kill rounds and $churn_runs churn runs passed in $((SECONDS - start)) s"
