#!/usr/bin/env bash
# Builds every libFuzzer target (fuzz/*_fuzz.cc) with clang, ASan and UBSan in build-fuzz, then
# runs each for SECONDS (default 30) from its committed seeds in fuzz/corpus/<name>/.
# Exits non-zero if a target crashes (the reproducer is kept in build-fuzz/artifacts/).
#
#   fuzz/run_fuzz.sh [SECONDS]
#   VIPER_FUZZ_BUILD_DIR  build directory (default <repo>/build-fuzz)
#   VIPER_FUZZ_JOBS       parallel build jobs and targets run at a time (default 2)
set -euo pipefail

seconds=${1:-30}
if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds < 1)); then
  echo "usage: fuzz/run_fuzz.sh [SECONDS]  (SECONDS per target, a positive integer)" >&2
  exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${VIPER_FUZZ_BUILD_DIR:-$root/build-fuzz}
jobs=${VIPER_FUZZ_JOBS:-2}

for tool in clang clang++; do
  command -v "$tool" >/dev/null || { echo "run_fuzz: $tool not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 1; }
done

shopt -s nullglob
sources=("$root"/fuzz/*_fuzz.cc)
if ((${#sources[@]} == 0)); then
  echo "run_fuzz: no fuzz/*_fuzz.cc target found" >&2
  exit 1
fi
targets=()
for source in "${sources[@]}"; do targets+=("$(basename "$source" .cc)"); done

cmake -S "$root" -B "$build" -G "$("$root/scripts/cmake-generator.sh" "$build")" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DVIPER_FUZZ=ON -DVIPER_BUILD_TESTS=OFF -DVIPER_BUILD_BENCH=OFF -DVIPER_WITH_PYTHON=OFF >/dev/null
cmake --build "$build" -j"$jobs" --target "${targets[@]}"

# VIPER_FUZZ_JOBS targets run at a time (each libFuzzer process is one thread: two on two cores get
# a core each, the same executions per target as one after the other in half the wall time; CI
# 2026-11-26: 7 targets x 15 s = 105 s sequential). Each one's output is printed when it ends.
mkdir -p "$build/logs"
failed=()
declare -A running=()  # pid -> target
finish_one() {
  local pid status=0
  wait -n -p pid "${!running[@]}" || status=$?
  local target=${running[$pid]}
  unset "running[$pid]"
  cat "$build/logs/$target.log"
  if ((status != 0)); then
    echo "run_fuzz: $target FAILED; reproducer(s) in $build/artifacts/$target/ (replay: $build/fuzz/$target <file>)" >&2
    failed+=("$target")
  fi
}
for target in "${targets[@]}"; do
  ((${#running[@]} < jobs)) || finish_one
  name=${target%_fuzz}
  seeds=$root/fuzz/corpus/$name
  work=$build/corpus-work/$name      # new inputs found by this run; the seeds stay untouched
  artifacts=$build/artifacts/$target
  mkdir -p "$work" "$artifacts"
  args=(-max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048
        -print_final_stats=1 -artifact_prefix="$artifacts/")
  [[ -f $root/fuzz/$name.dict ]] && args+=(-dict="$root/fuzz/$name.dict")
  corpora=("$work")
  [[ -d $seeds ]] && corpora+=("$seeds")
  echo "run_fuzz: $target for ${seconds}s (seeds: $([[ -d $seeds ]] && echo "${seeds#"$root"/}" || echo none))"
  "$build/fuzz/$target" "${args[@]}" "${corpora[@]}" >"$build/logs/$target.log" 2>&1 &
  running[$!]=$target
done
while ((${#running[@]} > 0)); do finish_one; done

if ((${#failed[@]} > 0)); then
  echo "run_fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
echo "run_fuzz: ${#targets[@]} target(s) ran ${seconds}s each without a crash"
