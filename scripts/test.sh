#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs every test Viper has.
#
#   scripts/test.sh [STAGE...]      stages, in order (default: all of them)
#     release  RelWithDebInfo build in build/ and the tests that need it: Python, network-namespace
#              hosts, `viper bench`, installs, and the fault suite's 50 kill rounds. The other C++
#              tests are built and run by asan, so each runs once (VIPER_BUILD_SANITIZED_TESTS=OFF
#              here; CTest lists them "Not Run (Disabled)"; `cmake -DVIPER_BUILD_SANITIZED_TESTS=ON
#              build` puts them back)
#     asan     AddressSanitizer + UndefinedBehaviorSanitizer build in build-asan/, every C++ test
#              but the network-namespace ones (without the benchmarks: VIPER_BUILD_BENCH=OFF
#              builds no `viper bench`)
#     tsan     ThreadSanitizer build in build-tsan/, the concurrent suites (net, host tier, node)
#     fuzz     libFuzzer targets (every parser of untrusted bytes) under ASan+UBSan, 15 s each
#              (longer runs: fuzz/run_fuzz.sh SECONDS)
#
# Needs root (or sudo) for apt-get and for the network-namespace tests. Exits non-zero on the
# first failing stage. VIPER_JOBS sets build parallelism (default: number of cores).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=${VIPER_JOBS:-$(nproc)}
all_stages=(release asan tsan fuzz)
stages=("$@")
((${#stages[@]} > 0)) || stages=("${all_stages[@]}")
for s in "${stages[@]}"; do
  [[ " ${all_stages[*]} " == *" $s "* ]] || { echo "test.sh: unknown stage '$s' (one of: ${all_stages[*]})" >&2; exit 2; }
done

stage_start=0
stage_marker=$(mktemp)
trap 'sweep_leaked_segments; rm -f "$stage_marker"' EXIT
begin() { stage_start=$SECONDS; touch "$stage_marker"; echo; echo "=== test.sh: $1"; }
end() { sweep_leaked_segments; echo "=== test.sh: $1 passed in $((SECONDS - stage_start)) s"; }

# Shared memory the stage's processes created and left behind when they died: Viper segments
# (<prefix>.<pid>.<seq>) whose pid is gone and UCX's ucx_shm_posix_* files no process maps. The
# tests clean up after the processes they kill; this names what still leaked (so it shows) and
# removes it, so that one run cannot fill /dev/shm for the next stage or the next run. Only files
# of this user, created since the stage began and untouched for 10 s (a process that is making one
# has not mapped it yet).
sweep_leaked_segments() {
  local leaked=() f name pid
  while IFS= read -r f; do
    name=${f##*/}
    if [[ $name == ucx_shm_posix_* ]]; then
      grep -qsF "$f" /proc/[0-9]*/maps || leaked+=("$f")
    else
      pid=${name%.*}; pid=${pid##*.}
      [[ $pid =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2>/dev/null && leaked+=("$f")
    fi
  done < <(find /dev/shm -maxdepth 1 -type f -user "$(id -u)" -newer "$stage_marker" ! -newermt "-10 seconds" \( -name 'ucx_shm_posix_*' -o -name '*.*.*' \))
  ((${#leaked[@]} == 0)) && return 0
  echo "=== test.sh: ${#leaked[@]} shared-memory files ($(du -ch "${leaked[@]}" | tail -1 | cut -f1)) left by dead processes, removed:" \
    "$(printf '%s ' "${leaked[@]:0:8}")$( ((${#leaked[@]} > 8)) && echo ...)"
  rm -f -- "${leaked[@]}"
}

# Sanitizer builds: -O1 and -g1 (line tables for the sanitizers' stack traces, not full debug
# info). Measured on tools/viper-bench/cmd_bench.cc: ASan+UBSan 42.9 s at -O2 -g, 21.7 s at -O1 -g1;
# TSan 18.1 s -> 10.4 s. That keeps the whole of CI well under half an hour on 2 cores.
configure() {  # configure BUILD_DIR CMAKE_ARGS...
  local dir=$1; shift
  cmake -S "$root" -B "$root/$dir" -G "$("$root/scripts/cmake-generator.sh" "$root/$dir")" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
    -DCMAKE_C_FLAGS_DEBUG="-O1 -g1" "$@" >/dev/null
}

# The concurrent suites get the sanitizer that finds their bugs; the others run under ASan only.
TSAN_TESTS=(host_tier_test registry_agent_test client_lifetime_test viper_net_engine_test viper_net_failure_test viper_net_shutdown_test node_test subscriber_verify_test subscriber_callback_test publisher_policy_test schedule_scheduler_test copy_hash_test buffer_pool_test publisher_spare_test prefetch_test sample_cache_test rehearsal_test fanout_test cut_through_test delta_node_test subscriber_spare_test registry_conformance_test redis_fleet_test redis_kill_test churn_test gpu_logic_on_emulator_test)

run_release() {
  begin "release build and the tests that need it"
  # The same build/ as scripts/demo.sh, with the Python package, without the tests asan runs:
  # 28% of this build's compile time and a third of its test time (2-vCPU VM, 2026-11-29).
  VIPER_BUILD_SANITIZED_TESTS=OFF "$root/scripts/build.sh"
  (cd "$root/build" && ctest -j"$jobs" --output-on-failure --timeout 900)
  end release
}

run_asan() {
  begin "ASan+UBSan build and C++ suite"
  configure build-asan -DVIPER_SANITIZE=ON -DVIPER_WITH_UCX=ON -DVIPER_WITH_PYTHON=OFF -DVIPER_BUILD_BENCH=OFF
  cmake --build "$root/build-asan" -j"$jobs"
  # The fault suite runs 20 kill rounds here (10 sync, 10 async with Redis), all 50 in the release
  # stage. Under ASan its async half costs more per round as the versions it holds grow (every
  # announced version stays fetchable, docs/RELIABILITY.md): 25 rounds took 238 s, 10 take 48 s
  # (2026-11-26, 2 vCPUs); the whole fault_test 277 s at 50 rounds, 70 s at 20. What ASan adds is
  # memory errors on the same code paths, which 10 rounds of each half walk (every member killed,
  # Redis too); the rounds' count is the release stage's and scripts/soak.sh's job.
  # redis_kill_test reads the same variable: 20 rounds under ASan instead of its own 10 (+4 s).
  (cd "$root/build-asan" &&
    ASAN_OPTIONS=abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 VIPER_FAULT_ROUNDS=20 \
      ctest -j"$jobs" --output-on-failure --timeout 900 -LE netns)
  end asan
}

run_tsan() {
  begin "ThreadSanitizer build and concurrent suites"
  configure build-tsan -DVIPER_TSAN=ON -DVIPER_WITH_UCX=ON -DVIPER_WITH_PYTHON=OFF -DVIPER_BUILD_BENCH=OFF
  # Targets are named as their tests, but for the GPU logic on the CUDA emulator (gpu_test's cases).
  cmake --build "$root/build-tsan" -j"$jobs" --target "${TSAN_TESTS[@]/gpu_logic_on_emulator_test/gpu_test}" viper \
    viper_test_peer viper_delta_peer viper_fault_peer viper_cuda_emulator viper_gpu_subscriber viper_gpu_peer
  local regex
  regex="^($(IFS='|'; echo "${TSAN_TESTS[*]}"))\$"
  (cd "$root/build-tsan" && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest -j"$jobs" --output-on-failure --timeout 900 -R "$regex")
  end tsan
}

run_fuzz() {
  begin "fuzzing the parsers of untrusted bytes"
  VIPER_FUZZ_JOBS=$jobs "$root/fuzz/run_fuzz.sh" 15
  end fuzz
}

total_start=$SECONDS
"$root/scripts/install-deps.sh"
for s in "${stages[@]}"; do "run_$s"; done
echo
echo "=== test.sh: all stages passed (${stages[*]}) in $((SECONDS - total_start)) s"
